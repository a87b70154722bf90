package exposition

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// hostile are label values that the text format must escape, or that look like its syntax.
var hostile = []string{
	"",
	`a "quoted" value`,
	`back\slash`,
	`trailing backslash\`,
	`\"`,
	`\\n is no newline`,
	"line\nbreak\n",
	`} 1` + "\n" + `fake_metric{x="y"} 2`,
	`a="b",c="d"`,
	"ünïcödé, 日本語, 🙂, \uFFFD",
	"tab\tand\rcarriage return",
	" spaces ",
}

// nativeHistogram is a client_golang histogram with classic and native buckets after
// observing values, as Write fills its dto: what a caller passes to AddHistogram.
func nativeHistogram(t *testing.T, values ...float64) *dto.Histogram {
	t.Helper()
	h := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:                         "h",
		Help:                         "H.",
		Buckets:                      []float64{0.1, 1, 10},
		NativeHistogramBucketFactor:  1.1,
		NativeHistogramZeroThreshold: 0.001,
	})
	for _, v := range values {
		h.Observe(v)
	}
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.Histogram
}

// decodeProto reads a delimited protobuf exposition.
func decodeProto(t *testing.T, b []byte) []*dto.MetricFamily {
	t.Helper()
	dec := expfmt.NewDecoder(bytes.NewReader(b), expfmt.NewFormat(expfmt.TypeProtoDelim))
	var mfs []*dto.MetricFamily
	for {
		mf := &dto.MetricFamily{}
		if err := dec.Decode(mf); errors.Is(err, io.EOF) {
			return mfs
		} else if err != nil {
			t.Fatalf("decoding the protobuf answer: %v", err)
		}
		mfs = append(mfs, mf)
	}
}

// labelKey is a metric's labels, sorted by name, as one string.
func labelKey(m *dto.Metric) string {
	var pairs []string
	for _, lp := range m.GetLabel() {
		pairs = append(pairs, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
	}
	slices.Sort(pairs)
	return "{" + strings.Join(pairs, ",") + "}"
}

func sameFloat(a, b float64) bool { return a == b || math.IsNaN(a) && math.IsNaN(b) }

// The protobuf answer and the text answer of the same builders and registry agree on
// every family (name, type, help) and every sample (labels and value; a histogram's
// count, sum and classic buckets), families sorted by name, each once: the builders'
// merged by name, the registry's among them.
func TestWriteProtoAgreesWithText(t *testing.T) {
	g := NewFamily("b_gauge", "A gauge, \"quoted\" \\ help\nover two lines.", Gauge, "zeta", "alpha")
	c := NewFamily("a_total", "A counter.", Counter, "statement")
	plain := NewFamily("c_plain", "No labels.", Gauge)
	hist := NewFamily("d_seconds", "A histogram.", Histogram, "op")
	classic := NewFamily("e_classic", "A classic histogram with its +Inf bucket.", Histogram)
	float := NewFamily("e_float", "A float histogram: its counts are floats.", Histogram)
	NewFamily("f_empty", "Never added to: left out.", Gauge, "l")

	var b1, b2 Builder
	b1.Add(g, 1, "z1", "a1")
	b1.Add(g, math.NaN(), "z2", "a2")
	b1.Add(c, 42, "heartbeat")
	b1.Add(plain, 7)
	b1.AddHistogram(hist, nativeHistogram(t, 0.05, 0.5, 0.5, 3, 20), "read")
	b1.AddHistogram(classic, &dto.Histogram{
		SampleCount: new(uint64(3)), SampleSum: new(2.5),
		Bucket: []*dto.Bucket{
			{UpperBound: new(1.0), CumulativeCount: new(uint64(2))},
			{UpperBound: new(math.Inf(1)), CumulativeCount: new(uint64(3))},
		},
	})
	b1.AddHistogram(float, &dto.Histogram{
		SampleCountFloat: new(2.5), SampleSum: new(4.0),
		Bucket: []*dto.Bucket{{UpperBound: new(1.0), CumulativeCountFloat: new(1.5)}},
	})
	b2.SetLabel("database", `s1/or"ders`)
	b2.Add(g, math.Inf(1), "z1", "a1") // the same family as b1's, another series
	b2.Add(g, -0.5, "", "ünï\ncode")
	b2.Add(c, 1e-9, "renew")
	b2.Add(plain, math.Inf(-1))
	b2.AddHistogram(hist, nativeHistogram(t), "write") // nothing observed
	b2.AddHistogram(hist, nativeHistogram(t, -1, 0, 1e6), "sync")

	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "c_registry", Help: "From a registry."},
		func() float64 { return 3 }))
	extra, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}

	var text bytes.Buffer
	if err := Write(&text, &b1, &b2); err != nil {
		t.Fatal(err)
	}
	for _, mf := range extra {
		if _, err := expfmt.MetricFamilyToText(&text, mf); err != nil {
			t.Fatal(err)
		}
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	want, err := parser.TextToMetricFamilies(bytes.NewReader(text.Bytes()))
	if err != nil {
		t.Fatalf("the text answer does not parse: %v\n%s", err, text.String())
	}

	var pb bytes.Buffer
	if err := WriteProto(&pb, extra, &b1, &b2); err != nil {
		t.Fatal(err)
	}
	got := decodeProto(t, pb.Bytes())
	var names []string
	for _, mf := range got {
		names = append(names, mf.GetName())
	}
	if wantNames := []string{"a_total", "b_gauge", "c_plain", "c_registry", "d_seconds", "e_classic", "e_float"}; !slices.Equal(names, wantNames) {
		t.Fatalf("protobuf families %v, want %v: sorted by name, each once, none empty", names, wantNames)
	}
	samples := 0
	for _, mf := range got {
		w := want[mf.GetName()]
		if w == nil || mf.GetType() != w.GetType() || mf.GetHelp() != w.GetHelp() {
			t.Errorf("family %s: %v %q in protobuf, %v %q in text", mf.GetName(), mf.GetType(), mf.GetHelp(), w.GetType(), w.GetHelp())
			continue
		}
		if len(mf.GetMetric()) != len(w.GetMetric()) {
			t.Errorf("family %s: %d samples in protobuf, %d in text", mf.GetName(), len(mf.GetMetric()), len(w.GetMetric()))
		}
		byLabels := map[string]*dto.Metric{}
		for _, m := range w.GetMetric() {
			byLabels[labelKey(m)] = m
		}
		for _, m := range mf.GetMetric() {
			samples++
			key := labelKey(m)
			wm := byLabels[key]
			if wm == nil {
				t.Errorf("%s%s: in protobuf, not in text", mf.GetName(), key)
				continue
			}
			if !slices.IsSortedFunc(m.GetLabel(), func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) }) {
				t.Errorf("%s%s: labels not sorted by name, as client_golang sorts them", mf.GetName(), key)
			}
			switch mf.GetType() {
			case dto.MetricType_GAUGE:
				if !sameFloat(m.GetGauge().GetValue(), wm.GetGauge().GetValue()) {
					t.Errorf("%s%s = %v in protobuf, %v in text", mf.GetName(), key, m.GetGauge().GetValue(), wm.GetGauge().GetValue())
				}
			case dto.MetricType_COUNTER:
				if !sameFloat(m.GetCounter().GetValue(), wm.GetCounter().GetValue()) {
					t.Errorf("%s%s = %v in protobuf, %v in text", mf.GetName(), key, m.GetCounter().GetValue(), wm.GetCounter().GetValue())
				}
			case dto.MetricType_HISTOGRAM:
				if diff := classicDiff(m.GetHistogram(), wm.GetHistogram()); diff != "" {
					t.Errorf("%s%s: %s", mf.GetName(), key, diff)
				}
			default:
				t.Errorf("%s: type %v", mf.GetName(), mf.GetType())
			}
		}
	}
	if samples != 14 {
		t.Errorf("%d samples in protobuf, want 14", samples)
	}
}

// classicDiff compares the classic part of a protobuf histogram with the text parser's
// reading of the same histogram, which has the +Inf bucket that client_golang leaves out
// (and float counts where the protobuf one may have integers).
func classicDiff(pb, text *dto.Histogram) string {
	count := func(f float64, n uint64) float64 {
		if f != 0 {
			return f
		}
		return float64(n)
	}
	pn, tn := count(pb.GetSampleCountFloat(), pb.GetSampleCount()), count(text.GetSampleCountFloat(), text.GetSampleCount())
	if pn != tn || !sameFloat(pb.GetSampleSum(), text.GetSampleSum()) {
		return fmt.Sprintf("count %v sum %v in protobuf, count %v sum %v in text", pn, pb.GetSampleSum(), tn, text.GetSampleSum())
	}
	bucketString := func(h *dto.Histogram, n float64) string {
		var s []string
		for _, b := range h.GetBucket() {
			c := count(b.GetCumulativeCountFloat(), b.GetCumulativeCount())
			if !math.IsInf(b.GetUpperBound(), 1) {
				s = append(s, fmt.Sprintf("%v:%v", b.GetUpperBound(), c))
			} else if c != n {
				s = append(s, fmt.Sprintf("+Inf bucket %v, count %v", c, n))
			}
		}
		return strings.Join(s, " ")
	}
	if p, x := bucketString(pb, pn), bucketString(text, tn); p != x {
		return fmt.Sprintf("buckets %s in protobuf, %s in text", p, x)
	}
	return ""
}

// A histogram's native part (schema, zero bucket, spans and deltas on both sides) is in
// the protobuf answer as client_golang wrote it: Prometheus ingests it as a native
// histogram.
func TestWriteProtoKeepsNativeHistograms(t *testing.T) {
	f := NewFamily("latency_seconds", "Latency.", Histogram, "op")
	h := nativeHistogram(t, -3, -0.2, 0, 0.0005, 0.05, 0.5, 0.5, 3, 20, 1e6)
	if h.GetSchema() == 0 || len(h.GetPositiveSpan()) == 0 || len(h.GetNegativeSpan()) == 0 || h.GetZeroCount() != 2 {
		t.Fatalf("client_golang's histogram lacks native buckets: %v", h)
	}
	var b Builder
	b.SetLabel("database", "db1")
	b.AddHistogram(f, h, "read")
	var pb bytes.Buffer
	if err := WriteProto(&pb, nil, &b); err != nil {
		t.Fatal(err)
	}
	mfs := decodeProto(t, pb.Bytes())
	if len(mfs) != 1 || len(mfs[0].GetMetric()) != 1 || mfs[0].GetType() != dto.MetricType_HISTOGRAM {
		t.Fatalf("want one histogram family of one histogram, got %v", mfs)
	}
	got := mfs[0].GetMetric()[0].GetHistogram()
	spans := func(ss []*dto.BucketSpan) string {
		var s []string
		for _, sp := range ss {
			s = append(s, fmt.Sprintf("%d+%d", sp.GetOffset(), sp.GetLength()))
		}
		return strings.Join(s, " ")
	}
	for _, c := range []struct {
		field     string
		got, want any
	}{
		{"schema", got.GetSchema(), h.GetSchema()},
		{"zero threshold", got.GetZeroThreshold(), h.GetZeroThreshold()},
		{"zero count", got.GetZeroCount(), h.GetZeroCount()},
		{"positive spans", spans(got.GetPositiveSpan()), spans(h.GetPositiveSpan())},
		{"positive deltas", fmt.Sprint(got.GetPositiveDelta()), fmt.Sprint(h.GetPositiveDelta())},
		{"negative spans", spans(got.GetNegativeSpan()), spans(h.GetNegativeSpan())},
		{"negative deltas", fmt.Sprint(got.GetNegativeDelta()), fmt.Sprint(h.GetNegativeDelta())},
		{"count", got.GetSampleCount(), h.GetSampleCount()},
		{"sum", got.GetSampleSum(), h.GetSampleSum()},
		{"created", got.GetCreatedTimestamp().AsTime(), h.GetCreatedTimestamp().AsTime()},
		{"classic buckets", classicDiff(got, h), ""},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v in protobuf, %v written by client_golang", c.field, c.got, c.want)
		}
	}
	if k := labelKey(mfs[0].GetMetric()[0]); k != `{database="db1",op="read"}` {
		t.Errorf("labels %s", k)
	}
}

// Label values with any UTF-8, quotes, backslashes and newlines (escaped in the text the
// builders hold) come out of the protobuf answer exactly as they were added, in gauges,
// counters, histograms and SetLabel's label alike.
func TestWriteProtoHostileLabelValues(t *testing.T) {
	g := NewFamily("g", "G.", Gauge, "value", "index")
	c := NewFamily("c_total", "C.", Counter, "value")
	h := NewFamily("h", "H.", Histogram, "value")
	var bs []*Builder
	for i, v := range hostile {
		b := new(Builder)
		b.SetLabel("database", v)
		b.Add(g, float64(i), v, fmt.Sprint(i))
		b.Add(c, float64(i), v)
		b.AddHistogram(h, nativeHistogram(t, float64(i)), v)
		bs = append(bs, b)
	}
	var pb bytes.Buffer
	if err := WriteProto(&pb, nil, bs...); err != nil {
		t.Fatal(err)
	}
	mfs := decodeProto(t, pb.Bytes())
	if len(mfs) != 3 {
		t.Fatalf("%d families, want 3", len(mfs))
	}
	for _, mf := range mfs {
		if len(mf.GetMetric()) != len(hostile) {
			t.Errorf("%s: %d samples, want %d", mf.GetName(), len(mf.GetMetric()), len(hostile))
		}
		for _, m := range mf.GetMetric() {
			i := int(m.GetGauge().GetValue() + m.GetCounter().GetValue() + m.GetHistogram().GetSampleSum())
			if i < 0 || i >= len(hostile) {
				t.Fatalf("%s%s: value %d", mf.GetName(), labelKey(m), i)
			}
			for _, lp := range m.GetLabel() {
				want := hostile[i]
				if lp.GetName() == "index" {
					want = fmt.Sprint(i)
				}
				if lp.GetValue() != want {
					t.Errorf("%s, label %s: %q in protobuf, %q added", mf.GetName(), lp.GetName(), lp.GetValue(), want)
				}
			}
		}
	}
}

// The protobuf format reads the builders' text back: its cost beside the text format's
// (BenchmarkWrite), for the same 1,000 samples.
func BenchmarkWriteProto(b *testing.B) {
	var bld Builder
	bld.SetLabel("database", "db1")
	fams := []*Family{NewFamily("a_total", "A.", Counter, "l"), NewFamily("b", "B.", Gauge, "l")}
	for i := range 500 {
		for _, f := range fams {
			bld.Add(f, float64(i), strconv.Itoa(i))
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := WriteProto(io.Discard, nil, &bld); err != nil {
			b.Fatal(err)
		}
	}
}
