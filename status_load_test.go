package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/benchdata"
)

// pageLoad is what 100 concurrent status-page clients did while scrapes were timed.
type pageLoad struct {
	idle, loaded   []time.Duration // scrape latencies
	ok, busy, fail int64           // page answers: 200, 429, anything else
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// ratio is the median scrape under page load over the median idle scrape.
func (l pageLoad) ratio() float64 { return float64(median(l.loaded)) / float64(median(l.idle)) }

// measurePageLoad times scrapes of the exporter at addr side by side: rounds of idle
// scrapes, then scrapes while clients hammer /status.json, each client looping with no
// pause (half of them on the same URL, half each on a page of its own, so that a cache
// alone could not help), honouring Retry-After when told to wait. Scrapes start every
// scrapeEvery in both phases, so that the loaded phase lasts past any burst allowance.
func measurePageLoad(tb testing.TB, addr string, clients, rounds, scrapes int) pageLoad {
	const scrapeEvery = 250 * time.Millisecond
	tb.Helper()
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: clients + 10}}
	scrape := func() time.Duration {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/metrics", nil)
		req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", "20")
		t0 := time.Now()
		res, err := client.Do(req)
		if err != nil {
			tb.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		d := time.Since(t0)
		if res.StatusCode != http.StatusOK || !strings.Contains(string(body), "\npg_liveness_up 1\n") {
			tb.Fatalf("scrape: %s %.300s", res.Status, body)
		}
		return d
	}
	for range 3 {
		scrape() // warm up the connections and the statements' classification
	}
	paced := func(into *[]time.Duration) {
		tick := time.NewTicker(scrapeEvery)
		defer tick.Stop()
		for range scrapes {
			*into = append(*into, scrape())
			<-tick.C
		}
	}
	var l pageLoad
	for range rounds {
		paced(&l.idle)
		answered := atomic.LoadInt64(&l.ok) + atomic.LoadInt64(&l.busy) + atomic.LoadInt64(&l.fail)
		ctx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var started sync.WaitGroup
		started.Add(clients)
		for i := range clients {
			target := "/status.json"
			if i%2 == 1 {
				target = fmt.Sprintf("/status.json?service=service-%d&page=%d", i%benchdata.Services, 1+i/benchdata.Services)
			}
			wg.Go(func() {
				first := true
				for ctx.Err() == nil {
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+target, nil)
					if first {
						started.Done()
						first = false
					}
					res, err := client.Do(req)
					if err != nil {
						if ctx.Err() == nil {
							atomic.AddInt64(&l.fail, 1)
						}
						continue
					}
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
					switch res.StatusCode {
					case http.StatusOK:
						atomic.AddInt64(&l.ok, 1)
					case http.StatusTooManyRequests:
						atomic.AddInt64(&l.busy, 1)
						wait, _ := strconv.Atoi(res.Header.Get("Retry-After"))
						select {
						case <-ctx.Done():
						case <-time.After(time.Duration(max(wait, 1)) * time.Second):
						}
					default:
						atomic.AddInt64(&l.fail, 1)
					}
				}
			})
		}
		started.Wait()
		for atomic.LoadInt64(&l.ok)+atomic.LoadInt64(&l.busy)+atomic.LoadInt64(&l.fail) <= answered {
			time.Sleep(10 * time.Millisecond) // until the page answers: the load is under way
		}
		paced(&l.loaded)
		stop()
		wg.Wait()
	}
	return l
}

// Scrapes keep their latency whatever people do on the status page: with 100 clients
// requesting /status.json without pause, the median scrape stays within a few times the
// idle one (it was a 4 s median when every page request took a pool connection). The
// bound is generous on purpose; BenchmarkScrapeUnderStatusPageLoad measures it.
func TestScrapeLatencyUnderStatusPageLoad(t *testing.T) {
	data := benchdata.BuildScale(t, benchdata.At(2000))
	p := startExporter(t, []string{"DATA_SOURCE_NAME=" + data.DSN}, "--no-agent")
	p.waitFor(t, `(?m)^pg_liveness_up 1$`, 60*time.Second)
	l := measurePageLoad(t, p.addr, 100, 3, 10)
	t.Logf("scrape median idle %s, under page load %s (%.1fx); page answers: %d ok, %d busy (429), %d failed",
		median(l.idle), median(l.loaded), l.ratio(), l.ok, l.busy, l.fail)
	if r := l.ratio(); r > 5 {
		t.Errorf("the median scrape is %.1f times slower under status-page load", r)
	}
	if l.ok == 0 || l.fail > 0 {
		t.Errorf("page answers: %d ok, %d failed; want some served and none failed", l.ok, l.fail)
	}
}

// BenchmarkScrapeUnderStatusPageLoad runs the real binary (without the race detector)
// at the scrape budget's scale and reports the median scrape idle and under 100
// concurrent status-page clients, taken side by side, and their ratio.
func BenchmarkScrapeUnderStatusPageLoad(b *testing.B) {
	bin := buildForBenchmark(b)
	p := startBinary(b, bin, []string{"DATA_SOURCE_NAME=" + benchdata.Build(b)}, "--no-agent")
	p.waitFor(b, `(?m)^pg_liveness_up 1$`, 60*time.Second)
	b.ResetTimer()
	l := measurePageLoad(b, p.addr, 100, max(b.N, 3), 10)
	b.StopTimer()
	b.ReportMetric(float64(median(l.idle).Microseconds())/1000, "ms-idle-median")
	b.ReportMetric(float64(median(l.loaded).Microseconds())/1000, "ms-loaded-median")
	b.ReportMetric(l.ratio(), "loaded/idle")
	b.ReportMetric(float64(l.ok), "pages-ok")
	b.ReportMetric(float64(l.busy), "pages-429")
}
