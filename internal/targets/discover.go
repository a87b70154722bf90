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

	"github.com/pg-liveness/pg_liveness_exporter/logging"
	"github.com/pg-liveness/pg_liveness_exporter/store"
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
	found   map[string][]string         // by entry: the databases, sorted
	capped  map[string]*logging.Repeats // by entry: the max_databases warning, logged when it starts or changes
	leftOut map[string]int              // by entry: the databases holding the table that max_databases left out
	listed  map[string]error            // by entry checked: why its last listing of pg_database failed, nil when it did not
	listLog map[string]*logging.Repeats // by entry: that failure, logged when it starts or changes
	// rounds counts finished re-checks of every entry, for tests and the log.
	rounds int
	round  chan struct{} // closed and replaced when a round ends
}

// NewDiscovery returns the discovery of pools' discover entries for source. timeout
// bounds each statement it sends (listing the databases, checking one).
func NewDiscovery(pools *Pools, source *store.Source, timeout time.Duration, logger *slog.Logger) *Discovery {
	return &Discovery{pools: pools, source: source, timeout: timeout, logger: logger,
		found: map[string][]string{}, capped: map[string]*logging.Repeats{}, leftOut: map[string]int{},
		listed: map[string]error{}, listLog: map[string]*logging.Repeats{}, round: make(chan struct{})}
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

// Rounds returns how many rounds have ended and a channel closed when the next one does.
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
func (d *Discovery) Run(ctx context.Context) {
	last := map[string]time.Time{}
	checked := map[string]Server{} // each entry as it was at its last check
	tick := time.NewTicker(MinDiscoverInterval)
	defer tick.Stop()
	for {
		var due []Server
		now := time.Now()
		entries := d.pools.Config().Discover()
		for _, srv := range entries {
			if t, ok := last[srv.Name]; !ok || now.Sub(t) >= srv.Interval || checked[srv.Name] != srv {
				due = append(due, srv)
				last[srv.Name], checked[srv.Name] = now, srv
			}
		}
		for name := range last {
			if !slices.ContainsFunc(entries, func(s Server) bool { return s.Name == name }) {
				delete(last, name) // a removed entry that comes back is checked at once
				delete(checked, name)
			}
		}
		d.Prune()
		if len(due) > 0 {
			var wg sync.WaitGroup
			for _, srv := range due {
				wg.Go(func() { d.check(ctx, srv) })
			}
			wg.Wait()
			d.endRound()
		}
		select {
		case <-ctx.Done():
			return
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
		return
	}
	failed.Clear(logger, "the server's databases are listed again")
	d.mu.Lock()
	before := d.found[srv.Name]
	d.mu.Unlock()
	var found []string
	capped := 0 // databases with the table left out by MaxDatabases
	for _, l := range names {
		db := l.Name
		var has bool
		var err error
		if l.AllowsConnections {
			has, err = d.holdsSource(ctx, srv.Name, db)
		} else {
			err = errors.New("the database does not accept connections (ALLOW_CONNECTIONS false)")
		}
		switch {
		case err != nil && slices.Contains(before, db):
			logger.Warn("cannot check a database; keeping it", "database", db, "err", err)
			found = append(found, db)
		case err != nil:
			logger.Debug("cannot check a database", "database", db, "err", err)
		case has && len(found) >= srv.MaxDatabases:
			capped++
		case has:
			found = append(found, db)
		}
		if !slices.Contains(found, db) {
			d.pools.ForgetDiscovered(srv.Name, db) // no connection kept for a database not watched
		}
	}
	for _, db := range before {
		if !slices.Contains(found, db) {
			d.pools.ForgetDiscovered(srv.Name, db)
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
	d.found[srv.Name], d.leftOut[srv.Name] = found, capped
	d.mu.Unlock()
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
