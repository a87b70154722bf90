package collector

import (
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/benchdata"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/latency"
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
	maxSeries := DefaultConfig().Instances.MaxSeries
	beforeSQL := strings.ReplaceAll(instancesSQLBeforeVerdict, "{schema}", `"liveness"`)
	after := store.Instances.For(nil)
	latency.SideBySide(b, "before", func() time.Duration {
		d, _ := timeQuery(b, pool, beforeSQL, store.DefaultStaleThreshold.Seconds(), store.DefaultDefinitiveDeadCutoff.Seconds(), maxSeries)
		return d
	}, "after", func() time.Duration {
		d, _ := timeQuery(b, pool, after.SQL, after.Args(maxSeries)...)
		return d
	})
}
