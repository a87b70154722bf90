package collector

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/latency"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
)

// BenchmarkAdvisoryLocksByServerLocks measures what the advisory-locks statement costs one
// database while other databases of the same server hold advisory locks: pg_locks is the
// server's whole lock table, read in full and then filtered to the database. Discovery
// runs this statement once per database and scrape, so a server of N databases pays N
// times this. Sub-benchmarks run in one run, one after another, from 0 to 6,000 locks
// held by sessions in another database; each iteration is one statement.
func BenchmarkAdvisoryLocksByServerLocks(b *testing.B) {
	srv := pgtest.NewServer(b, pgtest.WithSetting("max_locks_per_transaction", "256"))
	db, other := pgtest.NewDBOn(b, srv), pgtest.NewDBOn(b, srv)
	testdb.Migrate(b, db.DSN, "liveness")
	pool := exporterPool(b, db.DSN, 1, nil)
	q := store.AdvisoryLocks.For(nil)
	ctx := context.Background()
	held := 0
	for _, locks := range []int{0, 1000, 3000, 6000} {
		for held < locks { // 1,000 locks per session, each session kept until the end
			conn := other.Conn(b)
			if _, err := conn.Exec(ctx, `SELECT pg_catalog.pg_advisory_lock(k) FROM generate_series($1::bigint, $1::bigint + 999) k`, held); err != nil {
				b.Fatal(err)
			}
			held += 1000
		}
		b.Run(fmt.Sprintf("locks=%d", locks), func(b *testing.B) {
			for b.Loop() {
				rows, err := pool.Query(ctx, q.SQL, q.Args()...)
				if err != nil {
					b.Fatal(err)
				}
				rows.Close()
				if err := rows.Err(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDiscoveredServerScrape measures what one scrape of the databases that
// discovery found on one server costs, the statements of the instances and
// advisory_locks collectors (their defaults) sent one after another, as the server
// sees them: each database reading pg_locks itself ("own", what discovery did before),
// and the server's locks read once for all of them, each database given its part
// ("shared"). 50 databases of 20 instances, 10 of them holding their alive locks, on a
// server whose other sessions hold 6,000 advisory locks in another database. Pairs of
// scrapes, interleaved (latency.SideBySide); the ratio is shared/own.
func BenchmarkDiscoveredServerScrape(b *testing.B) {
	const databases, instances, locked, serverLocks = 50, 20, 10, 6000
	srv := pgtest.NewServer(b, pgtest.WithSetting("max_locks_per_transaction", "256"))
	ctx := context.Background()
	maintenance := pgtest.NewDBOn(b, srv)
	other := pgtest.NewDBOn(b, srv)
	for held := 0; held < serverLocks; held += 1000 {
		if _, err := other.Conn(b).Exec(ctx, `SELECT pg_catalog.pg_advisory_lock(k) FROM generate_series($1::bigint, $1::bigint + 999) k`, held); err != nil {
			b.Fatal(err)
		}
	}
	mpool := exporterPool(b, maintenance.DSN, 1, nil)
	var names []string
	var own, shared []*Exporter
	cfg := DefaultConfig()
	cfg.Leases.Enabled, cfg.Statements.Enabled, cfg.History.Enabled = false, false, false
	key := new(int)
	for range databases {
		db := pgtest.NewDBOn(b, srv)
		testdb.Migrate(b, db.DSN, "liveness")
		db.Exec(b, `INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock, last_heartbeat_at)
		            SELECT gen_random_uuid(), 'svc-' || (i % 4), i <= $1, now() FROM generate_series(1, $2) i`, locked, instances)
		if _, err := db.Conn(b).Exec(ctx, `SELECT liveness.claim_instance_alive_lock(instance_id) FROM liveness.instances WHERE holds_alive_lock`); err != nil {
			b.Fatal(err)
		}
		names = append(names, db.Name)
		pool := exporterPool(b, db.DSN, 1, nil)
		own = append(own, newExporter(b, cfg, pool, nil, discard()))
		c := cfg
		c.Locks = func(ctx context.Context) (*DatabaseLocks, error) {
			all, err := ScrapeOnce(ctx, key, func(ctx context.Context) (any, error) { return ReadServerLocks(ctx, mpool, names) })
			if err != nil {
				return nil, err
			}
			return all.(map[string]*DatabaseLocks)[db.Name], nil
		}
		shared = append(shared, newExporter(b, c, pool, nil, discard()))
	}
	// One scrape: every database's collectors, one after another, under one scrape's
	// context (the shared read is taken by the first).
	scrape := func(exporters []*Exporter) func() time.Duration {
		return func() time.Duration {
			sctx := withScrapeMemo(ctx)
			out := new(exposition.Builder)
			start := time.Now()
			for _, e := range exporters {
				for _, c := range e.collectors {
					out.Reset()
					if err := c.c.Update(sctx, out); err != nil {
						b.Fatal(err)
					}
				}
			}
			return time.Since(start)
		}
	}
	latency.SideBySide(b, "own", scrape(own), "shared", scrape(shared))
}
