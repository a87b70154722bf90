// Package latency times a benchmark's operations one by one and reports the median and
// the 90th percentile, as ms-median and ms-p90, the figures docs/performance.md quotes
// for scrapes and pages. Only benchmarks import it.
package latency

import (
	"slices"
	"testing"
	"time"
)

// Measure resets the timer, runs op b.N times, timing each call, stops the timer and
// reports the latencies (Report).
func Measure(b *testing.B, op func()) {
	times := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		op()
		times = append(times, time.Since(t0))
	}
	b.StopTimer()
	Report(b, times)
}

// Report reports the median and the 90th percentile of times, in milliseconds, as
// ms-median and ms-p90. It sorts times.
func Report(b *testing.B, times []time.Duration) {
	if len(times) == 0 {
		b.Fatal("latency.Report: no times")
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "ms-median")
	b.ReportMetric(float64(times[len(times)*9/10].Microseconds())/1000, "ms-p90")
}
