package collector

import (
	"context"
	"fmt"
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/store"
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
