// Package benchdata builds a database at the scale of the scrape budget, for benchmarks:
// 10,000 instances (1,500 holding their alive lock), 1,000 leases, 2,000 advisory locks
// held by 50 idle backends, and 5,000 pg_stat_statements entries; BuildScale builds the
// same shape at another number of instances. It is for tests and benchmarks only.
package benchdata

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// The budget's scale.
const (
	Instances  = 10000
	Services   = 20
	Leases     = 1000
	Backends   = 50
	AliveLocks = 30 // per backend; with OtherLocks, 2,000 held locks in all
	OtherLocks = 10
	Statements = 5000
)

// Scale is the shape of a data set. Instances are spread over Services with heartbeats
// over the last 15 minutes; half the leases are expired; each of Backends idle backends
// holds AliveLocks instances' alive locks and OtherLocks other advisory locks.
type Scale struct {
	Instances, Services, Leases, Backends, AliveLocks, OtherLocks, Statements int
}

// Budget is the scale of the scrape budget.
var Budget = Scale{Instances, Services, Leases, Backends, AliveLocks, OtherLocks, Statements}

// At is the budget's shape at n instances: leases at a tenth of the instances, and
// still 2,000 advisory locks over 50 backends, of which up to 15 % of the instances'
// alive locks (at most the budget's 1,500).
func At(n int) Scale {
	s := Budget
	s.Instances, s.Leases = n, max(n/10, 1)
	s.AliveLocks = min(AliveLocks, n*15/100/Backends)
	s.OtherLocks = AliveLocks + OtherLocks - s.AliveLocks
	return s
}

// Data is a built data set.
type Data struct {
	Scale
	DSN    string
	Server *pgtest.Server
}

// Build starts a server of its own (pg_stat_statements may keep 10,000 entries there),
// fills a database with the liveness schema at the budget's scale, and returns its DSN.
// The lock-holding backends stay connected until the benchmark ends.
func Build(b testing.TB) string {
	b.Helper()
	return BuildScale(b, Budget).DSN
}

// Small reports whether benchmarks run at a small scale (go test -short): make test runs
// every benchmark once so, so that a harness behind the docs' numbers cannot break unseen.
// The numbers of such a run mean nothing; its checks still hold.
func Small() bool { return testing.Short() }

// Shrunk is sc at a fiftieth of its instances, leases and statements (at least 100, 10
// and 100), over at most 5 backends: the same shape, every kind of row and lock present.
func (sc Scale) Shrunk() Scale {
	sc.Instances, sc.Leases, sc.Statements = max(sc.Instances/50, 100), max(sc.Leases/50, 10), max(sc.Statements/50, 100)
	sc.Backends = min(sc.Backends, 5)
	sc.AliveLocks = min(sc.AliveLocks, sc.Instances/sc.Backends)
	return sc
}

// BuildScale is Build at another scale; at a small scale (Small), at sc.Shrunk().
func BuildScale(b testing.TB, sc Scale) Data {
	b.Helper()
	if Small() {
		sc = sc.Shrunk()
	}
	start := time.Now()
	srv := pgtest.NewServer(b, pgtest.WithSetting("pg_stat_statements.max", "10000"))
	db := pgtest.NewDBOn(b, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	setup, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		b.Fatal(err)
	}
	defer setup.Close(context.Background())
	if _, err := migrations.Apply(ctx, setup, migrations.DefaultSchema); err != nil {
		b.Fatal(err)
	}
	run := func(sql string, args ...any) {
		if _, err := setup.Exec(ctx, sql, args...); err != nil {
			b.Fatalf("%.80s: %v", sql, err)
		}
	}
	run(`CREATE EXTENSION pg_stat_statements`)
	run(`INSERT INTO liveness.instances (instance_id, service_name, host_name, process_id, last_heartbeat_at)
	     SELECT gen_random_uuid(), 'service-' || (i % $2), 'host-' || (i % 500), i,
	            now() - make_interval(secs => (i * 7919) % 900)
	       FROM generate_series(1, $1) i`, sc.Instances, sc.Services)
	run(`INSERT INTO liveness.leases (name, holder, holder_instance_id, holder_host, taken_at, expires_at)
	     SELECT 'job-' || i, 'host-' || (i % 50) || ':' || i || ':00ff00ff00ff00ff', gen_random_uuid(), 'host-' || (i % 50),
	            now() - interval '1 minute', now() + make_interval(secs => (i % 240) - 120)
	       FROM generate_series(1, $1) i`, sc.Leases)

	// 5,000 distinct statements: each selects a different ordered pair of columns of a
	// wide table, so each has its own queryid. They run inside a DO block, as nested
	// statements, which pg_stat_statements.track=all records.
	cols := make([]string, 100)
	for i := range cols {
		cols[i] = fmt.Sprintf("c%d int", i)
	}
	run(`CREATE TABLE wide (` + strings.Join(cols, ", ") + `)`)
	run(fmt.Sprintf(`DO $$ BEGIN
	    FOR n IN 0..%d LOOP
	        EXECUTE format('SELECT c%%s, c%%s FROM wide', n / 100, n %% 100);
	    END LOOP; END $$`, sc.Statements-1))
	for range 10 {
		run(`UPDATE /* pg_liveness:heartbeat */ liveness.instances SET last_heartbeat_at = now() WHERE instance_id = $1`,
			"00000000-0000-0000-0000-000000000000")
	}
	var entries int
	if err := setup.QueryRow(ctx, `SELECT count(*) FROM pg_stat_statements`).Scan(&entries); err != nil || entries < sc.Statements {
		b.Fatalf("pg_stat_statements has %d entries (%v), want at least %d", entries, err, sc.Statements)
	}

	// The backends, each holding its alive locks and other advisory locks, idle.
	for i := range sc.Backends {
		cfg, err := pgx.ParseConfig(db.DSN)
		if err != nil {
			b.Fatal(err)
		}
		cfg.RuntimeParams["application_name"] = fmt.Sprintf("service-%d", i%sc.Services)
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close(context.Background()) })
		if _, err := c.Exec(ctx, `SELECT liveness.claim_instance_alive_lock(instance_id)
		                             FROM liveness.instances ORDER BY instance_id OFFSET $1 LIMIT $2`,
			i*sc.AliveLocks, sc.AliveLocks); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Exec(ctx, `SELECT pg_advisory_lock(k) FROM generate_series($1::bigint, $2::bigint) k`,
			int64(i*sc.OtherLocks), int64((i+1)*sc.OtherLocks-1)); err != nil {
			b.Fatal(err)
		}
	}
	// The lock holders' rows say so, as their heartbeat would have written.
	run(`UPDATE liveness.instances SET holds_alive_lock = true
	      WHERE instance_id IN (SELECT instance_id FROM liveness.instance_alive_locks)`)
	var held int
	if err := setup.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted`).Scan(&held); err != nil ||
		held != sc.Backends*(sc.AliveLocks+sc.OtherLocks) {
		b.Fatalf("%d advisory locks held (%v), want %d", held, err, sc.Backends*(sc.AliveLocks+sc.OtherLocks))
	}
	run(`VACUUM ANALYZE`)
	b.Logf("setup took %s: %d instances, %d leases, %d advisory locks over %d backends, %d pg_stat_statements entries",
		time.Since(start).Round(time.Millisecond), sc.Instances, sc.Leases, held, sc.Backends, entries)
	return Data{Scale: sc, DSN: db.DSN, Server: srv}
}

// Conn connects to the data set's database for a benchmark's statements, under a context
// that ends after timeout; both end with the benchmark.
func (d Data) Conn(b testing.TB, timeout time.Duration) (context.Context, *pgx.Conn) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	b.Cleanup(cancel)
	conn, err := pgx.Connect(ctx, d.DSN)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close(context.Background()) })
	return ctx, conn
}
