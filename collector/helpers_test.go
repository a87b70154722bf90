package collector

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// mustSource is the source cfg describes; the configurations of these tests are valid.
func mustSource(cfg store.SourceConfig) *store.Source {
	src, err := store.NewSource(cfg)
	if err != nil {
		panic(err)
	}
	return src
}

// exporterApp is the application_name of the exporter's pool in these tests.
const exporterApp = "pg_liveness_exporter"

// queryCounter counts the statements a pool sends (the round trips per scrape) and the
// rows they return.
type queryCounter struct{ n, rows atomic.Int64 }

func (q *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	q.n.Add(1)
	return ctx
}

func (q *queryCounter) TraceQueryEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	q.rows.Add(d.CommandTag.RowsAffected())
}

// exporterPool opens the pool an exporter scrapes with, named exporterApp.
func exporterPool(t testing.TB, dsn string, maxConns int32, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.RuntimeParams["application_name"] = exporterApp
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// stoppableDB is a migrated database, with pg_stat_statements, on a server of the test's
// own, which the test may stop and start again.
func stoppableDB(t *testing.T) (*pgtest.Server, *pgtest.DB) {
	t.Helper()
	srv := pgtest.NewServer(t)
	db := pgtest.NewDBOn(t, srv)
	testdb.Migrate(t, db.DSN, "liveness")
	db.Exec(t, `CREATE EXTENSION pg_stat_statements`)
	return srv, db
}

func newExporter(t testing.TB, cfg Config, pool *pgxpool.Pool, agent AgentSource, logger *slog.Logger) *Exporter {
	t.Helper()
	e, err := New(cfg, pool, agent, logger)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// scrapeResponse runs one request through the Handler.
func scrapeResponse(t testing.TB, e *Exporter, timeoutHeader string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	if timeoutHeader != "" {
		req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", timeoutHeader)
	}
	rec := httptest.NewRecorder()
	e.Handler(nil).ServeHTTP(rec, req)
	return rec
}

// scrapeFamilies scrapes through the Handler and parses the text exposition.
func scrapeFamilies(t testing.TB, e *Exporter) map[string]*dto.MetricFamily {
	t.Helper()
	rec := scrapeResponse(t, e, "")
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: status %d: %s", rec.Code, rec.Body.String())
	}
	return parseText(t, rec.Body)
}

// parseText parses a text exposition and fails the test on a series that appears twice,
// which Prometheus would refuse (the exporter writes samples without a registry's
// checks).
func parseText(t testing.TB, r io.Reader) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(r)
	if err != nil {
		t.Fatalf("parse exposition: %v", err)
	}
	for name, mf := range mfs {
		seen := map[string]bool{}
		for _, m := range mf.GetMetric() {
			if l := labelString(m); seen[l] {
				t.Fatalf("series %s%s appears twice", name, l)
			} else {
				seen[l] = true
			}
		}
	}
	return mfs
}

// value returns the sample of name whose labels include want, or NaN when there is none.
func value(mfs map[string]*dto.MetricFamily, name string, want ...string) float64 {
	mf := mfs[name]
	if mf == nil {
		return math.NaN()
	}
	for _, m := range mf.GetMetric() {
		if hasLabels(m, want...) {
			return sampleValue(m)
		}
	}
	return math.NaN()
}

// sample is a sample a scrape must hold: the family, the labels that pick the series (as
// name/value pairs), and its value, or absent for no such series.
type sample struct {
	name   string
	labels []string
	want   float64
}

// absent is the want of a sample whose series must not exist.
var absent = math.NaN()

// checkSamples reports each sample of want that mfs does not hold with that value.
func checkSamples(t testing.TB, mfs map[string]*dto.MetricFamily, want []sample) {
	t.Helper()
	for _, s := range want {
		if v := value(mfs, s.name, s.labels...); v != s.want && !(math.IsNaN(v) && math.IsNaN(s.want)) {
			t.Errorf("%s%v = %v, want %v", s.name, s.labels, v, s.want)
		}
	}
}

func hasLabels(m *dto.Metric, pairs ...string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == pairs[i] && l.GetValue() == pairs[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func sampleValue(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	default:
		return m.GetUntyped().GetValue()
	}
}

func setSample(m *dto.Metric, v float64) {
	switch {
	case m.Gauge != nil:
		m.Gauge.Value = &v
	case m.Counter != nil:
		m.Counter.Value = &v
	default:
		m.Untyped.Value = &v
	}
}

// approx lets a time-dependent sample differ from the expected one: got − want must lie
// in [lo, hi]. labels, as name/value pairs, narrow it to some series.
type approx struct {
	name   string
	lo, hi float64
	labels []string
}

// compareExposition compares the scraped families with the expected exposition exactly,
// except that samples covered by an approx rule must be within its bounds of the
// expected value. HELP texts are not compared (promlint checks they exist).
func compareExposition(t testing.TB, got map[string]*dto.MetricFamily, expected string, rules ...approx) {
	t.Helper()
	want := parseText(t, strings.NewReader(expected))
	var problems []string
	for _, r := range rules {
		gmf, wmf := got[r.name], want[r.name]
		if gmf == nil || wmf == nil {
			continue // the comparison below reports the missing family
		}
		for _, gm := range gmf.GetMetric() {
			if !hasLabels(gm, r.labels...) {
				continue
			}
			for _, wm := range wmf.GetMetric() {
				if !sameLabels(gm, wm) {
					continue
				}
				g, w := sampleValue(gm), sampleValue(wm)
				if d := g - w; d < r.lo || d > r.hi {
					problems = append(problems, fmt.Sprintf("%s%s = %g, want %g within [%+g, %+g]",
						r.name, labelString(gm), g, w, r.lo, r.hi))
				}
				setSample(gm, w)
			}
		}
	}
	if len(problems) > 0 {
		t.Errorf("time-dependent samples out of bounds:\n%s", strings.Join(problems, "\n"))
	}
	var fams []*dto.MetricFamily
	for _, mf := range got {
		mf.Help = new("")
		sortMetrics(mf)
		fams = append(fams, mf)
	}
	sort.Slice(fams, func(i, j int) bool { return fams[i].GetName() < fams[j].GetName() })
	g := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) { return fams, nil })
	if err := promtestutil.GatherAndCompare(g, strings.NewReader(expected)); err != nil {
		t.Errorf("exposition differs:\n%v", err)
	}
}

// sortMetrics orders a family's samples as client_golang does, by their label values in
// the order of the label names, so that they compare with an expected exposition written
// that way; the exporter writes them in the order it finds them.
func sortMetrics(mf *dto.MetricFamily) {
	values := func(m *dto.Metric) []string {
		ls := slices.Clone(m.GetLabel())
		slices.SortFunc(ls, func(a, b *dto.LabelPair) int { return strings.Compare(a.GetName(), b.GetName()) })
		out := make([]string, len(ls))
		for i, l := range ls {
			out[i] = l.GetValue()
		}
		return out
	}
	slices.SortStableFunc(mf.Metric, func(a, b *dto.Metric) int { return slices.Compare(values(a), values(b)) })
}

func sameLabels(a, b *dto.Metric) bool {
	return labelString(a) == labelString(b)
}

func labelString(m *dto.Metric) string {
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	sort.Strings(parts)
	return "{" + strings.Join(parts, ",") + "}"
}

// readTestdata returns a file of testdata/.
func readTestdata(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// timeQuery sends one statement and reads every row it returns, and reports how long that
// took and how many rows came.
func timeQuery(b *testing.B, pool *pgxpool.Pool, sql string, args ...any) (time.Duration, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t0 := time.Now()
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	for rows.Next() {
		n++
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	return time.Since(t0), n
}
