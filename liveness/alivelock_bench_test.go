package liveness_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/benchdata"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
	"github.com/pg-liveness/pg_liveness_exporter/store"
)

// BenchmarkAliveLockVerify measures the verification a leading agent sends every quarter
// of its lock grace (250 ms at the defaults), at the watcher's scale (10,500 advisory
// locks), side by side with SELECT 1 on the same connection, alternating. The connection
// holds an alive lock of its own, so every verification finds it held. It reports both
// medians, the ratio, and the database time a second of one leading agent.
func BenchmarkAliveLockVerify(b *testing.B) {
	data := benchdata.BuildScale(b, watcherScale)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, data.DSN)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(context.Background())
	id := uuid.New()
	pid := int64(conn.PgConn().PID())
	var backend int64
	var claimed *bool
	if err := conn.QueryRow(ctx, store.AliveLockClaim.In(liveness.DefaultSchema).SQL, id, pid).Scan(&backend, &claimed); err != nil ||
		claimed == nil || !*claimed {
		b.Fatalf("claim: %v, %v", claimed, err)
	}
	verify := store.AliveLockVerify.In(liveness.DefaultSchema).SQL
	timed := func(sql string, args ...any) time.Duration {
		t0 := time.Now()
		var held any
		if err := conn.QueryRow(ctx, sql, args...).Scan(&backend, &held); err != nil {
			b.Fatal(err)
		}
		d := time.Since(t0)
		if h, ok := held.(bool); ok && !h {
			b.Fatal("the verification does not find the connection's own lock")
		}
		return d
	}
	select1 := func() time.Duration { return timed(`SELECT 1::bigint, true`) }
	verified := func() time.Duration { return timed(verify, id) }
	for range 3 {
		select1()
		verified()
	}
	var t1, tv []time.Duration
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			t1, tv = append(t1, select1()), append(tv, verified())
		} else {
			tv, t1 = append(tv, verified()), append(t1, select1())
		}
	}
	b.StopTimer()
	median := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	m1, mv := median(t1), median(tv)
	b.ReportMetric(float64(m1.Microseconds())/1000, "ms-select1")
	b.ReportMetric(float64(mv.Microseconds())/1000, "ms-verify")
	b.ReportMetric(float64(mv)/float64(m1), "verify/select1")
	perSecond := float64(time.Second) / float64(liveness.DefaultLockGrace/4)
	b.ReportMetric(perSecond*float64(mv.Microseconds())/1000, "ms-db/s/leader")
}
