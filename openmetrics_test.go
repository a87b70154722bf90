package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/proctest"
)

// prometheusAccept is the Accept header Prometheus sends when it scrapes.
const prometheusAccept = "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"

// scrapeAs GETs path with the Accept header and returns the Content-Type and body.
func scrapeAs(t *testing.T, p *exporterProc, path, accept string) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+path, nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v\n%s", path, resp.Status, err, b)
	}
	return resp.Header.Get("Content-Type"), string(b)
}

// OpenMetrics is served when the scraper prefers it, as client_golang's promhttp
// negotiates (Prometheus does by default): counters named without _total in their TYPE
// line, # EOF at the end, and, as in client_golang, no _created samples unless
// --web.openmetrics-created-samples asks for them (then the agent's counters have theirs,
// pg_stat_statements' none). Otherwise, and when the scraper ranks the text format
// higher, the text format 0.0.4. promtool check metrics takes both: it parses each
// family once, so two families of one name (client_golang's go_memstats_alloc_bytes
// gauge beside its go_memstats_alloc_bytes_total counter, issue 829) fail it.
func TestOpenMetricsOnRequest(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	db.Exec(t, `CREATE EXTENSION pg_stat_statements`)
	p := startExporter(t, []string{"DATA_SOURCE_NAME=" + db.DSN})
	p.waitFor(t, `(?m)^pg_liveness_agent_joined 1$`, 30*time.Second)

	ct, om := scrapeAs(t, p, "/metrics", prometheusAccept)
	if ct != "application/openmetrics-text; version=1.0.0; charset=utf-8" {
		t.Errorf("Prometheus' Accept header got Content-Type %q, want OpenMetrics 1.0.0", ct)
	}
	for _, want := range []string{
		"\n# TYPE pg_liveness_agent_heartbeats counter\n",
		"\npg_liveness_agent_heartbeats_total ",
		"\n# TYPE pg_liveness_statement_calls counter\n",
		"\n# TYPE process_cpu_seconds counter\n",
		"\n# TYPE go_memstats_alloc_bytes gauge\n",
		"\ngo_gc_heap_allocs_bytes_total ", // what go_memstats_alloc_bytes_total counted
	} {
		if !strings.Contains(om, want) {
			t.Errorf("the OpenMetrics answer lacks %q", strings.TrimSpace(want))
		}
	}
	if strings.Contains(om, "_created") {
		t.Error("the OpenMetrics answer has _created samples without --web.openmetrics-created-samples")
	}
	if !strings.HasSuffix(om, "\n# EOF\n") || strings.Count(om, "# EOF") != 1 {
		t.Errorf("the OpenMetrics answer does not end with one # EOF:\n...%s", om[max(0, len(om)-200):])
	}
	checkOpenMetricsWithPromtool(t, om)

	for _, accept := range []string{"", "text/plain", "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;version=1.0.0;q=0.1"} {
		ct, text := scrapeAs(t, p, "/metrics", accept)
		if ct != "text/plain; version=0.0.4; charset=utf-8" || strings.Contains(text, "# EOF") || strings.Contains(text, "_created") {
			t.Errorf("Accept %q: Content-Type %q; want the text format", accept, ct)
		}
	}
	_, text := scrapeAs(t, p, "/metrics", "")
	cmd := exec.Command(proctest.NeedTool(t, "promtool", "prometheus"), "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics, the text format: %v\n%s", err, out)
	}

	created := startExporter(t, []string{"DATA_SOURCE_NAME=" + db.DSN}, "--web.openmetrics-created-samples", "--no-agent")
	created.waitFor(t, `(?m)^pg_liveness_up 1$`, 30*time.Second)
	_, om = scrapeAs(t, created, "/metrics", prometheusAccept)
	if !strings.Contains(om, "\ngo_gc_heap_allocs_bytes_created ") || strings.Contains(om, "pg_liveness_statement_calls_created") {
		t.Error("with --web.openmetrics-created-samples: want the Go runtime's counters' _created, and none for pg_stat_statements' counters")
	}
	checkOpenMetricsWithPromtool(t, om)
}

// checkOpenMetricsWithPromtool runs promtool check metrics on an OpenMetrics answer.
// Debian's promtool (2.42) reads it with the text format's parser, which parses it (# EOF
// is a comment) and refuses a family whose name comes twice; its linter then reads each
// counter's x_total (and x_created) samples as metrics of their own without help. Those
// lint lines, for counters the answer declares, are all it may print: a parse error, or
// any other lint, fails the test.
func checkOpenMetricsWithPromtool(t *testing.T, om string) {
	t.Helper()
	counters := map[string]bool{}
	for line := range strings.Lines(om) {
		if name, ok := strings.CutSuffix(strings.TrimPrefix(line, "# TYPE "), " counter\n"); ok && strings.HasPrefix(line, "# TYPE ") {
			counters[name] = true
		}
	}
	cmd := exec.Command(proctest.NeedTool(t, "promtool", "prometheus"), "check", "metrics")
	cmd.Stdin = strings.NewReader(om)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 3) { // 3: lint problems only
		t.Fatalf("promtool check metrics, the OpenMetrics answer: %v\n%s", err, out)
	}
	for line := range strings.Lines(string(out)) {
		name, ok := strings.CutSuffix(strings.TrimSpace(line), " no help text")
		base := strings.TrimSuffix(strings.TrimSuffix(name, "_total"), "_created")
		if !ok || base == name || !counters[base] {
			t.Errorf("promtool check metrics, the OpenMetrics answer: %s", strings.TrimSpace(line))
		}
	}
}
