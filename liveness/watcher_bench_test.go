package liveness_test

import (
	"slices"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/benchdata"
)

// watcherScale is a fleet of 10,000 instances each holding its alive lock (50 backends
// of 200 locks, and 10 other advisory locks each): 10,500 advisory locks in pg_locks.
var watcherScale = benchdata.Scale{Instances: 10000, Services: 20, Leases: 1000, Backends: 50, AliveLocks: 200,
	OtherLocks: 10, Statements: 5000}

// BenchmarkWatcherTick measures a watcher's tick at 10,000 instances, side by side with
// SELECT 1 in the same run (alternating, so that all three see the same load): "same" is
// the tick when no lock appeared or vanished (the digest only), "changed" the tick after
// a change (the digest, then the stamp of every vanished lock, here none). It reports
// each median, the ratios to SELECT 1, and the fleet's database time per second at
// 2 watchers × 1/WatchInterval ticks. Every "same" tick is checked to write only its own
// stamp (the one row of alive_lock_watch, from migration 0010 on) and no absence.
func BenchmarkWatcherTick(b *testing.B) {
	data := benchdata.BuildScale(b, watcherScale)
	ctx, conn := data.Conn(b, 20*time.Minute)
	tick := store.WatchAliveLocks.In(defaults.Schema).SQL
	var digest string
	if err := conn.QueryRow(ctx, tick, nil).Scan(&digest, new(any), new(any)); err != nil {
		b.Fatal(err)
	}
	var locks int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'`).Scan(&locks); err != nil {
		b.Fatal(err)
	}
	if locks < data.Instances {
		b.Fatalf("%d advisory locks, want the fleet's %d alive locks at least", locks, data.Instances)
	}
	run := func(sql string, args ...any) time.Duration {
		t0 := time.Now()
		rows, err := conn.Query(ctx, sql, args...)
		if err != nil {
			b.Fatal(err)
		}
		for rows.Next() {
		}
		if err := rows.Err(); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	same := func() time.Duration {
		tx, err := conn.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		t0 := time.Now()
		var got string
		if err := tx.QueryRow(ctx, tick, digest).Scan(&got, new(any), new(any)); err != nil {
			b.Fatal(err)
		}
		d := time.Since(t0)
		// Rows this transaction wrote, by table: xmin is the 32-bit transaction id.
		var stamps, absences int
		if err := tx.QueryRow(ctx, `WITH me AS (SELECT (pg_current_xact_id_if_assigned()::text::numeric % 4294967296)::text AS xid)
			SELECT (SELECT count(*) FROM liveness.alive_lock_watch, me WHERE xmin::text = me.xid),
			       (SELECT count(*) FROM liveness.alive_lock_absences, me WHERE xmin::text = me.xid)`).Scan(&stamps, &absences); err != nil {
			b.Fatal(err)
		}
		if got != digest || stamps != 1 || absences != 0 {
			b.Fatalf("a tick with nothing changed: digest %q (want %q), %d watch stamps (want 1) and %d absences written (want 0)", got, digest, stamps, absences)
		}
		return d
	}
	changed := func() time.Duration { return run(tick, "not the digest") }
	select1 := func() time.Duration { return run(`SELECT 1`) }
	for range 3 {
		select1()
		same()
		changed()
	}
	var t1, ts, tc []time.Duration
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			t1, ts, tc = append(t1, select1()), append(ts, same()), append(tc, changed())
		} else {
			tc, ts, t1 = append(tc, changed()), append(ts, same()), append(t1, select1())
		}
	}
	b.StopTimer()
	median := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	m1, ms, mc := median(t1), median(ts), median(tc)
	b.ReportMetric(float64(m1.Microseconds())/1000, "ms-select1")
	b.ReportMetric(float64(ms.Microseconds())/1000, "ms-same")
	b.ReportMetric(float64(mc.Microseconds())/1000, "ms-changed")
	b.ReportMetric(float64(ms)/float64(m1), "same/select1")
	b.ReportMetric(float64(mc)/float64(m1), "changed/select1")
	perSecond := 2 * float64(time.Second) / float64(defaults.WatchInterval)
	b.ReportMetric(perSecond, "statements/s/fleet")
	b.ReportMetric(perSecond*float64(ms.Microseconds())/1000, "ms-db/s/fleet")
}
