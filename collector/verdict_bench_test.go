package collector

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/benchdata"
	"github.com/pg-liveness/pg_liveness_exporter/store"
)

// instancesSQLBeforeVerdict is the instances collector's statement before instance_states
// existed: states computed inline with the observer's thresholds, hash-joined to the
// granted alive locks. Kept only to measure what the one verdict costs against it.
const instancesSQLBeforeVerdict = `
SELECT i.service_name, NULL::text,
       count(*) FILTER (WHERE a.locked AND i.last_heartbeat_at > now() - make_interval(secs => $1)),
       count(*) FILTER (WHERE a.locked AND i.last_heartbeat_at <= now() - make_interval(secs => $1)
                                       AND i.last_heartbeat_at > now() - make_interval(secs => $2)),
       count(*) FILTER (WHERE a.locked IS NULL AND i.last_heartbeat_at > now() - make_interval(secs => $1)),
       count(*) FILTER (WHERE a.locked IS NULL AND i.last_heartbeat_at <= now() - make_interval(secs => $1)),
       count(*) FILTER (WHERE a.locked AND i.last_heartbeat_at <= now() - make_interval(secs => $2)),
       extract(epoch FROM now() - min(i.last_heartbeat_at))::float8
  FROM {schema}.instances i
  LEFT JOIN (SELECT DISTINCT l.instance_id, true AS locked FROM {schema}.instance_alive_locks l) a
         ON a.instance_id = i.instance_id
 GROUP BY i.service_name
UNION ALL
(SELECT i.service_name, i.instance_id::text, NULL, NULL, NULL, NULL, NULL,
        extract(epoch FROM now() - i.last_heartbeat_at)::float8
   FROM {schema}.instances i
  ORDER BY i.last_heartbeat_at, i.instance_id
  LIMIT $3)`

// BenchmarkInstancesVerdictCost runs the instances collector's statement before and after
// instance_states alternately, on the budget's data set (10,000 instances, 1,500 holding
// their alive lock, 2,000 advisory locks), so that both see the same machine load. It
// reports both medians and their ratio (after / before). Each iteration is one pair.
func BenchmarkInstancesVerdictCost(b *testing.B) {
	dsn := benchdata.Build(b)
	pool := exporterPool(b, dsn, 2, nil)
	cfg := DefaultConfig()
	before := strings.ReplaceAll(instancesSQLBeforeVerdict, "{schema}", `"liveness"`)
	query := store.Instances.For(nil)
	after := query.SQL
	args := []any{store.DefaultStaleThreshold.Seconds(), store.DefaultDefinitiveDeadCutoff.Seconds(), cfg.Instances.MaxSeries}
	argsAfter := query.Args(cfg.Instances.MaxSeries)
	run := func(sql string) time.Duration {
		args := args
		if sql == after {
			args = argsAfter
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		t0 := time.Now()
		rows, err := pool.Query(ctx, sql, args...)
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
	for range 3 {
		run(before)
		run(after)
	}
	var tb, ta []time.Duration
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			tb, ta = append(tb, run(before)), append(ta, run(after))
		} else {
			ta, tb = append(ta, run(after)), append(tb, run(before))
		}
	}
	b.StopTimer()
	slices.Sort(tb)
	slices.Sort(ta)
	mb, ma := tb[len(tb)/2], ta[len(ta)/2]
	b.ReportMetric(float64(mb.Microseconds())/1000, "ms-before")
	b.ReportMetric(float64(ma.Microseconds())/1000, "ms-after")
	b.ReportMetric(float64(ma)/float64(mb), "after/before")
}
