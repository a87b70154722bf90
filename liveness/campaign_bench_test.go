package liveness_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/benchdata"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/latency"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
	"github.com/pg-liveness/pg_liveness_exporter/store"
)

// Follower tries per agent and second at the defaults: the reaper's campaign retries
// every 5 s, each of the two watchers' every 30 s.
const followerTriesPerAgent = 1.0/5 + 2.0/30

// BenchmarkLeaseAcquireRefused measures what a follower's try costs the database when the
// lease is held by a live instance, at the watcher's scale (10,000 instances holding
// their alive locks, 10,500 advisory locks in pg_locks), side by side with SELECT 1 on the
// same connection, alternating. A refused lease_acquire judges the holder
// (lease_is_free, then is_instance_alive) and the acquirer (is_instance_alive): each
// verdict reads pg_locks, which copies the server's whole lock table. It reports both
// medians, the ratio, and the database time per second of a fleet of 10,000 agents
// following the reaper's and the watchers' leases (followerTriesPerAgent each).
func BenchmarkLeaseAcquireRefused(b *testing.B) {
	data := benchdata.BuildScale(b, watcherScale)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, data.DSN)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(context.Background())
	// Two instances of the fleet that hold their alive locks, their heartbeats fresh: the
	// holder and the acquirer.
	var holder, acquirer uuid.UUID
	if err := conn.QueryRow(ctx, `SELECT min(instance_id::text)::uuid, max(instance_id::text)::uuid
	                                FROM (SELECT instance_id FROM liveness.instances ORDER BY instance_id LIMIT 2) f`).
		Scan(&holder, &acquirer); err != nil {
		b.Fatal(err)
	}
	for _, id := range []uuid.UUID{holder, acquirer} {
		if _, err := conn.Exec(ctx, `UPDATE liveness.instances SET last_heartbeat_at = now() WHERE instance_id = $1`, id); err != nil {
			b.Fatal(err)
		}
		var alive bool
		if err := conn.QueryRow(ctx, `SELECT liveness.is_instance_alive($1)`, id).Scan(&alive); err != nil || !alive {
			b.Fatalf("instance %s alive = %v, %v; want a live holder and acquirer", id, alive, err)
		}
	}
	acquire := store.LeaseAcquire.In(liveness.DefaultSchema).SQL
	const lease = "bench.campaign"
	if tag, err := conn.Exec(ctx, acquire, lease, "holder", 3600.0, holder, "host-h"); err != nil || tag.RowsAffected() != 1 {
		b.Fatalf("the holder's acquisition: %v, %v", tag, err)
	}
	timed := func(sql string, args ...any) time.Duration {
		t0 := time.Now()
		tag, err := conn.Exec(ctx, sql, args...)
		d := time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		if tag.RowsAffected() != 0 && sql == acquire {
			b.Fatal("a live holder's lease was taken")
		}
		return d
	}
	select1 := func() time.Duration { return timed(`SELECT 1`) }
	refused := func() time.Duration { return timed(acquire, lease, "acquirer", 15.0, acquirer, "host-a") }
	_, mr := latency.SideBySide(b, "select1", select1, "refused", refused)
	const agents = 10000
	b.ReportMetric(agents*followerTriesPerAgent*float64(mr.Microseconds())/1e6, "db-cores@10k-agents")
}
