package collector

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/alecthomas/kingpin/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
	"github.com/pg-liveness/pg_liveness_exporter/internal/sqltag"
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

func (s *AdvisoryLocksConfig) flags(app *kingpin.Application) {
	app.Flag("collector.advisory_locks.max-applications",
		`Most application_name label values to export; the rest are folded into "other".`).
		Default(strconv.Itoa(s.MaxApplications)).IntVar(&s.MaxApplications)
}

func (s *AdvisoryLocksConfig) check(*Config) error {
	if s.MaxApplications < 1 {
		return fmt.Errorf("--collector.advisory_locks.max-applications must be at least 1, got %d", s.MaxApplications)
	}
	return nil
}

// advisoryLocksSQL reads this database's advisory locks and client backends in one
// statement. A lock is an alive lock when it is a bigint lock (objsubid = 1) whose key
// halves are those of some instance's alive-lock key: one lookup per lock in the index on
// the key-half columns stored with each instance, so the cost follows the locks, not the
// instances.
// With a Whizbang source ({alive_lock_match} below), a lock is an alive lock when its
// bigint key is the hashtext key of some instance in Whizbang's table: the keys are
// hashed once per scrape into one hashed subplan.
// Rows of kind 'locks' count locks by (alive, granted); rows of kind 'backends' count
// client backends by (application_name, state), with how many of them hold a granted
// advisory lock, how many wait for one, and the longest an idle holder has been idle
// (AdvisoryLocksRow names the columns). "Idle" covers idle in transaction too: either way
// the backend sits on its locks. It is one statement, not a batch of two, on purpose:
// both kinds of rows come from one materialized read of pg_locks, which is no
// transactional snapshot, so the holders and the lock counts always agree.
const advisoryLocksSQL = `WITH ` + sqltag.AdvisoryLocks + ` db AS (
    SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database()
), locks AS MATERIALIZED (
    SELECT l.pid, l.granted,
           l.objsubid = 1 AND {alive_lock_match} AS alive
      FROM pg_catalog.pg_locks l
     WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM db)
), per_pid AS (
    SELECT pid, bool_or(granted) AS holds, bool_or(NOT granted) AS waits
      FROM locks GROUP BY pid
), backends AS (
    SELECT coalesce(a.application_name, '') AS app, coalesce(a.state, '') AS state,
           coalesce(p.holds, false) AS holds, coalesce(p.waits, false) AS waits,
           extract(epoch FROM now() - a.state_change)::float8 AS idle_for
      FROM pg_catalog.pg_stat_activity a
      LEFT JOIN per_pid p ON p.pid = a.pid
     WHERE a.datid = (SELECT oid FROM db) AND a.backend_type = 'client backend'
)
SELECT 'backends' AS kind, app AS name, state, count(*) AS count,
       count(*) FILTER (WHERE holds) AS holders, count(*) FILTER (WHERE waits) AS waiters,
       coalesce(max(idle_for) FILTER (WHERE holds AND state LIKE 'idle%'), 0) AS idle_holder_max_seconds
  FROM backends GROUP BY app, state
UNION ALL
SELECT 'locks', CASE WHEN alive THEN 'alive_lock' ELSE 'other' END, granted::text, count(*), 0, 0, 0
  FROM locks GROUP BY 2, 3`

// The alive-lock match of advisoryLocksSQL, for our schema and for a Whizbang source ($1
// its lock key prefix).
const (
	aliveLockMatch = `EXISTS (
               SELECT 1 FROM {schema}.instances i
                WHERE i.lock_classid = l.classid AND i.lock_objid = l.objid)`
	whizbangAliveLockMatch = `((l.classid::bigint << 32) | l.objid::bigint) IN (
               SELECT pg_catalog.hashtext($1::text || i.instance_id::text)::bigint FROM {table} i)`
)

// advisoryLocksStatement renders advisoryLocksSQL for a quoted schema and the source.
func advisoryLocksStatement(schema string, source SourceConfig) (string, []any) {
	if source.Kind == SourceWhizbang {
		return strings.ReplaceAll(strings.ReplaceAll(advisoryLocksSQL, "{alive_lock_match}", whizbangAliveLockMatch),
			"{table}", source.Whizbang.Table()), []any{source.Whizbang.LockKeyPrefix}
	}
	return strings.ReplaceAll(strings.ReplaceAll(advisoryLocksSQL, "{alive_lock_match}", aliveLockMatch), "{schema}", schema), nil
}

type advisoryLocksCollector struct {
	pool                                 *pgxpool.Pool
	sql                                  string
	args                                 []any
	maxApps                              int
	locks, holders, backends, idle, wait *exposition.Family
}

func newAdvisoryLocksCollector(d deps) (Collector, error) {
	const app = "application_name"
	sql, args := advisoryLocksStatement(d.schema(), d.cfg.Source)
	return &advisoryLocksCollector{
		pool:    d.pool,
		sql:     sql,
		args:    args,
		maxApps: d.cfg.AdvisoryLocks.MaxApplications,
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
	rows, err := c.pool.Query(ctx, c.sql, c.args...)
	if err != nil {
		return err
	}
	read, err := pgx.CollectRows(rows, pgx.RowToStructByName[AdvisoryLocksRow])
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
