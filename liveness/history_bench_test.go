package liveness

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// withoutHistory puts the leases' triggers back as migration 0019 left them, before the
// history (migration 0020): the same statements, writing no history.
func withoutHistory(b *testing.B, ctx context.Context, pool *pgxpool.Pool) {
	b.Helper()
	for _, m := range migrations.All() {
		if m.Version == 19 {
			if _, err := pool.Exec(ctx, "SET search_path = "+defaults.Schema+";\n"+m.SQL+";\nRESET search_path"); err != nil {
				b.Fatal(err)
			}
			return
		}
	}
	b.Fatal("no migration 19")
}

// BenchmarkHistoryWrites is what the history (migration 0020) costs the statements that
// write it, beside the same statements without it (history=false: its triggers as
// migration 0019 left them), in one run: a lease taken and released (TryAcquire and
// Release, a singleton's leadership), and many leases taken and released in two
// statements (a shard set's member joining and leaving; 1,000, or 100 with -short).
// Renewals and heartbeats write no history: they are not here. server-us/op is the
// backend's CPU time per operation (from /proc); rows/op the history rows written.
func BenchmarkHistoryWrites(b *testing.B) {
	many := 1000
	if testing.Short() {
		many = 100
	}
	for _, c := range []struct {
		name string
		n    int // leases per operation, 0: one, through TryAcquire and Release
	}{{"take+release", 0}, {fmt.Sprintf("take+release/leases=%d", many), many}} {
		for _, history := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/history=%v", c.name, history), func(b *testing.B) {
				ctx, pool, l := benchLeases(b, 1)
				if !history {
					withoutHistory(b, ctx, pool)
				}
				var pid uint32
				if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
					b.Fatal(err)
				}
				op := func() error {
					if c.n == 0 {
						le, err := l.TryAcquire(ctx, "bench", time.Minute)
						if err != nil {
							return err
						}
						return le.Release(ctx)
					}
					if _, err := pool.Exec(ctx, `SELECT count(*) FROM generate_series(1, $1) g,
						LATERAL liveness.lease_take('shard/' || g, 'holder-' || g, 60, NULL, 'host') t WHERE t.epoch IS NOT NULL`, c.n); err != nil {
						return err
					}
					_, err := pool.Exec(ctx, `SELECT count(liveness.lease_let_go(l.name, 'holder-' || substr(l.name, 7), l.epoch))
						FROM liveness.leases l WHERE l.name LIKE 'shard/%'`)
					return err
				}
				for range 5 { // warm the caches
					if err := op(); err != nil {
						b.Fatal(err)
					}
				}
				var rows0, rows1 int64
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM liveness.history`).Scan(&rows0); err != nil {
					b.Fatal(err)
				}
				cpu := backendCPU(b, pid)
				b.ResetTimer()
				for b.Loop() {
					if err := op(); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64((backendCPU(b, pid)-cpu).Microseconds())/float64(b.N), "server-us/op")
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM liveness.history`).Scan(&rows1); err != nil {
					b.Fatal(err)
				}
				perOp := float64(rows1-rows0) / float64(b.N)
				b.ReportMetric(perOp, "rows/op")
				// Each lease taken and let go is two rows: an acquisition and an end.
				if want := float64(2 * max(c.n, 1)); history && perOp != want || !history && perOp != 0 {
					b.Fatalf("%v history rows per operation; want %v", perOp, map[bool]float64{true: want, false: 0}[history])
				}
			})
		}
	}
}
