package collector

import (
	"fmt"
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/pgtest"
)

// TestInstancesSeriesCap: only the oldest max-series heartbeats get a series; the counts
// still cover every instance.
func TestInstancesSeriesCap(t *testing.T) {
	db := pgtest.NewDB(t)
	migrate(t, db, "liveness")
	// 20 instances, the i-th beat i minutes ago.
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, last_heartbeat_at)
	            SELECT ('00000000-0000-0000-0000-' || lpad(i::text, 12, '0'))::uuid, 'svc',
	                   now() - make_interval(mins => i)
	              FROM generate_series(1, 20) i`)
	for _, max := range []int{5, 0, 500} {
		t.Run(fmt.Sprint(max), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Instances.MaxSeries = max
			e := newExporter(t, cfg, exporterPool(t, db.DSN, 1, nil), nil, nil)
			mfs := scrapeFamilies(t, e)
			series := mfs["pg_liveness_instance_heartbeat_age_seconds"].GetMetric()
			want := min(max, 20)
			if len(series) != want {
				t.Fatalf("%d age series, want %d", len(series), want)
			}
			for i := range want { // the oldest: 20, 19, … minutes
				id := fmt.Sprintf("00000000-0000-0000-0000-%012d", 20-i)
				if v := value(mfs, "pg_liveness_instance_heartbeat_age_seconds", "instance_id", id); !(v >= float64(60*(20-i))) {
					t.Errorf("age of %s = %v, want a series of at least %d s", id, v, 60*(20-i))
				}
			}
			total := 0.0
			for _, st := range instanceStates {
				total += value(mfs, "pg_liveness_instances", "service", "svc", "state", st)
			}
			if total != 20 {
				t.Errorf("instances by state add up to %v, want 20", total)
			}
			if v := value(mfs, "pg_liveness_instance_oldest_heartbeat_age_seconds", "service", "svc"); !(v >= 1200 && v < 1260) {
				t.Errorf("oldest = %v, want about 1200", v)
			}
		})
	}
}
