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

// SideBySide measures two ways of doing one thing in the same run: three of each to warm
// up, then b.N pairs, each pair in the other order than the last, so that both see the
// same machine load. It reports both medians, ms-<aName> and ms-<bName>, and their ratio,
// <bName>/<aName>, and returns the medians.
func SideBySide(b *testing.B, aName string, a func() time.Duration, bName string, bOp func() time.Duration) (ma, mb time.Duration) {
	for range 3 {
		a()
		bOp()
	}
	var ta, tb []time.Duration
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			ta, tb = append(ta, a()), append(tb, bOp())
		} else {
			tb, ta = append(tb, bOp()), append(ta, a())
		}
	}
	b.StopTimer()
	slices.Sort(ta)
	slices.Sort(tb)
	ma, mb = ta[len(ta)/2], tb[len(tb)/2]
	b.ReportMetric(float64(ma.Microseconds())/1000, "ms-"+aName)
	b.ReportMetric(float64(mb.Microseconds())/1000, "ms-"+bName)
	b.ReportMetric(float64(mb)/float64(ma), bName+"/"+aName)
	return ma, mb
}
