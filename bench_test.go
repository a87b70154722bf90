package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/benchdata"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/latency"
)

// BenchmarkExporterScrape runs the real binary (built without the race detector) as an
// agent against a database at the scale of the scrape budget in docs/performance.md
// (10,000 instances, 1,000 leases, 2,000 held advisory locks over 50 backends, 5,000
// pg_stat_statements entries) and scrapes it over HTTP as Prometheus would. It reports the median and 90th percentile scrape and the exporter
// process's resident memory after the run (VmRSS) and at its peak (VmHWM).
func BenchmarkExporterScrape(b *testing.B) {
	bin := buildForBenchmark(b)
	dsn := benchdata.Build(b)
	// The reaper would delete the data set's stale instances.
	p := startBinary(b, bin, []string{"DATA_SOURCE_NAME=" + dsn}, "--no-agent.reaper")
	p.waitFor(b, `(?m)^pg_liveness_agent_alive_lock_held 1$`, 60*time.Second)

	client := &http.Client{Timeout: 15 * time.Second}
	scrape := func() {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+p.addr+"/metrics", nil)
		req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", "10")
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "\npg_liveness_up 1\n") {
			b.Fatalf("scrape failed: %s %.300s", resp.Status, body)
		}
		if strings.Contains(string(body), `_success{collector="`) && strings.Contains(string(body), `"} 0`+"\n") {
			for l := range strings.Lines(string(body)) {
				if strings.HasPrefix(l, "pg_liveness_scrape_collector_success") && strings.HasSuffix(l, " 0\n") {
					b.Fatalf("collector failed: %s", l)
				}
			}
		}
	}
	for range 3 {
		scrape() // warm up connections and the statement classification
	}
	latency.Measure(b, scrape)
	b.ReportMetric(procStatusMiB(b, p.Pid(), "VmRSS"), "MiB-RSS")
	b.ReportMetric(procStatusMiB(b, p.Pid(), "VmHWM"), "MiB-peak-RSS")
}

func procStatusMiB(b *testing.B, pid int, field string) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb / 1024
		}
	}
	b.Fatalf("no %s for pid %d", field, pid)
	return 0
}
