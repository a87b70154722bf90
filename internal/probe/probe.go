// Package probe answers /probe?target=NAME (with repeated &collector=NAME): one
// database of --config.file's targets, answered by the same collectors and data layer as
// /metrics, on that target's own small pool (package targets), following Prometheus'
// multi-target exporter pattern. The scrape's deadline comes from its timeout header, per
// request, so a slow or down target only delays its own answer. It also serves each
// target's status page (/targets/NAME/status and .json), and PoolMetrics are the
// targets' pools' connection gauges.
package probe

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pg-liveness/pg_liveness_exporter/collector"
	statuspage "github.com/pg-liveness/pg_liveness_exporter/internal/status"
	"github.com/pg-liveness/pg_liveness_exporter/internal/targets"
)

// Prober serves /probe and the targets' status pages.
type Prober struct {
	pools      *targets.Pools
	collectors collector.Config // Source set; no Status: a target's schema is not this binary's
	logger     *slog.Logger

	mu    sync.Mutex
	built map[string]*probeTarget
}

// probeTarget is what one target's answers are built from, made on its first probe.
type probeTarget struct {
	pool     *pgxpool.Pool // a replaced pool (the target's DSN changed) rebuilds the rest
	exporter *collector.Exporter
	page     *statuspage.Handler
}

// New returns the Prober of pools' targets, each answered by collectors (Source set;
// Status is dropped: a target's schema is not this binary's). The first target's
// collectors are built now, so that a bad setting is refused at start-up (the error
// names collector.Config's field).
func New(pools *targets.Pools, collectors collector.Config, logger *slog.Logger) (*Prober, error) {
	collectors.Status = nil
	p := &Prober{pools: pools, collectors: collectors, logger: logger, built: map[string]*probeTarget{}}
	// The first target's collectors are built now (its pool does not connect yet), so
	// that a bad collector flag is refused at start-up, not at a target's first probe.
	if names := pools.Config().Names(); len(names) > 0 { // a file of discover entries only has none
		if _, err := p.target(names[0]); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// target returns the named target's collectors and page; nil for an unknown name.
func (p *Prober) target(name string) (*probeTarget, error) {
	pool, ok, err := p.pools.Pool(name)
	if !ok || err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if t := p.built[name]; t != nil && t.pool == pool {
		return t, nil
	}
	logger := p.logger.With("target", name)
	exp, err := collector.New(p.collectors, pool, nil, logger.With("component", "collector"))
	if err != nil {
		return nil, err
	}
	page, err := statuspage.New(statuspage.Config{DB: pool, Source: p.collectors.Source, Logger: logger.With("component", "status")})
	if err != nil {
		return nil, err
	}
	t := &probeTarget{pool: pool, exporter: exp, page: page}
	p.built[name] = t
	return t, nil
}

// probeParams are /probe's query parameters.
var probeParams = []string{"target", "collector"}

func (p *Prober) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		http.Error(w, "the query string is malformed", http.StatusBadRequest)
		return
	}
	for k := range q {
		if k != "target" && k != "collector" {
			http.Error(w, fmt.Sprintf("parameter %.80q: unknown (known: %s)", k, strings.Join(probeParams, ", ")), http.StatusBadRequest)
			return
		}
	}
	names := q["target"]
	if len(names) != 1 || names[0] == "" {
		http.Error(w, "parameter target: give one target name of --config.file", http.StatusBadRequest)
		return
	}
	t, err := p.target(names[0])
	switch {
	case err != nil:
		p.logger.Error("cannot open the target's pool", "target", names[0], "err", err)
		http.Error(w, "cannot open the target's pool; the log says why", http.StatusInternalServerError)
		return
	case t == nil:
		http.Error(w, fmt.Sprintf("parameter target: %.80q is no target of --config.file", names[0]), http.StatusBadRequest)
		return
	}
	exp, err := t.exporter.Only(q["collector"]...)
	if err != nil {
		http.Error(w, "parameter collector: "+err.Error(), http.StatusBadRequest)
		return
	}
	exp.Handler(nil).ServeHTTP(w, r)
}

// StatusPage serves /targets/{target}/status and /targets/{target}/status.json: the
// target's status page, the same page as /status.
func (p *Prober) StatusPage(w http.ResponseWriter, r *http.Request) {
	t, err := p.target(r.PathValue("target"))
	switch {
	case err != nil:
		p.logger.Error("cannot open the target's pool", "target", r.PathValue("target"), "err", err)
		http.Error(w, "cannot open the target's pool; the log says why", http.StatusInternalServerError)
	case t == nil:
		http.Error(w, fmt.Sprintf("%.80q is no target of --config.file (/targets lists them)", r.PathValue("target")), http.StatusNotFound)
	default:
		t.page.ServeHTTP(w, r)
	}
}

// PoolMetrics are pg_liveness_exporter_probe_connections, what pools hold, and _max, the
// cap on them (max, --probe.max-conns).
func PoolMetrics(pools *targets.Pools, max int) prometheus.Collector {
	return newPoolMetrics(pools, max)
}

// poolMetrics are PoolMetrics.
type poolMetrics struct {
	pools     *targets.Pools
	max       int
	conns, mx *prometheus.Desc
}

func newPoolMetrics(pools *targets.Pools, max int) *poolMetrics {
	return &poolMetrics{pools: pools, max: max,
		conns: prometheus.NewDesc("pg_liveness_exporter_probe_connections", "Connections the /probe targets' pools hold together.", nil, nil),
		mx:    prometheus.NewDesc("pg_liveness_exporter_probe_connections_max", "The cap on them, --probe.max-conns.", nil, nil)}
}

func (m *poolMetrics) Describe(ch chan<- *prometheus.Desc) { ch <- m.conns; ch <- m.mx }

func (m *poolMetrics) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(m.conns, prometheus.GaugeValue, float64(m.pools.Conns()))
	ch <- prometheus.MustNewConstMetric(m.mx, prometheus.GaugeValue, float64(m.max))
}
