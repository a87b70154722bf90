package testutil

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
)

// ScenarioExposition is the exact output the collector scenario test
// (collector/scenario_test.go) asserts, relative to the module root: every metric family
// the collectors export. The metric names that alert rules and dashboard panels may use
// are derived from it and from the binary's own families below, so they cannot drift
// from what the exporter exposes. The binary also registers go_* and process_*; no rule
// or panel uses them, so they are not added: an expression that starts to use one fails
// until it is added on purpose.
const ScenarioExposition = "collector/testdata/scenario.prom"

// HistoryExposition is the history collector's exposition after real failovers
// (collector/history_test.go), whose histograms the scenario has no events for: its
// families count as exposed too.
const HistoryExposition = "collector/testdata/history.prom"

// binaryMetricPrefix names the families the binary itself registers besides the
// collectors' (build information, reloads, the targets' connections). The metrics table
// of docs/metrics.md lists them, and the root module's TestDocsMetricsMatchTheExporter
// keeps that table equal to what a real run of the binary exposes.
const binaryMetricPrefix = "pg_liveness_exporter_"

// ExposedMetrics returns the metric family names in ScenarioExposition and
// HistoryExposition, and the binary's own pg_liveness_exporter_* families from
// docs/metrics.md's metrics table.
func ExposedMetrics(t testing.TB) map[string]bool {
	t.Helper()
	root := ModuleRoot(t)
	names, err := exposition.FileMetricNames(filepath.Join(root, ScenarioExposition))
	if err != nil {
		t.Fatalf("exposed metrics: %v", err)
	}
	history, err := exposition.FileMetricNames(filepath.Join(root, HistoryExposition))
	if err != nil {
		t.Fatalf("exposed metrics: %v", err)
	}
	maps.Copy(names, history)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "metrics.md"))
	if err != nil {
		t.Fatalf("exposed metrics: %v", err)
	}
	text := string(doc)
	start, end := strings.Index(text, "<!-- metrics:begin -->"), strings.Index(text, "<!-- metrics:end -->")
	if start < 0 || end < start {
		t.Fatal("exposed metrics: docs/metrics.md has no metrics block")
	}
	for _, m := range binaryMetricRE.FindAllStringSubmatch(text[start:end], -1) {
		names[m[1]] = true
	}
	return names
}

// binaryMetricRE matches a row of docs/metrics.md's metrics table that names a binary family.
var binaryMetricRE = regexp.MustCompile("(?m)^\\| `(" + binaryMetricPrefix + "[a-z_]+)` \\|")

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
