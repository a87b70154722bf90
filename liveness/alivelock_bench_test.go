package liveness_test

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/benchdata"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/latency"
)

// BenchmarkAliveLockVerify measures the verification a leading agent sends every quarter
// of its lock grace (250 ms at the defaults), at the watcher's scale (10,500 advisory
// locks), side by side with SELECT 1 on the same connection, alternating. The connection
// holds an alive lock of its own, so every verification finds it held. It reports both
// medians, the ratio, and the database time a second of one leading agent.
func BenchmarkAliveLockVerify(b *testing.B) {
	data := benchdata.BuildScale(b, watcherScale)
	ctx, conn := data.Conn(b, 20*time.Minute)
	id := uuid.New()
	pid := int64(conn.PgConn().PID())
	var backend int64
	var claimed *bool
	var serverClock time.Time
	if err := conn.QueryRow(ctx, store.AliveLockClaim.In(defaults.Schema).SQL, id, pid).Scan(&backend, &claimed, &serverClock); err != nil ||
		claimed == nil || !*claimed {
		b.Fatalf("claim: %v, %v", claimed, err)
	}
	verify := store.AliveLockVerify.In(defaults.Schema).SQL
	timed := func(sql string, args ...any) time.Duration {
		t0 := time.Now()
		var held any
		if err := conn.QueryRow(ctx, sql, args...).Scan(&backend, &held, &serverClock); err != nil {
			b.Fatal(err)
		}
		d := time.Since(t0)
		if h, ok := held.(bool); ok && !h {
			b.Fatal("the verification does not find the connection's own lock")
		}
		return d
	}
	select1 := func() time.Duration { return timed(`SELECT 1::bigint, true, now()`) }
	verified := func() time.Duration { return timed(verify, id) }
	_, mv := latency.SideBySide(b, "select1", select1, "verify", verified)
	perSecond := float64(time.Second) / float64(defaults.LockGrace/4)
	b.ReportMetric(perSecond*float64(mv.Microseconds())/1000, "ms-db/s/leader")
}
