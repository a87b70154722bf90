package collector

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	osexec "os/exec"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/proctest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// The Accept headers of Prometheus' scrapes: 2.x by default and with native histograms
// (--enable-feature=native-histograms), 3.x with scrape_native_histograms.
const (
	acceptPrometheus2       = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
	acceptPrometheus2Native = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
	acceptPrometheus3Native = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.6,application/openmetrics-text;version=1.0.0;escaping=underscores;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=underscores;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)

// The answer's format follows the scraper's preference as promhttp's does: protobuf when
// Prometheus ingests native histograms, OpenMetrics by default, the text format for
// anything else, including protobuf encodings the handler does not write. A header that
// mentions neither OpenMetrics nor protobuf costs no allocation.
func TestNegotiate(t *testing.T) {
	for _, c := range []struct {
		accept string
		want   expfmt.Format
	}{
		{acceptPrometheus2Native, expfmt.FmtProtoDelim},
		{acceptPrometheus3Native, expfmt.FmtProtoDelim},
		{expfmt.ProtoType + ";proto=io.prometheus.client.MetricFamily;encoding=delimited;escaping=allow-utf-8", expfmt.FmtProtoDelim},
		{acceptPrometheus2, expfmt.FmtOpenMetrics_1_0_0},
		{"application/openmetrics-text;version=0.0.1", expfmt.FmtOpenMetrics_0_0_1},
		{"", expfmt.FmtText},
		{"text/plain", expfmt.FmtText},
		{"*/*", expfmt.FmtText},
		{"text/plain;version=0.0.4;q=0.9," + expfmt.ProtoType + ";proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.1", expfmt.FmtText},
		{expfmt.ProtoType + ";proto=io.prometheus.client.MetricFamily;encoding=text", expfmt.FmtText},
		{expfmt.ProtoType + ";proto=io.prometheus.client.MetricFamily", expfmt.FmtText}, // no encoding: not the delimited one
	} {
		h := http.Header{}
		if c.accept != "" {
			h.Set("Accept", c.accept)
		}
		typ, got := negotiate(h)
		if got != c.want || typ != c.want.FormatType() {
			t.Errorf("Accept %q: %v %q, want %q", c.accept, typ, got, c.want)
		}
	}
	h := http.Header{"Accept": {"text/plain;version=0.0.4;q=0.5,*/*;q=0.1"}}
	if n := testing.AllocsPerRun(100, func() { negotiate(h) }); n != 0 {
		t.Errorf("negotiating the text format: %v allocations, want 0", n)
	}
}

// oneHistogram adds one histogram per scrape, as a collector of latencies would.
type oneHistogram struct {
	f *exposition.Family
	h *dto.Histogram
}

func (c oneHistogram) Update(_ context.Context, out *exposition.Builder) error {
	out.AddHistogram(c.f, c.h, "read")
	return nil
}

// promSample is a sample of a Prometheus query's vector: a float's value, or a native
// histogram's.
type promSample struct {
	Metric    map[string]string `json:"metric"`
	Value     []json.RawMessage `json:"value"`     // [time, "value"]
	Histogram []json.RawMessage `json:"histogram"` // [time, {count, sum, buckets}]
}

type promHistogram struct {
	Count   string              `json:"count"`
	Sum     string              `json:"sum"`
	Buckets [][]json.RawMessage `json:"buckets"` // [boundaries, "lower", "upper", "count"]
}

// promQuery runs an instant query through Prometheus' HTTP API.
func promQuery(t *testing.T, p *proctest.Prometheus, q string) []promSample {
	t.Helper()
	req, _ := http.NewRequestWithContext(testutil.Context(t, 10*time.Second), http.MethodGet,
		"http://"+p.Addr+"/api/v1/query?query="+url.QueryEscape(q), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("query %s: %v", q, err)
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []promSample `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || r.Status != "success" {
		t.Fatalf("query %s: %s %v %s", q, resp.Status, err, r.Error)
	}
	return r.Data.Result
}

// value is a float sample's value, NaN for a histogram.
func (s promSample) value(t *testing.T) float64 {
	t.Helper()
	if len(s.Value) != 2 {
		return math.NaN()
	}
	var v string
	if err := json.Unmarshal(s.Value[1], &v); err != nil {
		t.Fatalf("value %s: %v", s.Value[1], err)
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// prometheusVersion is the installed Prometheus' major and minor version.
func prometheusVersion(t *testing.T) (int, int) {
	t.Helper()
	out, err := osexec.Command(proctest.NeedTool(t, "prometheus", "prometheus"), "--version").CombinedOutput()
	m := regexp.MustCompile(`version (\d+)\.(\d+)\.`).FindSubmatch(out)
	if err != nil || m == nil {
		t.Fatalf("prometheus --version: %v\n%s", err, out)
	}
	major, _ := strconv.Atoi(string(m[1]))
	minor, _ := strconv.Atoi(string(m[2]))
	return major, minor
}

// A histogram a collector adds reaches a real Prometheus that ingests native histograms
// as a native histogram: the handler answers its Accept header in the protobuf format,
// native buckets included (Prometheus' query API returns a "histogram" for the series,
// and histogram_count, which reads native histograms only, counts its observations),
// with the gauges of the exporter and of the extra registry beside it. Its classic
// buckets reach Prometheus too: from the same scrapes where the scrape config can keep
// them beside the native histogram (scrape_classic_histograms on 2.45 to 2.x,
// always_scrape_classic_histograms on 3.x); before 2.45, which has no such setting,
// from a second Prometheus that does not ask for native histograms, and so is answered
// in OpenMetrics.
func TestNativeHistogramReachesPrometheus(t *testing.T) {
	t.Parallel()
	major, minor := prometheusVersion(t)
	if major < 2 || major == 2 && minor < 40 {
		t.Fatalf("prometheus %d.%d has no native histograms (2.40 and later)", major, minor)
	}

	observed := []float64{0.05, 0.5, 0.5, 3, 20}
	h := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "test_latency_seconds", Help: "Latency.",
		Buckets:                     []float64{0.1, 1, 10},
		NativeHistogramBucketFactor: 1.1,
	})
	for _, v := range observed {
		h.Observe(v)
	}
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	fam := exposition.NewFamily("test_latency_seconds", "Latency.", exposition.Histogram, "op")
	e := (&Exporter{cfg: DefaultConfig(), logger: discard(), collectors: []*entry{
		{name: "histogram", c: oneHistogram{fam, m.Histogram}},
	}}).Labelled("database", `app/"ördérs"`)
	extra := prometheus.NewRegistry()
	extra.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "extra_gauge", Help: "From the caller's registry."},
		func() float64 { return 7 }))
	srv := httptest.NewServer(e.Handler(extra))
	t.Cleanup(srv.Close)

	job := func(extraSettings map[string]any) map[string]any {
		j := map[string]any{
			"job_name":        "exporter",
			"scrape_interval": "1s",
			"scrape_timeout":  "1s",
			"static_configs":  []any{map[string]any{"targets": []string{srv.Listener.Addr().String()}}},
		}
		maps.Copy(j, extraSettings)
		return j
	}
	var (
		settings = map[string]any{}
		flags    []string
		both     = true // the scrape config keeps the classic buckets beside the native ones
	)
	switch {
	case major == 2 && minor < 45:
		flags, both = []string{"--enable-feature=native-histograms"}, false
	case major == 2:
		flags, settings["scrape_classic_histograms"] = []string{"--enable-feature=native-histograms"}, true
	case major == 3 && minor < 8:
		flags, settings["always_scrape_classic_histograms"] = []string{"--enable-feature=native-histograms"}, true
	default: // the feature flag is gone: a scrape setting
		settings["scrape_native_histograms"], settings["always_scrape_classic_histograms"] = true, true
	}
	native := proctest.StartPrometheus(t, map[string]any{"scrape_configs": []any{job(settings)}}, flags...)
	classic := native
	if !both {
		classic = proctest.StartPrometheus(t, map[string]any{"scrape_configs": []any{job(nil)}})
	}

	// A scrape's samples are committed together: once one is queried, all are there.
	scraped := func(p *proctest.Prometheus) {
		testutil.Eventually(t, 60*time.Second, "a scrape by Prometheus", func() bool { return len(promQuery(t, p, "extra_gauge")) > 0 })
	}
	scraped(native)
	got := promQuery(t, native, "test_latency_seconds")
	if len(got) != 1 || got[0].Histogram == nil {
		t.Fatalf("test_latency_seconds: %+v; want one native histogram", got)
	}
	if l := got[0].Metric; l["database"] != `app/"ördérs"` || l["op"] != "read" {
		t.Errorf("the histogram's labels: %v", l)
	}
	var nh promHistogram
	if len(got[0].Histogram) != 2 || json.Unmarshal(got[0].Histogram[1], &nh) != nil {
		t.Fatalf("histogram %s", got[0].Histogram)
	}
	if nh.Count != strconv.Itoa(len(observed)) || nh.Sum != strconv.FormatFloat(m.Histogram.GetSampleSum(), 'f', -1, 64) {
		t.Errorf("native histogram count %s sum %s; want %d, %v", nh.Count, nh.Sum, len(observed), m.Histogram.GetSampleSum())
	}
	// Native buckets, at most 1.1 wide as asked, one for each value observed.
	var counts []string
	for _, b := range nh.Buckets {
		var lower, upper, count string
		if len(b) != 4 || json.Unmarshal(b[1], &lower) != nil || json.Unmarshal(b[2], &upper) != nil || json.Unmarshal(b[3], &count) != nil {
			t.Fatalf("bucket %s", b)
		}
		lo, _ := strconv.ParseFloat(lower, 64)
		up, _ := strconv.ParseFloat(upper, 64)
		if !(lo > 0 && up/lo <= 1.1) {
			t.Errorf("bucket (%s, %s] is no native bucket of factor 1.1", lower, upper)
		}
		counts = append(counts, count)
	}
	if want := []string{"1", "2", "1", "1"}; !slices.Equal(counts, want) {
		t.Errorf("native buckets' counts %v, want %v", counts, want)
	}
	if c := promQuery(t, native, "histogram_count(test_latency_seconds)"); len(c) != 1 || c[0].value(t) != float64(len(observed)) {
		t.Errorf("histogram_count(test_latency_seconds): %+v; want %d", c, len(observed))
	}
	for q, want := range map[string]float64{
		"extra_gauge": 7,
		`pg_liveness_scrape_collector_success{collector="histogram",database="app/\"ördérs\""}`: 1,
	} {
		if s := promQuery(t, native, q); len(s) != 1 || s[0].value(t) != want {
			t.Errorf("%s: %+v; want %v", q, s, want)
		}
	}

	scraped(classic)
	buckets := map[float64]float64{} // by le, which Prometheus 3 writes 1.0 where 2.x keeps 1
	for _, s := range promQuery(t, classic, "test_latency_seconds_bucket") {
		le, err := strconv.ParseFloat(s.Metric["le"], 64)
		if err != nil {
			t.Fatalf("le %q: %v", s.Metric["le"], err)
		}
		buckets[le] = s.value(t)
	}
	if want := map[float64]float64{0.1: 1, 1: 3, 10: 4, math.Inf(1): 5}; fmt.Sprint(buckets) != fmt.Sprint(want) {
		t.Errorf("classic buckets %v, want %v", buckets, want)
	}
	if c := promQuery(t, classic, "test_latency_seconds_count"); len(c) != 1 || c[0].value(t) != float64(len(observed)) {
		t.Errorf("test_latency_seconds_count: %+v; want %d", c, len(observed))
	}
}
