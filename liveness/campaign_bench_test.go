package liveness_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/benchdata"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/latency"
)

// Follower tries per agent and second at the defaults, while its session listens: each
// of its campaigns (the reaper's, the two watchers', and here three jobs) tries once per
// QuietPeriod, jittered over its second half (45 s on average).
const followerTriesPerAgent = 6 / (0.75 * 60.0)

// BenchmarkLeaseAcquireRefused measures what a follower's try costs the database when the
// lease is held by a live instance, at the watcher's scale (10,000 instances holding
// their alive locks, 10,500 advisory locks in pg_locks), side by side with SELECT 1 on the
// same connection, alternating. A refused lease_acquire judges the holder
// (lease_is_free, then is_instance_alive) and the acquirer (is_instance_alive): "watched",
// while a watcher's tick is recent, from their rows and stamps (index lookups);
// "unwatched", without one, by the full verdict, which reads pg_locks (a copy of the
// server's whole lock table) for each. It reports both medians, the ratio, and the
// database time per second of a fleet of 10,000 agents (followerTriesPerAgent each).
func BenchmarkLeaseAcquireRefused(b *testing.B) {
	b.Run("watched", func(b *testing.B) { benchmarkLeaseAcquireRefused(b, true) })
	b.Run("unwatched", func(b *testing.B) { benchmarkLeaseAcquireRefused(b, false) })
}

func benchmarkLeaseAcquireRefused(b *testing.B, watched bool) {
	data := benchdata.BuildScale(b, watcherScale)
	ctx, conn := data.Conn(b, 20*time.Minute)
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
	acquire := store.LeaseAcquire.In(defaults.Schema).SQL
	const lease = "bench.campaign"
	// lease_acquire answers one row: the epoch once taken, NULL with the reason when refused.
	var epoch *int64
	var rest [4]any
	if err := conn.QueryRow(ctx, acquire, lease, "holder", 3600.0, holder, "host-h").Scan(&epoch, &rest[0], &rest[1], &rest[2], &rest[3]); err != nil || epoch == nil {
		b.Fatalf("the holder's acquisition: epoch %v, %v", epoch, err)
	}
	timed := func(sql string, args ...any) time.Duration {
		t0 := time.Now()
		rows, err := conn.Query(ctx, sql, args...)
		if err != nil {
			b.Fatal(err)
		}
		var taken bool
		for rows.Next() {
			if sql == acquire {
				var epoch *int64
				if err := rows.Scan(&epoch, &rest[0], &rest[1], &rest[2], &rest[3]); err != nil {
					b.Fatal(err)
				}
				taken = taken || epoch != nil
			}
		}
		rows.Close()
		d := time.Since(t0)
		if err := rows.Err(); err != nil {
			b.Fatal(err)
		}
		if taken {
			b.Fatal("a live holder's lease was taken")
		}
		return d
	}
	// A watcher's tick, recorded as watch_alive_locks records it, kept fresh (or stale)
	// on another connection.
	watch, err := pgx.Connect(ctx, data.DSN)
	if err != nil {
		b.Fatal(err)
	}
	defer watch.Close(context.Background())
	record := func() error {
		at := "clock_timestamp()"
		if !watched {
			at = "clock_timestamp() - interval '1 hour'"
		}
		_, err := watch.Exec(ctx, `INSERT INTO liveness.alive_lock_watch (watched_at, server_started_at)
		        VALUES (`+at+`, pg_postmaster_start_time())
		        ON CONFLICT (singleton) DO UPDATE SET watched_at = excluded.watched_at, server_started_at = excluded.server_started_at`)
		return err
	}
	if err := record(); err != nil {
		b.Fatal(err)
	}
	ticking, stopTicking := context.WithCancel(ctx)
	ticked := make(chan struct{})
	go func() {
		defer close(ticked)
		for {
			select {
			case <-ticking.Done():
				return
			case <-time.After(defaults.WatchInterval):
				if err := record(); err != nil && ticking.Err() == nil {
					b.Error(err)
					return
				}
			}
		}
	}()
	defer func() { stopTicking(); <-ticked }()
	select1 := func() time.Duration { return timed(`SELECT 1`) }
	refused := func() time.Duration { return timed(acquire, lease, "acquirer", 15.0, acquirer, "host-a") }
	_, mr := latency.SideBySide(b, "select1", select1, "refused", refused)
	const agents = 10000
	b.ReportMetric(agents*followerTriesPerAgent*float64(mr.Microseconds())/1e6, "db-cores@10k-agents")
}
