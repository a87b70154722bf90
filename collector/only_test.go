package collector

import (
	"strings"
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
)

// Only runs the named collectors and no other, sharing the exporter's collectors; an
// unknown or disabled name is an error naming it (for /probe's collector parameter).
func TestOnlyRunsTheNamedCollectors(t *testing.T) {
	db := testdb.Migrated(t)
	e := newExporter(t, DefaultConfig(), exporterPool(t, db.DSN, 2, nil), nil, nil)
	only, err := e.Only(NameLeases, NameInstances)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(only.Enabled(), ","); got != "instances,leases" {
		t.Fatalf("Only runs %s", got)
	}
	mfs := scrapeFamilies(t, only)
	if value(mfs, "pg_liveness_up") != 1 {
		t.Error("pg_liveness_up is not 1")
	}
	for _, c := range []string{NameInstances, NameLeases} {
		if value(mfs, "pg_liveness_scrape_collector_success", "collector", c) != 1 {
			t.Errorf("%s did not run", c)
		}
	}
	if _, ran := mfs["pg_liveness_backends"]; ran {
		t.Error("advisory_locks ran though not named")
	}
	if all, err := e.Only(); err != nil || all != e {
		t.Errorf("Only() is not the whole exporter: %v", err)
	}
	for _, bad := range []string{NameAgent, "nope"} {
		if _, err := e.Only(NameLeases, bad); err == nil || !strings.Contains(err.Error(), `"`+bad+`" is not enabled`) {
			t.Errorf("Only(%s): %v", bad, err)
		}
	}
	if got := strings.Join(e.Enabled(), ","); got != "advisory_locks,history,instances,leases,statements" {
		t.Errorf("Only changed the exporter: %s", got)
	}
}
