package exposition

import (
	"bytes"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The Builder writes what client_golang writes for the same metrics: the same header
// lines, labels in name order, the same escaping and the same number formatting.
func TestWriteMatchesClientGolang(t *testing.T) {
	type sample struct {
		v      float64
		values []string
	}
	fams := []struct {
		name, help string
		typ        Type
		labels     []string
		samples    []sample
	}{
		{"b_gauge", "Help with a \\ backslash,\na newline and \"quotes\".", Gauge, []string{"zeta", "alpha"}, []sample{
			{1, []string{"z1", "a1"}},
			{-0.5, []string{`a "quoted" \ value`, "line\nbreak"}},
			{math.Inf(1), []string{"", "ünïcode \uFFFD"}},
			{math.Inf(-1), []string{"x", "y"}},
			{math.NaN(), []string{"n", "a"}},
			{1e-9, []string{"small", "s"}},
			{123456789012, []string{"big", "b"}},
			{0, []string{"zero", "0"}},
			{-1, []string{"minus", "1"}},
		}},
		{"a_total", "A counter.", Counter, []string{"statement"}, []sample{{42, []string{"heartbeat"}}, {0.25, []string{"renew"}}}},
		{"c_plain", "No labels.", Gauge, nil, []sample{{7, nil}}},
		{"d_empty", "Never added to: left out.", Gauge, []string{"l"}, nil},
	}

	reg := prometheus.NewRegistry()
	var ms []prometheus.Metric
	var b Builder
	for _, f := range fams {
		pt := prometheus.GaugeValue
		if f.typ == Counter {
			pt = prometheus.CounterValue
		}
		desc := prometheus.NewDesc(f.name, f.help, f.labels, nil)
		fam := NewFamily(f.name, f.help, f.typ, f.labels...)
		for _, s := range f.samples {
			ms = append(ms, prometheus.MustNewConstMetric(desc, pt, s.v, s.values...))
			b.Add(fam, s.v, s.values...)
		}
	}
	reg.MustRegister(collectorOf(ms))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&want, mf); err != nil {
			t.Fatal(err)
		}
	}
	var got bytes.Buffer
	if err := Write(&got, &b); err != nil {
		t.Fatal(err)
	}
	// client_golang also sorts the samples of a family; the Builder keeps their order.
	if g, w := sortedSamples(got.String()), sortedSamples(want.String()); g != w {
		t.Errorf("written:\n%s\nclient_golang:\n%s", got.String(), want.String())
	}
	if !strings.HasPrefix(got.String(), "# HELP a_total A counter.\n# TYPE a_total counter\na_total{statement=\"heartbeat\"} 42\n") {
		t.Errorf("families not sorted by name, or samples not in the order added:\n%s", got.String())
	}

	// Reset keeps nothing but the buffers.
	b.Reset()
	got.Reset()
	if err := Write(&got, &b); err != nil || got.Len() != 0 {
		t.Errorf("after Reset: %q, %v", got.String(), err)
	}
}

// Builders are merged by family name, each family's header written once, its samples in
// the order of the builders.
func TestWriteMergesBuilders(t *testing.T) {
	f := NewFamily("x", "X.", Gauge, "c")
	g := NewFamily("a", "A.", Gauge)
	var b1, b2 Builder
	b1.Add(f, 1, "one")
	b2.Add(g, 2)
	b2.Add(f, 3, "two")
	var out bytes.Buffer
	if err := Write(&out, &b1, &b2); err != nil {
		t.Fatal(err)
	}
	want := "# HELP a A.\n# TYPE a gauge\na 2\n# HELP x X.\n# TYPE x gauge\nx{c=\"one\"} 1\nx{c=\"two\"} 3\n"
	if out.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
	}
}

func TestAddPanicsOnWrongLabelCount(t *testing.T) {
	defer func() {
		if p := recover(); p == nil || !strings.Contains(p.(string), "x: 1 label values for 2 labels") {
			t.Errorf("panic %v", p)
		}
	}()
	var b Builder
	b.Add(NewFamily("x", "X.", Gauge, "a", "b"), 1, "only one")
}

// sortedSamples sorts the sample lines within each family.
func sortedSamples(text string) string {
	var out, fam []string
	flush := func() {
		slices.Sort(fam)
		out = append(out, fam...)
		fam = nil
	}
	for line := range strings.Lines(text) {
		if strings.HasPrefix(line, "#") {
			flush()
			out = append(out, line)
			continue
		}
		fam = append(fam, line)
	}
	flush()
	return strings.Join(out, "")
}

type collectorOf []prometheus.Metric

func (collectorOf) Describe(chan<- *prometheus.Desc) {}

func (c collectorOf) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c {
		ch <- m
	}
}

// SetLabel's label comes first in every sample, escaped, through Reset, until removed;
// the text format still parses, with the label on every series.
func TestSetLabelAddsALabelToEverySample(t *testing.T) {
	plain := NewFamily("p", "No labels.", Gauge)
	two := NewFamily("t", "Two labels.", Gauge, "b", "a")
	var b Builder
	b.SetLabel("database", `s1/or"ders`)
	b.Add(plain, 1)
	b.Add(two, 2, "vb", "va")
	var out bytes.Buffer
	if err := Write(&out, &b); err != nil {
		t.Fatal(err)
	}
	want := "# HELP p No labels.\n# TYPE p gauge\np{database=\"s1/or\\\"ders\"} 1\n# HELP t Two labels.\n# TYPE t gauge\nt{database=\"s1/or\\\"ders\",a=\"va\",b=\"vb\"} 2\n"
	if out.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", out.String(), want)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	if _, err := parser.TextToMetricFamilies(strings.NewReader(out.String())); err != nil {
		t.Fatalf("does not parse: %v", err)
	}
	b.Reset()
	b.Add(plain, 3)
	b.SetLabel("", "")
	b.Add(two, 4, "x", "y")
	out.Reset()
	if err := Write(&out, &b); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, "p{database=\"s1/or\\\"ders\"} 3\n") || !strings.Contains(s, "t{a=\"y\",b=\"x\"} 4\n") {
		t.Fatalf("after Reset and removing the label:\n%s", s)
	}
}

// WriteOpenMetrics writes what client_golang writes in OpenMetrics for the same
// metrics: a counter's family named without _total, its _created sample after each of
// its samples when its creation time is known, OpenMetrics' escaping of help; a counter
// without a creation time has no _created. Without created (the default, as
// client_golang's promhttp), no _created at all, as client_golang writes without
// WithCreatedLines.
func TestWriteOpenMetricsMatchesClientGolang(t *testing.T) {
	created := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	beats := NewFamily("agent_beats_total", "Beats with \"quotes\", a \\ and\na newline.", Counter, "cadence").CreatedAt(created)
	calls := NewFamily("calls_total", "Calls, read from elsewhere.", Counter, "statement")
	up := NewFamily("up_gauge", "A gauge.", Gauge)
	var b Builder
	b.Add(beats, 3, "fast")
	b.Add(beats, 0.5, `a "quoted" value`)
	b.Add(calls, 7, "heartbeat")
	b.Add(up, 1)

	beatsDesc := prometheus.NewDesc("agent_beats_total", "Beats with \"quotes\", a \\ and\na newline.", []string{"cadence"}, nil)
	callsDesc := prometheus.NewDesc("calls_total", "Calls, read from elsewhere.", []string{"statement"}, nil)
	upDesc := prometheus.NewDesc("up_gauge", "A gauge.", nil, nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectorOf{
		prometheus.MustNewConstMetricWithCreatedTimestamp(beatsDesc, prometheus.CounterValue, 3, created, "fast"),
		prometheus.MustNewConstMetricWithCreatedTimestamp(beatsDesc, prometheus.CounterValue, 0.5, created, `a "quoted" value`),
		prometheus.MustNewConstMetric(callsDesc, prometheus.CounterValue, 7, "heartbeat"),
		prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, 1),
	})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, created := range []bool{true, false} {
		var want bytes.Buffer
		for _, mf := range mfs {
			var opts []expfmt.EncoderOption
			if created {
				opts = append(opts, expfmt.WithCreatedLines())
			}
			if _, err := expfmt.MetricFamilyToOpenMetrics(&want, mf, opts...); err != nil {
				t.Fatal(err)
			}
		}
		var got bytes.Buffer
		if err := WriteOpenMetrics(&got, created, &b); err != nil {
			t.Fatal(err)
		}
		// client_golang writes 7.0 for 7 in OpenMetrics; both are the number 7.
		if g, w := sortedSamples(numbers(t, got.String())), sortedSamples(numbers(t, want.String())); g != w {
			t.Errorf("created %v, written:\n%s\nclient_golang:\n%s", created, got.String(), want.String())
		}
		const line = "agent_beats_total{cadence=\"fast\"} 3\nagent_beats_created{cadence=\"fast\"} 1.772600767e+09\n"
		if strings.Contains(got.String(), line) != created || strings.Contains(got.String(), "_created") != created {
			t.Errorf("created %v: _created lines wrong:\n%s", created, got.String())
		}
	}
}

// The text format costs what it did before OpenMetrics: two allocations a scrape (the
// parts and their sort); OpenMetrics adds its _created lines' buffers.
func BenchmarkWrite(b *testing.B) {
	var bld Builder
	fams := []*Family{NewFamily("a_total", "A.", Counter, "l").CreatedAt(time.Unix(1, 0)), NewFamily("b", "B.", Gauge, "l")}
	for i := range 500 {
		for _, f := range fams {
			bld.Add(f, float64(i), strconv.Itoa(i))
		}
	}
	// Called directly: through a func value the variadic slice would escape.
	b.Run("text", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := Write(io.Discard, &bld); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("openmetrics", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := WriteOpenMetrics(io.Discard, true, &bld); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// numbers rewrites every sample's value as AppendFloat writes it.
func numbers(t *testing.T, text string) string {
	t.Helper()
	var out strings.Builder
	for line := range strings.Lines(text) {
		i := strings.LastIndexByte(line, ' ')
		if strings.HasPrefix(line, "#") || i < 0 {
			out.WriteString(line)
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(line[i+1:]), 64)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		out.WriteString(line[:i+1] + string(AppendFloat(nil, v)) + "\n")
	}
	return out.String()
}
