package targets

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// Database is one database that discovery found: on the discover entry Server, named
// Name, holding the source's instances table.
type Database struct {
	Server, Name string
}

// Label is the database label's value: the entry's name and the database's, so that two
// servers' databases of the same name stay two series.
func (d Database) Label() string { return d.Server + "/" + d.Name }

// Discovery finds, for each discover entry of the configuration in force, the server's
// databases that hold the source's instances table: at start, then every entry's
// Interval. Run owns the re-checks; Found is safe to call at any time.
type Discovery struct {
	pools   *Pools
	source  *store.Source
	timeout time.Duration // each statement's
	logger  *slog.Logger

	mu      sync.Mutex
	found   map[string][]string           // by entry: the databases, sorted
	capped  map[string]*logging.Repeats   // by entry: the max_databases warning, logged when it starts or changes
	leftOut map[string]int                // by entry: the databases holding the table that max_databases left out
	listed  map[string]error              // by entry checked: why its last listing of pg_database failed, nil when it did not
	listLog map[string]*logging.Repeats   // by entry: that failure, logged when it starts or changes
	checks  map[Database]*logging.Repeats // a database kept that cannot be checked, logged when it starts or changes
	// rounds counts finished checks of an entry, for tests.
	rounds int
	round  chan struct{} // closed and replaced when a check ends
}

// NewDiscovery returns the discovery of pools' discover entries for source. timeout
// bounds each statement it sends (listing the databases, checking one).
func NewDiscovery(pools *Pools, source *store.Source, timeout time.Duration, logger *slog.Logger) *Discovery {
	return &Discovery{pools: pools, source: source, timeout: timeout, logger: logger,
		found: map[string][]string{}, capped: map[string]*logging.Repeats{}, leftOut: map[string]int{},
		listed: map[string]error{}, listLog: map[string]*logging.Repeats{}, checks: map[Database]*logging.Repeats{},
		round: make(chan struct{})}
}

// Found returns the databases found, by entry then name.
func (d *Discovery) Found() []Database {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []Database
	for _, srv := range d.pools.Config().Discover() {
		for _, db := range d.found[srv.Name] {
			out = append(out, Database{srv.Name, db})
		}
	}
	return out
}

// Count is how many databases of entry are found.
func (d *Discovery) Count(entry string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.found[entry])
}

// EntryStatus is how a discover entry's last listing of its server's databases went.
type EntryStatus struct {
	Name string
	Err  error // nil when it succeeded
}

// Entries returns the status of the entries in force that have been checked, by name.
func (d *Discovery) Entries() []EntryStatus {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []EntryStatus
	for _, srv := range d.pools.Config().Discover() {
		if err, ok := d.listed[srv.Name]; ok {
			out = append(out, EntryStatus{Name: srv.Name, Err: err})
		}
	}
	return out
}

// Rounds returns how many checks of an entry have ended and a channel closed when the
// next one does.
func (d *Discovery) Rounds() (int, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rounds, d.round
}

// Run checks every entry at once, then each again every its Interval, until ctx ends.
// Entries are checked concurrently, so that a down server does not hold up another's
// re-check. It follows the configuration in force: a reload's new entries, and entries
// whose connection or interval changed, are checked on the next tick (within
// MinDiscoverInterval); a removed entry's databases are forgotten, their pools closed.
// An entry whose check of its databases takes longer than its interval (each needs a
// connection, a few at a time) is listed again on time meanwhile, so that a dropped
// database goes within about an interval whatever the server's size.
func (d *Discovery) Run(ctx context.Context) {
	last := map[string]time.Time{}
	checked := map[string]Server{} // each entry as it was at its last check
	checking := map[string]bool{}  // entries whose check runs now
	ended := make(chan string)     // an entry's check ended
	var wg sync.WaitGroup
	defer wg.Wait() // the checks end with ctx
	tick := time.NewTicker(MinDiscoverInterval)
	defer tick.Stop()
	for {
		now := time.Now()
		entries := d.pools.Config().Discover()
		for _, srv := range entries {
			t, ok := last[srv.Name]
			if ok && now.Sub(t) < srv.Interval && checked[srv.Name] == srv {
				continue
			}
			last[srv.Name] = now
			if checking[srv.Name] {
				d.relist(ctx, srv) // and the changed entry's check follows this one
				continue
			}
			checked[srv.Name], checking[srv.Name] = srv, true
			wg.Go(func() {
				d.check(ctx, srv)
				select {
				case ended <- srv.Name:
				case <-ctx.Done():
				}
			})
		}
		for name := range last {
			if !slices.ContainsFunc(entries, func(s Server) bool { return s.Name == name }) {
				delete(last, name) // a removed entry that comes back is checked at once
				delete(checked, name)
			}
		}
		d.Prune()
		select {
		case <-ctx.Done():
			return
		case name := <-ended:
			delete(checking, name)
			d.endRound()
		case <-tick.C:
		}
	}
}

func (d *Discovery) endRound() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.prune()
	d.rounds++
	close(d.round)
	d.round = make(chan struct{})
}

// Prune forgets the databases of the entries that the configuration in force no longer
// has, and closes their pools: Run does at every tick, and a reload that removes every
// entry (and so stops Run) calls it itself.
func (d *Discovery) Prune() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.prune()
}

// prune is Prune with d.mu held.
func (d *Discovery) prune() {
	for name := range d.found {
		if !slices.ContainsFunc(d.pools.Config().Discover(), func(s Server) bool { return s.Name == name }) {
			for _, db := range d.found[name] {
				d.pools.ForgetDiscovered(name, db)
			}
			delete(d.found, name)
			delete(d.leftOut, name)
		}
	}
	for name := range d.listed {
		if !slices.ContainsFunc(d.pools.Config().Discover(), func(s Server) bool { return s.Name == name }) {
			delete(d.listed, name)
			delete(d.listLog, name)
		}
	}
	for db := range d.checks {
		if _, ok := d.found[db.Server]; !ok {
			delete(d.checks, db)
		}
	}
}

// LeftOut is how many databases holding the table the entries in force left out at their
// last check, beyond their max_databases.
func (d *Discovery) LeftOut() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, srv := range d.pools.Config().Discover() {
		n += d.leftOut[srv.Name]
	}
	return n
}

// check lists srv's databases and keeps those that hold the source's table. A server
// that does not answer keeps what it had, so its databases still report pg_liveness_up 0
// rather than vanish; so does a database that does not answer the check.
func (d *Discovery) check(ctx context.Context, srv Server) {
	logger := d.logger.With("server", srv.Name)
	names, before, ok := d.relist(ctx, srv)
	if !ok {
		return
	}
	checked := d.checkAll(ctx, srv.Name, names)
	var found []string
	keep := make(map[string]bool, len(names))
	capped := 0 // databases with the table left out by MaxDatabases
	for i, l := range names {
		db, c := l.Name, checked[i]
		was := slices.Contains(before, db)
		switch {
		case c.err != nil && was:
			d.checkLog(srv.Name, db).Log(logger, slog.LevelWarn, c.err.Error(), "cannot check a database; keeping it", "database", db, "err", c.err)
			found = append(found, db)
		case c.err != nil:
			logger.Debug("cannot check a database", "database", db, "err", c.err)
		case c.has && len(found) >= srv.MaxDatabases:
			capped++
		case c.has:
			found = append(found, db)
		}
		if c.err == nil && was {
			d.checkLog(srv.Name, db).Clear(logger, "a database can be checked again", "database", db)
		}
		switch {
		case len(found) > 0 && found[len(found)-1] == db:
			keep[db] = true
		case db == srv.Maintenance:
			// Not watched, but every scrape's shared read of the server's pg_locks runs
			// on its pool: closing it here failed a read in flight ("closed pool") and
			// sent each database to read pg_locks itself for that scrape.
		default:
			d.pools.ForgetDiscovered(srv.Name, db) // no connection kept for a database not watched
		}
	}
	for _, db := range before {
		if !keep[db] {
			d.pools.ForgetDiscovered(srv.Name, db)
			d.forgetCheckLog(srv.Name, db)
			logger.Info("database no longer watched", "database", db)
		}
	}
	for _, db := range found {
		if !slices.Contains(before, db) {
			logger.Info("database found", "database", db)
		}
	}
	if capped > 0 {
		d.cappedLog(srv.Name).Log(logger, slog.LevelWarn, strconv.Itoa(capped), "more databases hold the table than max_databases; the first by name are watched",
			"max_databases", srv.MaxDatabases, "left_out", capped)
	} else {
		d.cappedLog(srv.Name).Clear(logger, "every database holding the table is watched again")
	}
	d.mu.Lock()
	// A database that a listing during the checks found dropped (relist, from Run) stays
	// gone, though its check, failing, kept it.
	now := d.found[srv.Name]
	found = slices.DeleteFunc(found, func(db string) bool { return slices.Contains(before, db) && !slices.Contains(now, db) })
	d.found[srv.Name], d.leftOut[srv.Name] = found, capped
	d.mu.Unlock()
}

// relist lists srv's databases and forgets at once those found before that are no
// longer listed (dropped). It returns the list and the databases found before it, or
// false when the listing failed (logged once when that starts).
func (d *Discovery) relist(ctx context.Context, srv Server) (names []listed, before []string, ok bool) {
	logger := d.logger.With("server", srv.Name)
	names, err := d.list(ctx, srv)
	d.mu.Lock()
	d.listed[srv.Name] = err
	failed := d.listLog[srv.Name]
	if failed == nil {
		failed = new(logging.Repeats)
		d.listLog[srv.Name] = failed
	}
	d.mu.Unlock()
	if err != nil {
		failed.Log(logger, slog.LevelWarn, err.Error(), "cannot list the server's databases; keeping the ones found before", "err", err)
		return nil, nil, false
	}
	failed.Clear(logger, "the server's databases are listed again")
	listed := make(map[string]bool, len(names))
	for _, l := range names {
		listed[l.Name] = true
	}
	d.mu.Lock()
	before = d.found[srv.Name]
	kept := slices.DeleteFunc(slices.Clone(before), func(db string) bool { return !listed[db] })
	if len(kept) < len(before) {
		d.found[srv.Name] = kept
	}
	d.mu.Unlock()
	for _, db := range before {
		if !listed[db] {
			d.pools.ForgetDiscovered(srv.Name, db)
			d.forgetCheckLog(srv.Name, db)
			logger.Info("database no longer watched", "database", db)
		}
	}
	return names, kept, true
}

// discoverCheckers is how many of an entry's databases a re-check checks at once.
const discoverCheckers = 4

// checked is how the check of one database went.
type checked struct {
	has bool // it holds the source's table, and the role may read it
	err error
}

// checkAll checks each listed database for the source's table, discoverCheckers at a
// time, and returns the outcomes in the list's order.
func (d *Discovery) checkAll(ctx context.Context, server string, names []listed) []checked {
	out := make([]checked, len(names))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(discoverCheckers, len(names)) {
		wg.Go(func() {
			for i := range next {
				if !names[i].AllowsConnections {
					out[i].err = errors.New("the database does not accept connections (ALLOW_CONNECTIONS false)")
					continue
				}
				out[i].has, out[i].err = d.holdsSource(ctx, server, names[i].Name)
			}
		})
	}
	for i := range names {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

// checkLog is the Repeats of the warning that database db of server cannot be checked.
func (d *Discovery) checkLog(server, db string) *logging.Repeats {
	d.mu.Lock()
	defer d.mu.Unlock()
	key := Database{server, db}
	r := d.checks[key]
	if r == nil {
		r = new(logging.Repeats)
		d.checks[key] = r
	}
	return r
}

func (d *Discovery) forgetCheckLog(server, db string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.checks, Database{server, db})
}

func (d *Discovery) cappedLog(server string) *logging.Repeats {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.capped[server]
	if r == nil {
		r = new(logging.Repeats)
		d.capped[server] = r
	}
	return r
}

// listed is a database of pg_database.
type listed struct {
	Name              string `db:"datname"`
	AllowsConnections bool   `db:"allows_connections"`
}

// list reads pg_database in srv's maintenance database.
func (d *Discovery) list(ctx context.Context, srv Server) ([]listed, error) {
	pool, ok, err := d.pools.DiscoveredPool(srv.Name, srv.Maintenance)
	if !ok || err != nil {
		return nil, cmpErr(err, errors.New("the entry was removed"))
	}
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	q := store.DiscoverDatabases.In("")
	rows, err := pool.Query(ctx, q.SQL, q.Args()...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByName[listed])
}

// holdsSource reports whether database db of server holds the source's instances table
// and the role may read it.
func (d *Discovery) holdsSource(ctx context.Context, server, db string) (bool, error) {
	pool, ok, err := d.pools.DiscoveredPool(server, db)
	if !ok || err != nil {
		return false, cmpErr(err, errors.New("the entry was removed"))
	}
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	q := store.DiscoverSource.In("")
	rows, err := pool.Query(ctx, q.SQL, q.Args(d.source.InstancesTable())...)
	if err != nil {
		return false, err
	}
	readable, err := pgx.CollectRows(rows, pgx.RowTo[bool])
	return len(readable) == 1 && readable[0], err
}

func cmpErr(err, otherwise error) error {
	if err != nil {
		return err
	}
	return otherwise
}
