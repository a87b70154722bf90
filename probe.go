package main

// /probe?target=NAME (with repeated &collector=NAME): one database of --config.file's
// targets, answered by the same collectors and data layer as /metrics, on that target's
// own small pool (package targets), following Prometheus' multi-target exporter pattern.
// The scrape's deadline comes from its timeout header, per request, so a slow or down
// target only delays its own answer. Also the list of targets and discovered databases
// (/targets), and each target's status page (/targets/NAME/status and .json; a
// discovered database's is in discover_serve.go), and the --discover.max-series flag.

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

// loadTargets reads --config.file and opens (without connecting) the targets' pools.
func loadTargets(c *config, logger *slog.Logger) (*targets.Pools, error) {
	if c.discoverMaxSeries < 1 {
		return nil, fmt.Errorf("--discover.max-series must be at least 1, got %d", c.discoverMaxSeries)
	}
	cfg, err := targets.Load(c.configFile)
	if err != nil {
		return nil, fmt.Errorf("--config.file %s: %w", c.configFile, err)
	}
	c.probe.ApplicationName, c.probe.Logger = exporterName+":probe", logger.With("component", "database")
	return targets.NewPools(cfg, c.probe) // errors name Options' fields
}

// addProbeRoutes serves /probe, /targets and the targets' status pages on mux, and the
// pools' connection gauges in reg. main describes the --db.dsn database ("" for none).
func addProbeRoutes(mux *http.ServeMux, reg *prometheus.Registry, c *config, w *wired, main string, logger *slog.Logger) error {
	cfg := c.collectors
	cfg.Source = w.source
	p, err := newProber(w.targets, cfg, logger)
	if err != nil {
		return err
	}
	w.prober = p
	reg.MustRegister(newPoolMetrics(w.targets, c.probe.MaxConns), w.discover.Metrics())
	mux.Handle("/probe", p)
	mux.Handle("/targets", targets.ListPage(main, w.targets, w.discover.Listed))
	mux.HandleFunc("/targets/{target}/status", p.statusPage)
	mux.HandleFunc("/targets/{target}/status.json", p.statusPage)
	// A discovered database's page has one path segment more than a target's (a target's
	// name holds no '/'), so the two never meet, whatever the names.
	mux.HandleFunc("/targets/{entry}/{database}/status", w.discover.StatusPage)
	mux.HandleFunc("/targets/{entry}/{database}/status.json", w.discover.StatusPage)
	return nil
}

// prober serves /probe and the targets' status pages.
type prober struct {
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

func newProber(pools *targets.Pools, collectors collector.Config, logger *slog.Logger) (*prober, error) {
	collectors.Status = nil
	p := &prober{pools: pools, collectors: collectors, logger: logger, built: map[string]*probeTarget{}}
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
func (p *prober) target(name string) (*probeTarget, error) {
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

func (p *prober) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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

// statusPage serves /targets/NAME/status and /targets/NAME/status.json: the target's
// status page, the same page as /status.
func (p *prober) statusPage(w http.ResponseWriter, r *http.Request) {
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

// poolMetrics is pg_liveness_exporter_probe_connections and _max on /metrics.
type poolMetrics struct {
	pools     *targets.Pools
	max       int
	conns, mx *prometheus.Desc
}

func newPoolMetrics(pools *targets.Pools, max int) *poolMetrics {
	return &poolMetrics{pools: pools, max: max,
		conns: prometheus.NewDesc(exporterName+"_probe_connections", "Connections the /probe targets' pools hold together.", nil, nil),
		mx:    prometheus.NewDesc(exporterName+"_probe_connections_max", "The cap on them, --probe.max-conns.", nil, nil)}
}

func (m *poolMetrics) Describe(ch chan<- *prometheus.Desc) { ch <- m.conns; ch <- m.mx }

func (m *poolMetrics) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(m.conns, prometheus.GaugeValue, float64(m.pools.Conns()))
	ch <- prometheus.MustNewConstMetric(m.mx, prometheus.GaugeValue, float64(m.max))
}
