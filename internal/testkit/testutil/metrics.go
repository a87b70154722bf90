package testutil

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
)

// ScenarioExposition is the exact output the collector scenario test
// (collector/scenario_test.go) asserts, relative to the module root: every metric family
// the collectors export. The metric names that alert rules and dashboard panels may use
// are derived from it, so they cannot drift from what the exporter exposes. The binary
// also registers go_*, process_* and pg_liveness_exporter_build_info; no rule or panel
// uses them, so they are not added: an expression that starts to use one fails until it
// is added on purpose.
const ScenarioExposition = "collector/testdata/scenario.prom"

// ExposedMetrics returns the metric family names in ScenarioExposition.
func ExposedMetrics(t testing.TB) map[string]bool {
	t.Helper()
	names, err := exposition.FileMetricNames(filepath.Join(ModuleRoot(t), ScenarioExposition))
	if err != nil {
		t.Fatalf("exposed metrics: %v", err)
	}
	return names
}

// ModuleRoot returns the folder of the exporter's module (the repository's root), found
// from this file's place in it, so that the tests of the tools module, which run in
// tools/, reach the same files as the root module's.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the module root")
	}
	root := filepath.Join(filepath.Dir(self), "..", "..", "..")
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root: %v", err)
	}
	return root
}
