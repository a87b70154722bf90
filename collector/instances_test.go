package collector

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
)

// TestInstancesSeriesCap: only the oldest max-series heartbeats get a series; the counts
// still cover every instance.
func TestInstancesSeriesCap(t *testing.T) {
	db := testdb.Migrated(t)
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

func instancesOnly(maxServices int) Config {
	cfg := DefaultConfig()
	cfg.Leases.Enabled, cfg.AdvisoryLocks.Enabled, cfg.Statements.Enabled, cfg.Agent.Enabled = false, false, false, false
	cfg.History.Enabled = false
	cfg.Instances.MaxServices = maxServices
	return cfg
}

// Beyond --collector.instances.max-services, services with dead instances come first,
// then the largest; the rest are summed into service="other", with how many were folded.
func TestInstancesCapFoldsServices(t *testing.T) {
	db := testdb.Migrated(t)
	// svc-0 … svc-4 with 1 … 5 fresh heartbeat-only instances; "sick" has one stale one.
	for i := range 5 {
		db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name)
			SELECT gen_random_uuid(), $1 FROM generate_series(1, $2)`, fmt.Sprintf("svc-%d", i), i+1)
	}
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, last_heartbeat_at)
		VALUES (gen_random_uuid(), 'sick', now() - interval '1 hour')`)
	e := newExporter(t, instancesOnly(3), exporterPool(t, db.DSN, 1, nil), nil, nil)
	got := scrapeFamilies(t, e)
	checkSamples(t, got, []sample{
		{"pg_liveness_instances", []string{"service", "sick", "state", "stale"}, 1},
		{"pg_liveness_instances", []string{"service", "svc-4", "state", "heartbeat_only"}, 5},
		{"pg_liveness_instances", []string{"service", "svc-3", "state", "heartbeat_only"}, 4},
		{"pg_liveness_instances", []string{"service", "other", "state", "heartbeat_only"}, 1 + 2 + 3},
		{"pg_liveness_instances", []string{"service", "svc-0", "state", "heartbeat_only"}, absent},
		{"pg_liveness_instance_services_folded", nil, 3},
	})
}

// In a SQL_ASCII database a service name can hold any bytes. The bad bytes are replaced
// in the label; no other service is lost.
func TestInstancesInvalidUTF8(t *testing.T) {
	ascii := pgtest.NewSQLASCIIDB(t)
	testdb.Migrate(t, ascii.DSN, "liveness")
	exec(t, ascii.ConnAs(t, "setup"), `INSERT INTO liveness.instances (instance_id, service_name) VALUES
		(gen_random_uuid(), E'caf\xe9'), (gen_random_uuid(), 'good')`)
	e := newExporter(t, instancesOnly(10), exporterPool(t, ascii.DSN, 1, nil), nil, nil)
	got := scrapeFamilies(t, e)
	checkSamples(t, got, []sample{
		{"pg_liveness_scrape_collector_success", []string{"collector", "instances"}, 1},
		{"pg_liveness_instances", []string{"service", "good", "state", "heartbeat_only"}, 1},
		{"pg_liveness_instances", []string{"service", "caf\uFFFD", "state", "heartbeat_only"}, 1},
	})
}

// With the default caps, 5,000 services and 5,000 leases stay under 10,000 samples per
// scrape: label sets are bounded however many rows the database holds.
func TestDefaultCapsBoundTheScrape(t *testing.T) {
	db := testdb.Migrated(t)
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name)
		SELECT gen_random_uuid(), 'svc-' || i FROM generate_series(1, 5000) i`)
	db.Exec(t, `INSERT INTO liveness.leases (name, holder, expires_at)
		SELECT 'job-' || i, 'host:1:' || i, now() + interval '1 minute' FROM generate_series(1, 5000) i`)
	cfg := DefaultConfig()
	e := newExporter(t, cfg, exporterPool(t, db.DSN, 2, nil), nil, nil)
	samples := 0
	for _, mf := range scrapeFamilies(t, e) {
		samples += len(mf.GetMetric())
	}
	if samples >= 10000 || samples < 5000 {
		t.Fatalf("%d samples per scrape, want under 10,000 (and the capped series present)", samples)
	}
	t.Logf("%d samples", samples)
}

// TestStandbyLoggedOnChange: a database that is a standby scrape after scrape is one
// warning, then debug lines; becoming a primary again is one line; a primary is none.
func TestStandbyLoggedOnChange(t *testing.T) {
	logger, logs := logbuf.Logger()
	c := &instancesCollector{log: logger}
	for _, standby := range []bool{false, true, true, true, false, false} {
		c.reportRecovery(standby)
	}
	out := logs.String()
	for _, want := range []struct {
		line string
		n    int
	}{
		{`level=WARN msg="the database is a hot standby`, 1},
		{`level=DEBUG msg="the database is a hot standby`, 2},
		{`level=INFO msg="the database is no longer a standby`, 1},
	} {
		if n := strings.Count(out, want.line); n != want.n {
			t.Errorf("%d lines %s, want %d:\n%s", n, want.line, want.n, out)
		}
	}
}
