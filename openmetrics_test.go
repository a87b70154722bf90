package main

import (
	"context"
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
// line, the agent's counters with their _created, # EOF at the end. Otherwise, and when
// the scraper ranks the text format higher, the text format 0.0.4. promtool check
// metrics takes both.
func TestOpenMetricsOnRequest(t *testing.T) {
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
		"\npg_liveness_agent_heartbeats_created ",
		"\n# TYPE pg_liveness_statement_calls counter\n",
		"\n# TYPE process_cpu_seconds counter\n",
	} {
		if !strings.Contains(om, want) {
			t.Errorf("the OpenMetrics answer lacks %q", strings.TrimSpace(want))
		}
	}
	if !strings.HasSuffix(om, "\n# EOF\n") || strings.Count(om, "# EOF") != 1 {
		t.Errorf("the OpenMetrics answer does not end with one # EOF:\n...%s", om[max(0, len(om)-200):])
	}
	if strings.Contains(om, "pg_liveness_statement_calls_created") {
		t.Error("pg_stat_statements' counters have a _created, which PostgreSQL does not give")
	}

	for _, accept := range []string{"", "text/plain", "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;version=1.0.0;q=0.1"} {
		ct, text := scrapeAs(t, p, "/metrics", accept)
		if ct != "text/plain; version=0.0.4; charset=utf-8" || strings.Contains(text, "# EOF") || strings.Contains(text, "_created") {
			t.Errorf("Accept %q: Content-Type %q; want the text format", accept, ct)
		}
	}
	// promtool check metrics reads the text format: Debian's promtool (2.42) lints an
	// OpenMetrics counter's x_total samples as a metric of their own without help, so the
	// OpenMetrics answer is checked by Prometheus' own OpenMetrics parser instead, in
	// tools/alerts' end-to-end test, where a real Prometheus also scrapes it.
	_, text := scrapeAs(t, p, "/metrics", "")
	cmd := exec.Command(proctest.NeedTool(t, "promtool", "prometheus"), "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics, the text format: %v\n%s", err, out)
	}
}
