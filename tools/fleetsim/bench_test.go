package fleetsim_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/tools/fleetsim"
)

// BenchmarkHeartbeatWrites runs the same fleet in both liveness modes, side by side, and
// counts heartbeat writes from pg_stat_statements: with the alive lock held an instance
// should write once per slow interval, in heartbeat-table-only mode once per fast
// interval. Intervals are scaled down (fast 100 ms, slow 200 ms); the reported figure is
// writes per instance per slow interval, so the expected values are 1 and 2.
func BenchmarkHeartbeatWrites(b *testing.B) {
	const (
		instances = 20
		fast      = 100 * time.Millisecond
		slow      = 200 * time.Millisecond
		window    = 2 * time.Second
	)
	for _, mode := range []struct {
		name          string
		heartbeatOnly int
	}{{"advisory-lock-when-available", 0}, {"heartbeat-table-only", instances}} {
		b.Run(mode.name, func(b *testing.B) {
			db := pgtest.NewDB(b)
			db.Exec(b, `CREATE EXTENSION pg_stat_statements`)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			f, err := fleetsim.Start(ctx, fleetsim.Config{
				DSN: db.DSN, ApplyMigrations: true, Services: []string{"bench"},
				Instances: instances, HeartbeatOnly: mode.heartbeatOnly,
				HeartbeatInterval: fast, HeartbeatSlowInterval: slow, StaleThreshold: 10 * slow,
				VerifyInterval: 50 * time.Millisecond, MaxConns: 4,
			})
			if err != nil {
				b.Fatal(err)
			}
			defer f.Stop()
			time.Sleep(time.Second) // every lock claimed, every first beat written
			pool := f.Pool()
			var writes int64
			b.ResetTimer()
			for range b.N {
				before := heartbeatCalls(b, ctx, pool)
				time.Sleep(window)
				writes += heartbeatCalls(b, ctx, pool) - before
			}
			b.StopTimer()
			perSlow := float64(writes) / float64(instances) / (float64(b.N) * float64(window) / float64(slow))
			b.ReportMetric(perSlow, "writes/instance/slow-interval")
		})
	}
}

func heartbeatCalls(b *testing.B, ctx context.Context, pool *pgxpool.Pool) int64 {
	var n int64
	err := pool.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND query LIKE '%/* pg_liveness:heartbeat */%'`).Scan(&n)
	if err != nil {
		b.Fatal(err)
	}
	return n
}
