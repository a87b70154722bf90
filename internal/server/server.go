// Package server is the exporter's HTTP face: the listeners, bound before anything starts
// (so that a port in use is a configuration error), the server under exporter-toolkit's
// web configuration, its shutdown, the landing page and the process's own metrics.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"

	"github.com/pg-liveness/pg_liveness_exporter/internal/webconfig"
)

// Name is the exporter's: the landing page's title, and the namespace of the process's
// own metrics (pg_liveness_exporter_build_info).
const Name = "pg_liveness_exporter"

// ValidPath accepts what http.ServeMux takes as a path pattern (--web.telemetry-path).
func ValidPath(p string) (err error) {
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

// Listen binds every address of f (--web.listen-address); an error names the address. It
// returns no listeners for systemd socket activation and vsock addresses, which the
// toolkit opens itself.
func Listen(f *web.FlagConfig) ([]net.Listener, error) {
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
			CloseAll(ls)
			return nil, fmt.Errorf("%q: %w", a, err)
		}
		ls = append(ls, l)
	}
	return ls, nil
}

// CloseAll closes the listeners.
func CloseAll(ls []net.Listener) {
	for _, l := range ls {
		_ = l.Close()
	}
}

// Registry is the process's own metrics (Go, process, build info) and extra.
func Registry(extra ...prometheus.Collector) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		versioncollector.NewCollector(Name))
	reg.MustRegister(extra...)
	return reg
}

// clashingGoMetric is the Go collector's counter whose OpenMetrics family name (a
// counter's family drops _total) is go_memstats_alloc_bytes, the name of its gauge of
// the bytes in use: two families of one name, which OpenMetrics forbids and its parsers
// refuse (client_golang issue 829, open since 2020).
const clashingGoMetric = "go_memstats_alloc_bytes_total"

// goCollector is client_golang's Go collector without clashingGoMetric, plus the same
// count under the name the runtime/metrics collector gives it, go_gc_heap_allocs_bytes_total
// (/gc/heap/allocs:bytes), whose family name clashes with nothing: the way out the
// client_golang maintainers propose for 829, taken for this one metric, so that every
// other go_memstats_* series stays as dashboards know it.
type goCollector struct {
	prometheus.Collector
	dropped *prometheus.Desc
}

func newGoCollector() prometheus.Collector {
	inner := collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
		collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/allocs:bytes$`)}))
	c := &goCollector{Collector: inner}
	ch := make(chan *prometheus.Desc)
	go func() { inner.Describe(ch); close(ch) }()
	for d := range ch {
		if strings.Contains(d.String(), `fqName: "`+clashingGoMetric+`"`) {
			c.dropped = d
		}
	}
	return c
}

func (c *goCollector) Describe(ch chan<- *prometheus.Desc) {
	inner := make(chan *prometheus.Desc)
	go func() { c.Collector.Describe(inner); close(inner) }()
	for d := range inner {
		if d != c.dropped {
			ch <- d
		}
	}
}

func (c *goCollector) Collect(ch chan<- prometheus.Metric) {
	inner := make(chan prometheus.Metric)
	go func() { c.Collector.Collect(inner); close(inner) }()
	for m := range inner {
		if m.Desc() != c.dropped {
			ch <- m
		}
	}
}

// Landing serves the landing page on / with links, unless metrics (the telemetry path)
// is there.
func Landing(mux *http.ServeMux, metrics string, links []web.LandingLinks) error {
	if metrics == "/" {
		return nil
	}
	landing, err := web.NewLandingPage(web.LandingConfig{
		Name:        Name,
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

// Server is the HTTP server and what it returned once it stopped serving.
type Server struct {
	srv    *http.Server
	served chan error
	end    context.CancelFunc // ends the contexts of the requests in flight
}

// Serve starts serving h on the listeners (or those the toolkit opens itself, for none).
// The toolkit reads the web configuration in force, kept in memory, never the operator's
// file: a change of that is checked first (package reload).
func Serve(f *web.FlagConfig, webConfig *webconfig.Served, listeners []net.Listener, h http.Handler, logger *slog.Logger) *Server {
	toolkitFlags := *f
	if webConfig != nil {
		path := webConfig.Path()
		toolkitFlags.WebConfigFile = &path
	}
	requests, end := context.WithCancel(context.Background())
	s := &Server{srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
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

// Served receives what serving returned, once it stopped: http.ErrServerClosed after
// Shutdown.
func (s *Server) Served() <-chan error { return s.served }

// shutdownGrace is how long requests in flight at shutdown may take on their own before
// their contexts end: a scrape or probe waiting on a database that does not answer then
// answers at once with what it has (that database down), instead of at its deadline.
const shutdownGrace = time.Second

// shutdownTimeout is the longest Shutdown takes.
const shutdownTimeout = 5 * time.Second

// Shutdown stops the server: requests in flight get shutdownGrace, then their contexts
// end; the whole takes at most shutdownTimeout.
func (s *Server) Shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	end := time.AfterFunc(shutdownGrace, s.end)
	defer end.Stop()
	_ = s.srv.Shutdown(ctx)
	s.end()
}
