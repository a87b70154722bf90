package status_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/status"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/benchdata"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/latency"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

// The page's weight limit at the budget's scale.
const maxPageBytes = 300 * 1024

// budgetPool is a pool of two connections, as the exporter's default, on a database at
// the budget's scale (10,000 instances over 20 services, 1,000 leases, 2,000 advisory
// locks over 50 idle backends).
func budgetPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	return pgtest.Pool(tb, benchdata.Build(tb), 2)
}

func serve(tb testing.TB, h http.Handler, target string) string {
	tb.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
	body := rec.Body.String()
	if rec.Code != http.StatusOK || strings.Contains(body, "cannot read") {
		tb.Fatalf("%s: %d %.500s", target, rec.Code, body)
	}
	return body
}

// At the budget's scale every form of the page stays under its weight limit, with full
// pages of instances and leases.
func TestPageWeightAtBudgetScale(t *testing.T) {
	h := newHandler(t, budgetPool(t))
	for _, target := range []string{"/status", "/status?page=100", "/status?service=service-7&lease_page=10", "/status.json"} {
		body := serve(t, h, target)
		t.Logf("%s: %d bytes", target, len(body))
		if len(body) > maxPageBytes {
			t.Errorf("%s weighs %d bytes, more than %d", target, len(body), maxPageBytes)
		}
		n := strings.Count(body, `data-instance=`)
		if strings.HasSuffix(target, ".json") {
			var p status.Page
			if err := json.Unmarshal([]byte(body), &p); err != nil {
				t.Fatal(err)
			}
			n = len(p.Instances.Rows)
			// The budget's data set wrote more history than a page reads: the weight is
			// that of a full read.
			if p.History == nil || p.History.EventsTotal != status.MaxHistoryEvents {
				t.Errorf("%s: history %+v, want a full read of %d events", target, p.History, status.MaxHistoryEvents)
			}
		}
		if n != status.InstancesPerPage {
			t.Errorf("%s shows %d instances, want a full page of %d", target, n, status.InstancesPerPage)
		}
	}
}

// BenchmarkStatusPage renders the page server-side at the budget's scale, reads
// included, and reports the median and 90th percentile and the page's weight. Each
// request goes to a new handler: one handler would answer repeats from its second's
// cache (and refuse them past its rate), which is not what is measured here.
func BenchmarkStatusPage(b *testing.B) {
	pool := budgetPool(b)
	for _, c := range []struct{ name, target string }{
		{"html", "/status"},
		{"html-last-page", "/status?page=100&lease_page=10"},
		{"html-one-service", "/status?service=service-7"},
		{"json", "/status.json"},
	} {
		b.Run(c.name, func(b *testing.B) {
			for range 3 {
				serve(b, newHandler(b, pool), c.target)
			}
			// Not latency.Measure: the new handler's set-up is left out of the times.
			times := make([]time.Duration, 0, b.N)
			size := 0
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				h := newHandler(b, pool)
				t0 := time.Now()
				size = len(serve(b, h, c.target))
				times = append(times, time.Since(t0))
			}
			b.StopTimer()
			latency.Report(b, times)
			b.ReportMetric(float64(size)/1024, "KiB/page")
		})
	}
}
