package collector

import (
	"context"
	"maps"
	"slices"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// AdvisoryLocksConfig configures the advisory_locks collector.
type AdvisoryLocksConfig struct {
	Enabled bool
	// MaxApplications keeps the application names with the most backends; the rest are
	// folded into application_name="other".
	MaxApplications int
}

func (s *AdvisoryLocksConfig) enabled() *bool { return &s.Enabled }

// defaultMaxApplications is AdvisoryLocksConfig.MaxApplications' default.
const defaultMaxApplications = 50

func (s *AdvisoryLocksConfig) defaults() { s.MaxApplications = defaultMaxApplications }

func (s *AdvisoryLocksConfig) maxApplications() limit {
	return limit{"Config.AdvisoryLocks.MaxApplications", &s.MaxApplications, 1}
}

func (s *AdvisoryLocksConfig) check(*Config) error { return s.maxApplications().check() }

// advisoryLocksCollector sends the advisory-locks statement (internal/store/sql/collectors.sql)
// for the source, the status page's too; with Config.Locks, it takes the server's shared
// read and sends only advisory_locks_of_snapshot, to tell its alive locks apart.
type advisoryLocksCollector struct {
	pool                                 *pgxpool.Pool
	query                                store.Query
	serverLocks                          LocksSource // nil: the statement reads pg_locks itself
	ofSnapshot                           store.Query // the alive locks among a snapshot's, with locks
	maxApps                              int
	locks, holders, backends, idle, wait *exposition.Family
}

func newAdvisoryLocksCollector(d deps) (collector, error) {
	const app = "application_name"
	return &advisoryLocksCollector{
		pool:        d.pool,
		query:       store.AdvisoryLocks.For(d.cfg.Source),
		serverLocks: d.cfg.Locks,
		ofSnapshot:  store.AdvisoryLocksOfSnapshot.For(d.cfg.Source),
		maxApps:     d.cfg.AdvisoryLocks.MaxApplications,
		locks: gauge("advisory_locks",
			"Advisory locks in this database: kind alive_lock (an instance's alive-lock key) or other, granted true or false (waiting).",
			"kind", "granted"),
		holders: gauge("advisory_lock_holders",
			"Client backends of this database that hold a granted advisory lock, by application and backend state.",
			app, "backend_state"),
		backends: gauge("backends",
			"Client backends connected to this database, the exporter's own included.", app),
		idle: gauge("advisory_lock_idle_holder_max_seconds",
			"Longest time an idle (or idle in transaction) backend holding an advisory lock has been idle; 0 when none is.", app),
		wait: gauge("advisory_lock_waiters",
			"Client backends of this database waiting for an advisory lock.", app),
	}, nil
}

type appStats struct {
	backends, waiters float64
	idleMax           float64
	holders           map[string]float64 // by backend state
}

func (c *advisoryLocksCollector) Update(ctx context.Context, out *exposition.Builder) error {
	read, err := c.read(ctx)
	if err != nil {
		return err
	}
	lockCounts := map[[2]string]float64{}
	apps := map[string]*appStats{}
	for _, r := range read {
		if r.Kind == "locks" {
			lockCounts[[2]string{r.Name, r.State}] = float64(r.Count)
			continue
		}
		app, state := labelOr(r.Name), labelOr(r.State)
		s := apps[app]
		if s == nil {
			s = &appStats{holders: map[string]float64{}}
			apps[app] = s
		}
		s.backends += float64(r.Count)
		s.waiters += float64(r.Waiters)
		s.idleMax = max(s.idleMax, r.IdleHolderMaxSeconds)
		s.holders[state] += float64(r.Holders)
	}

	for _, kind := range []string{"alive_lock", "other"} {
		for _, granted := range []string{"true", "false"} {
			out.Add(c.locks, lockCounts[[2]string{kind, granted}], kind, granted)
		}
	}
	folded := foldApps(apps, c.maxApps)
	for _, app := range slices.Sorted(maps.Keys(folded)) {
		s := folded[app]
		out.Add(c.backends, s.backends, app)
		out.Add(c.wait, s.waiters, app)
		out.Add(c.idle, s.idleMax, app)
		for _, state := range slices.Sorted(maps.Keys(s.holders)) {
			out.Add(c.holders, s.holders[state], app, state)
		}
	}
	return nil
}

// read is the advisory-locks statement's rows: this database's part of the server's
// snapshot with its alive locks told apart, or, without one (or when it failed), the
// statement's own read of pg_locks.
func (c *advisoryLocksCollector) read(ctx context.Context) ([]store.AdvisoryLocksRow, error) {
	if c.serverLocks != nil {
		if part, err := c.serverLocks(ctx); err == nil {
			return c.readOfSnapshot(ctx, part)
		}
	}
	rows, err := c.pool.Query(ctx, c.query.SQL, c.query.Args()...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByName[store.AdvisoryLocksRow])
}

// readOfSnapshot adds to the snapshot's rows the counts of its locks on bigint keys, the
// alive locks told apart by the source's keys; with none, nothing is sent.
func (c *advisoryLocksCollector) readOfSnapshot(ctx context.Context, part *DatabaseLocks) ([]store.AdvisoryLocksRow, error) {
	out := slices.Clone(part.Rows)
	if len(part.Classids) == 0 {
		answeredWithoutAsking(ctx) // the database itself was not asked: its pg_liveness_up is the others'
		return out, nil
	}
	rows, err := c.pool.Query(ctx, c.ofSnapshot.SQL, c.ofSnapshot.Args(part.Classids, part.Objids, part.Granted)...)
	if err != nil {
		return nil, err
	}
	bigint, err := pgx.CollectRows(rows, pgx.RowToStructByName[store.AdvisoryLocksRow])
	if err != nil {
		return nil, err
	}
	for _, r := range bigint { // "other" locks of both kinds are counted together
		if i := slices.IndexFunc(out, func(o store.AdvisoryLocksRow) bool {
			return o.Kind == r.Kind && o.Name == r.Name && o.State == r.State
		}); i >= 0 {
			out[i].Count += r.Count
			continue
		}
		out = append(out, r)
	}
	return out, nil
}

// labelOr names an empty application name or a state hidden from this role "unknown".
func labelOr(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// foldApps keeps the max applications with the most backends (ties by name) and folds
// the rest into "other", so that application_name stays bounded.
func foldApps(apps map[string]*appStats, maxApps int) map[string]*appStats {
	if len(apps) <= maxApps {
		return apps
	}
	names := make([]string, 0, len(apps))
	for n := range apps {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := apps[names[i]], apps[names[j]]
		if a.backends != b.backends {
			return a.backends > b.backends
		}
		return names[i] < names[j]
	})
	out := make(map[string]*appStats, maxApps+1)
	other := &appStats{holders: map[string]float64{}}
	for i, n := range names {
		s := apps[n]
		if i < maxApps && n != "other" {
			out[n] = s
			continue
		}
		other.backends += s.backends
		other.waiters += s.waiters
		other.idleMax = max(other.idleMax, s.idleMax)
		for state, h := range s.holders {
			other.holders[state] += h
		}
	}
	out["other"] = other
	return out
}
