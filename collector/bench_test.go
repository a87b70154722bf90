package collector

import (
	"bufio"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/benchdata"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/latency"
)

// BenchmarkScrape measures whole scrapes through the Handler (collection, exposition
// encoding) against a database at the scale of the budget: 10,000 instances (1,500 of
// them holding their alive lock), 1,000 leases, 2,000 advisory locks held over 50
// backends, and 5,000 pg_stat_statements entries. Besides ns/op and allocs it reports
// the median and 90th percentile scrape, the statements sent per scrape (each one round
// trip), and the RSS of the whole test process (which also holds the 50 lock holders'
// connections and the setup's garbage).
func BenchmarkScrape(b *testing.B) {
	dsn := benchdata.Build(b)
	names := []string{"all"}
	for _, r := range registry {
		names = append(names, r.name)
	}
	for _, name := range names {
		b.Run(name, func(b *testing.B) {
			cfg := DefaultConfig()
			for _, r := range registry {
				if name != "all" {
					*r.settings(&cfg).enabled() = r.name == name
				}
			}
			qc := &queryCounter{}
			e := newExporter(b, cfg, exporterPool(b, dsn, 2, qc), testAgent, nil)
			h := e.Handler(nil)
			scrape := func() {
				req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
				req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", "10")
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				body := rec.Body.String()
				if rec.Code != http.StatusOK || !strings.Contains(body, "\npg_liveness_up 1\n") {
					b.Fatalf("scrape failed: %d %.500s", rec.Code, body)
				}
				for l := range strings.Lines(body) {
					if strings.HasPrefix(l, "pg_liveness_scrape_collector_success") && strings.HasSuffix(l, " 0\n") {
						b.Fatalf("collector failed: %s", l)
					}
				}
			}
			// Warm up: connections, prepared statements, and the statement classification
			// of the exporter's own new entries.
			for range 3 {
				scrape()
			}
			before := qc.n.Load()
			b.ReportAllocs()
			latency.Measure(b, scrape)
			b.ReportMetric(float64(qc.n.Load()-before)/float64(b.N), "queries/scrape")
			b.ReportMetric(rssMiB(b), "MiB-RSS")
		})
	}
}

// rssMiB reads the test process's resident set size.
func rssMiB(b *testing.B) float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb / 1024
		}
	}
	b.Fatal("no VmRSS in /proc/self/status")
	return 0
}
