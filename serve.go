package main

// Serving: the web flags' checks, the listeners (bound before anything starts, so that a
// port in use is a configuration error), the handlers (/metrics, /status, /status.json
// and the landing page) and the HTTP server under the exporter-toolkit's configuration.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"

	"github.com/pg-liveness/pg_liveness_exporter/collector"
	"github.com/pg-liveness/pg_liveness_exporter/internal/probe"
	statuspage "github.com/pg-liveness/pg_liveness_exporter/internal/status"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/targets"
	"github.com/pg-liveness/pg_liveness_exporter/internal/webconfig"
)

// loadWeb checks --web.telemetry-path and loads --web.config.file (nil without it).
func loadWeb(c *config) (*webconfig.Served, error) {
	if err := validateTelemetryPath(c.telemetryPath); err != nil {
		return nil, fmt.Errorf("--web.telemetry-path %q: %w", c.telemetryPath, err)
	}
	if c.telemetryPath == "/status" || c.telemetryPath == "/status.json" {
		return nil, fmt.Errorf("--web.telemetry-path %q is the status page's path", c.telemetryPath)
	}
	if c.configFile != "" && (c.telemetryPath == "/probe" || c.telemetryPath == "/targets" || strings.HasPrefix(c.telemetryPath, "/targets/")) {
		return nil, fmt.Errorf("--web.telemetry-path %q is a path of --config.file's targets (/probe, /targets)", c.telemetryPath)
	}
	if *c.web.WebConfigFile == "" {
		return nil, nil
	}
	served, err := webconfig.Load(*c.web.WebConfigFile)
	if err != nil {
		return nil, fmt.Errorf("--web.config.file %w", err)
	}
	return served, nil
}

// validateTelemetryPath accepts what http.ServeMux takes as a path pattern.
func validateTelemetryPath(p string) (err error) {
	if !strings.HasPrefix(p, "/") {
		return errors.New(`must start with "/"`)
	}
	if strings.ContainsAny(p, " \t\n{}?#") {
		return errors.New("must be a plain path without spaces, braces, ? or #")
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("not a valid path: %v", r)
		}
	}()
	http.NewServeMux().Handle(p, http.NotFoundHandler())
	return nil
}

// listen binds every --web.listen-address. It returns no listeners for systemd socket
// activation and vsock addresses, which the toolkit opens itself.
func listen(f *web.FlagConfig) ([]net.Listener, error) {
	if f.WebSystemdSocket != nil && *f.WebSystemdSocket {
		return nil, nil
	}
	for _, a := range *f.WebListenAddresses {
		if strings.HasPrefix(a, "vsock://") {
			return nil, nil
		}
	}
	var ls []net.Listener
	for _, a := range *f.WebListenAddresses {
		l, err := net.Listen("tcp", a)
		if err != nil {
			closeAll(ls)
			return nil, fmt.Errorf("--web.listen-address %q: %w", a, err)
		}
		ls = append(ls, l)
	}
	return ls, nil
}

func closeAll(ls []net.Listener) {
	for _, l := range ls {
		_ = l.Close()
	}
}

// newHandler builds the collectors and the status page on the one source, and the mux
// that serves them with the landing page.
func newHandler(c *config, w *wired, agent collector.AgentSource, logger *slog.Logger) (*http.ServeMux, error) {
	var status store.StatusSource
	if w.source.Kind() != store.SourceWhizbang { // a Whizbang database has no schema of ours to report on
		status = w.status
	}
	c.collectors.Status, c.collectors.Source = status, w.source
	exporter, err := collector.New(c.collectors, w.pool, agent, logger.With("component", "collector"))
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		versioncollector.NewCollector(exporterName), w.reloads)
	// The status page reads the source the collectors read.
	var node statuspage.NodeAgentSource // a nil interface without a node agent, never a nil *NodeAgent
	if w.nodeAgent != nil {
		node = w.nodeAgent
	}
	page, err := statuspage.New(statuspage.Config{DB: w.pool, Source: w.source, Agent: agent, NodeAgent: node, Status: status,
		Logger: logger.With("component", "status")})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	if w.discover != nil { // and every database discovery finds, each with its database label, under --discover.max-series
		mux.Handle(c.telemetryPath, w.discover.Handler(reg, exporter))
	} else {
		mux.Handle(c.telemetryPath, exporter.Handler(reg))
	}
	mux.Handle("/status", page)
	mux.Handle("/status.json", page)
	links := []web.LandingLinks{{Address: c.telemetryPath, Text: "Metrics"}, {Address: "/status", Text: "Status"}}
	if w.targets != nil {
		if err := addProbeRoutes(mux, reg, c, w, w.database, logger); err != nil {
			return nil, err
		}
		links = append(links, web.LandingLinks{Address: "/targets", Text: "Probe targets"})
	}
	return mux, addLanding(mux, c, links)
}

// newProbeOnlyHandler is the mux of an exporter with --config.file and no DSN: /probe,
// the targets' pages, and the process's own metrics on /metrics.
func newProbeOnlyHandler(c *config, w *wired, logger *slog.Logger) (*http.ServeMux, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		versioncollector.NewCollector(exporterName), w.reloads)
	mux := http.NewServeMux()
	if w.discover != nil {
		mux.Handle(c.telemetryPath, w.discover.Handler(reg, nil))
	} else {
		mux.Handle(c.telemetryPath, promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	}
	if err := addProbeRoutes(mux, reg, c, w, "", logger); err != nil {
		return nil, err
	}
	mux.Handle("/status", http.RedirectHandler("/targets", http.StatusFound))
	return mux, addLanding(mux, c, []web.LandingLinks{{Address: c.telemetryPath, Text: "Metrics"}, {Address: "/targets", Text: "Probe targets"}})
}

// addLanding serves the landing page on / with links, unless /metrics is there.
func addLanding(mux *http.ServeMux, c *config, links []web.LandingLinks) error {
	if c.telemetryPath == "/" {
		return nil
	}
	landing, err := web.NewLandingPage(web.LandingConfig{
		Name:        exporterName,
		Description: "Liveness, leases and advisory locks of services that coordinate through PostgreSQL",
		Version:     version.Info(),
		Links:       links,
	})
	if err != nil {
		return err
	}
	mux.Handle("/", landing)
	return nil
}

// server is the HTTP server and what it returned once it stopped serving.
type server struct {
	srv    *http.Server
	served chan error
	end    context.CancelFunc // ends the contexts of the requests in flight
}

// serve starts serving mux on the listeners (or those the toolkit opens itself). The
// toolkit reads the web configuration in force, kept in memory, never the operator's
// file: a change of that is checked first (reload.go).
func serve(f *web.FlagConfig, webConfig *webconfig.Served, listeners []net.Listener, mux http.Handler, logger *slog.Logger) *server {
	toolkitFlags := *f
	if webConfig != nil {
		path := webConfig.Path()
		toolkitFlags.WebConfigFile = &path
	}
	requests, end := context.WithCancel(context.Background())
	s := &server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return requests }}, served: make(chan error, 1), end: end}
	go func() {
		if listeners == nil { // systemd socket activation or vsock: the toolkit listens
			s.served <- web.ListenAndServe(s.srv, &toolkitFlags, logger)
			return
		}
		s.served <- web.ServeMultiple(listeners, s.srv, &toolkitFlags, logger)
	}()
	return s
}

// shutdownGrace is how long requests in flight at shutdown may take on their own before
// their contexts end: a scrape or probe waiting on a database that does not answer then
// answers at once with what it has (that database down), instead of at its deadline.
const shutdownGrace = time.Second

// shutdown stops the server: requests in flight get shutdownGrace, then their contexts
// end; the whole takes at most 5 s.
func (s *server) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	end := time.AfterFunc(shutdownGrace, s.end)
	defer end.Stop()
	_ = s.srv.Shutdown(ctx)
	s.end()
}

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
	p, err := probe.New(w.targets, cfg, logger)
	if err != nil {
		return err
	}
	reg.MustRegister(probe.PoolMetrics(w.targets, c.probe.MaxConns), w.discover.Metrics())
	mux.Handle("/probe", p)
	mux.Handle("/targets", targets.ListPage(main, w.targets, w.discover.Listed))
	mux.HandleFunc("/targets/{target}/status", p.StatusPage)
	mux.HandleFunc("/targets/{target}/status.json", p.StatusPage)
	// A discovered database's page has one path segment more than a target's (a target's
	// name holds no '/'), so the two never meet, whatever the names.
	mux.HandleFunc("/targets/{entry}/{database}/status", w.discover.StatusPage)
	mux.HandleFunc("/targets/{entry}/{database}/status.json", w.discover.StatusPage)
	return nil
}
