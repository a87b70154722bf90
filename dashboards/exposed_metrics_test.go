package dashboards

import (
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
)

// scenarioExposition is the exact output the collector scenario test
// (collector/scenario_test.go) asserts: every metric family the collectors export. The
// metric names rules and dashboard panels may use are derived from it, so they cannot
// drift from what the exporter exposes. The binary also registers go_*, process_* and
// pg_liveness_exporter_build_info; no rule or panel uses them, so they are not added: an
// expression that starts to use one fails until it is added on purpose.
const scenarioExposition = "../collector/testdata/scenario.prom"

func exposedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names, err := exposition.FileMetricNames(scenarioExposition)
	if err != nil {
		t.Fatalf("exposed metrics: %v", err)
	}
	return names
}
