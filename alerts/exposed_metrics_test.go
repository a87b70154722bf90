package alerts

import (
	"os"
	"strings"
	"testing"
)

// scenarioExposition is the exact output the collector scenario test
// (collector/scenario_test.go) asserts: every metric family the collectors export, each
// under a "# TYPE" line. The metric names rules and dashboard panels may use are derived
// from it, so they cannot drift from what the exporter exposes. The binary also registers
// go_*, process_* and pg_liveness_exporter_build_info; no rule or panel uses them, so they
// are not added: an expression that starts to use one fails until it is added on purpose.
const scenarioExposition = "../collector/testdata/scenario.prom"

// exposedMetrics returns the metric names of the scenario exposition, as written there
// (counters carry their _total suffix in the text format). Histograms and summaries add
// the series names Prometheus stores for them.
func exposedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	path := scenarioExposition
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("exposed metrics: %v", err)
	}
	names := map[string]bool{}
	var samples []string
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		switch {
		case len(f) == 4 && f[0] == "#" && f[1] == "TYPE":
			names[f[2]] = true
			switch f[3] {
			case "histogram":
				names[f[2]+"_bucket"], names[f[2]+"_sum"], names[f[2]+"_count"] = true, true, true
			case "summary":
				names[f[2]+"_sum"], names[f[2]+"_count"] = true, true
			}
		case len(f) > 0 && !strings.HasPrefix(f[0], "#"):
			samples = append(samples, strings.TrimSpace(line))
		}
	}
	if len(names) == 0 {
		t.Fatalf("%s: no # TYPE lines", path)
	}
	// Every sample must belong to a declared family, or the derived set would miss it.
	for _, s := range samples {
		name := s
		if i := strings.IndexAny(s, "{ \t"); i >= 0 {
			name = s[:i]
		}
		if !names[name] {
			t.Fatalf("%s: sample %q has no # TYPE line", path, s)
		}
	}
	return names
}

func TestExposedMetrics(t *testing.T) {
	got := exposedMetrics(t)
	for name, want := range map[string]bool{
		"pg_liveness_up":                    true,
		"pg_liveness_statement_calls_total": true, // a counter, as the text format writes it
		"pg_liveness_agent_info":            true,
		"pg_liveness_statement_calls":       false,
		"pg_livenes_up":                     false,
		"up":                                false, // Prometheus writes it; see syntheticMetrics
	} {
		if got[name] != want {
			t.Errorf("exposedMetrics()[%q] = %v, want %v", name, got[name], want)
		}
	}
}
