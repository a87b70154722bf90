package exposition

import "testing"

func TestMetricNames(t *testing.T) {
	got, err := FileMetricNames("../../collector/testdata/scenario.prom")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"pg_liveness_up":                    true,
		"pg_liveness_statement_calls_total": true, // a counter, as the text format writes it
		"pg_liveness_agent_info":            true,
		"pg_liveness_statement_calls":       false,
		"pg_livenes_up":                     false,
		"up":                                false, // Prometheus writes it, the exporter does not
	} {
		if got[name] != want {
			t.Errorf("MetricNames()[%q] = %v, want %v", name, got[name], want)
		}
	}
	h, err := MetricNames("# TYPE d histogram\nd_bucket{le=\"1\"} 1\nd_sum 1\nd_count 1\n")
	if err != nil || !h["d_bucket"] || !h["d_sum"] || !h["d_count"] {
		t.Errorf("histogram series: %v, %v", h, err)
	}
	if _, err := MetricNames("# TYPE a gauge\na 1\nb 2\n"); err == nil {
		t.Error("a sample without a # TYPE line was accepted")
	}
	if _, err := MetricNames("a 1\n"); err == nil {
		t.Error("text without # TYPE lines was accepted")
	}
}
