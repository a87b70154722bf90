package discovery

// What the exporter does with the databases discovery found: /metrics of them all under
// --discover.max-series, the re-checks' goroutine, which a reload starts and stops
// (Sync), each database's status page (/targets/ENTRY/DATNAME/status and .json) and its
// line on /targets, and the gauges that say what the bound dropped and how each discover
// entry's listing went.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pg-liveness/pg_liveness_exporter/collector"
	"github.com/pg-liveness/pg_liveness_exporter/internal/targets"
)

// DefaultMaxSeries is --discover.max-series' default: a server of 100 databases
// (max_databases' default) fits at 2,000 series each. Measured (the cap's test): a
// database of one service and one instance exports about 30 series, each further service
// of one instance about 8 more, so 2,000 is some 250 services. A database at every
// collector's cap (500 services, 500 instances, 500 leases) exports several thousand,
// and 100 of them several hundred thousand: more than one answer should carry, and the
// case the cap is for. A fleet that needs more is one to spread over /probe targets,
// each answer its own scrape.
const DefaultMaxSeries = 200_000

// discoveryLoop is the re-checks' goroutine: running while the configuration in force has
// discover entries, from start until stop.
type discoveryLoop struct {
	mu     sync.Mutex
	parent context.Context // nil before start and after stop
	cancel context.CancelFunc
	done   chan struct{}
}

// Handler serves /metrics: own's answer (nil for none), and every database found now,
// each labelled with its database, all under the one scrape deadline, the discovered
// ones' series under --discover.max-series. extra is gathered with them (the process's
// own metrics).
func (d *Databases) Handler(extra prometheus.Gatherer, own *collector.Exporter) http.Handler {
	list := d.exporters
	if own != nil {
		list = func() []*collector.Exporter { return append([]*collector.Exporter{own}, d.exporters()...) }
	}
	return d.limit.HandlerOf(d.collectors, extra, list, d.logger.With("component", "collector"))
}

// Start runs the re-checks under ctx: now when the configuration has discover entries,
// else from the reload that adds the first.
func (d *Databases) Start(ctx context.Context) {
	d.loop.mu.Lock()
	d.loop.parent = ctx
	d.loop.mu.Unlock()
	d.Sync()
}

// Sync starts the re-checks when the configuration in force has discover entries and
// they are not running, and stops them (forgetting every database found, and closing its
// pool) when it has none. A reload calls it after putting a configuration in force; the
// running loop takes added, changed and removed entries itself (targets.Discovery.Run).
func (d *Databases) Sync() {
	l := &d.loop
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.parent == nil {
		return
	}
	has := len(d.pools.Config().Discover()) > 0
	switch {
	case has && l.cancel == nil:
		ctx, cancel := context.WithCancel(l.parent)
		done := make(chan struct{})
		l.cancel, l.done = cancel, done
		go func() {
			defer close(done)
			d.discovery.Run(ctx)
		}()
		d.logger.Info("discovery started", "entries", len(d.pools.Config().Discover()))
	case !has && l.cancel != nil:
		l.stopLocked()
		d.discovery.Prune()
		d.logger.Info("discovery stopped: --config.file has no discover entries now")
	}
}

// Stop ends the re-checks and waits for their goroutine; a later Sync does nothing.
func (d *Databases) Stop() {
	d.loop.mu.Lock()
	defer d.loop.mu.Unlock()
	d.loop.stopLocked()
	d.loop.parent = nil
}

func (l *discoveryLoop) stopLocked() {
	if l.cancel == nil {
		return
	}
	l.cancel()
	<-l.done
	l.cancel, l.done = nil, nil
}

// page returns the status page of database name of discover entry entry, on the pool its
// scrapes use, and an HTTP status and message naming the path part when there is none.
func (d *Databases) page(entry, name string) (http.Handler, int, string) {
	cfg := d.pools.Config()
	if !slices.ContainsFunc(cfg.Discover(), func(s targets.Server) bool { return s.Name == entry }) {
		if _, ok := cfg.Target(entry); ok {
			return nil, http.StatusNotFound, fmt.Sprintf("%.80q is a target, not a discover entry: its page is /targets/%s/status", entry, entry)
		}
		return nil, http.StatusNotFound, fmt.Sprintf("%.80q is no discover entry of --config.file (/targets lists them)", entry)
	}
	db := targets.Database{Server: entry, Name: name}
	if !slices.Contains(d.discovery.Found(), db) {
		return nil, http.StatusNotFound, fmt.Sprintf("database %.80q is not one that discover entry %q found (/targets lists them)", name, entry)
	}
	d.mu.Lock()
	b, err := d.buildLocked(db)
	d.mu.Unlock()
	if err != nil || b == nil {
		d.logger.Error("cannot open a discovered database's pool or build its page", "database", db.Label(), "err", err)
		return nil, http.StatusServiceUnavailable, "cannot open the database's pool; the log says why"
	}
	return b.page, 0, ""
}

// StatusPage serves /targets/{entry}/{database}/status and .json: a discovered
// database's status page, the same page as /status. The {database} segment is
// targets.Database.StatusPath's.
func (d *Databases) StatusPage(w http.ResponseWriter, r *http.Request) {
	page, code, msg := d.page(r.PathValue("entry"), targets.DatabaseName(r.PathValue("database")))
	if page == nil {
		http.Error(w, msg, code)
		return
	}
	page.ServeHTTP(w, r)
}

// Listed is, for /targets, every database found now, each marked when
// --discover.max-series dropped it in the last /metrics answer, and that bound.
func (d *Databases) Listed() (found []targets.Listed, maxSeries int) {
	o := d.limit.Last()
	dropped := map[string]bool{}
	for _, n := range o.Dropped {
		dropped[n] = true
	}
	for _, db := range d.discovery.Found() {
		found = append(found, targets.Listed{Database: db, Dropped: dropped[db.Label()]})
	}
	return found, o.Max
}

// discoverReasons are pg_liveness_exporter_discover_entry_down_reason's reasons: the
// database's down reasons, and permission (the role may not read pg_database) and error
// (another error of the statement; the log says which).
var discoverReasons = []string{"auth", "connection", "error", "permission", "timeout", "tls", "unavailable"}

// discoverReason is why a discover entry's listing of pg_database failed.
func discoverReason(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && cmp.Or(pgErr.SeverityUnlocalized, pgErr.Severity) == "ERROR" {
		switch pgErr.Code {
		case "42501": // insufficient_privilege
			return "permission"
		case "57014": // query_canceled: statement_timeout
			return "timeout"
		}
		return "error"
	}
	return collector.DownReason(err)
}

// Metrics are --discover.max-series' gauges on /metrics, as the last answer (this one:
// they are gathered after its databases were counted) left them, and each discover
// entry's.
func (d *Databases) Metrics() prometheus.Collector { return newDiscoverMetrics(d) }

// discoverMetrics are Metrics.
type discoverMetrics struct {
	d                                      *Databases
	series, max, droppedSeries, droppedDBs *prometheus.Desc
	entryUp, entryDown                     *prometheus.Desc
}

func newDiscoverMetrics(d *Databases) *discoverMetrics {
	name := func(s string) string { return "pg_liveness_exporter_discover_" + s }
	return &discoverMetrics{d: d,
		series: prometheus.NewDesc(name("series"), "Series of the discovered databases exported whole in this /metrics answer, counted against --discover.max-series.", nil, nil),
		max:    prometheus.NewDesc(name("series_max"), "The cap on them, --discover.max-series.", nil, nil),
		droppedSeries: prometheus.NewDesc(name("series_dropped"),
			"Series of discovered databases left out of this answer by --discover.max-series (each such database still exports pg_liveness_up and its scrape gauges).", nil, nil),
		droppedDBs: prometheus.NewDesc(name("databases_dropped"),
			`Discovered databases not exported whole, by reason: max_series (--discover.max-series: only pg_liveness_up and their scrape gauges), `+
				`max_databases (a discover entry's max_databases: not watched at all).`, []string{"reason"}, nil),
		entryUp: prometheus.NewDesc(name("entry_up"),
			"1 when the discover entry's last listing of its server's databases (pg_database, at start and every interval) succeeded, "+
				"0 when it failed: the databases found before stay as they were.", []string{"entry"}, nil),
		entryDown: prometheus.NewDesc(name("entry_down_reason"),
			"1 for why the discover entry's last listing failed: auth, connection, timeout, tls, unavailable (as pg_liveness_database_down_reason), "+
				"permission (the role may not read pg_database), error (another error; the log says which). All 0 while it succeeds.",
			[]string{"entry", "reason"}, nil)}
}

func (m *discoverMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.series
	ch <- m.max
	ch <- m.droppedSeries
	ch <- m.droppedDBs
	ch <- m.entryUp
	ch <- m.entryDown
}

func (m *discoverMetrics) Collect(ch chan<- prometheus.Metric) {
	o := m.d.limit.Last()
	ch <- prometheus.MustNewConstMetric(m.series, prometheus.GaugeValue, float64(o.Series))
	ch <- prometheus.MustNewConstMetric(m.max, prometheus.GaugeValue, float64(o.Max))
	ch <- prometheus.MustNewConstMetric(m.droppedSeries, prometheus.GaugeValue, float64(o.DroppedSeries))
	ch <- prometheus.MustNewConstMetric(m.droppedDBs, prometheus.GaugeValue, float64(len(o.Dropped)), "max_series")
	ch <- prometheus.MustNewConstMetric(m.droppedDBs, prometheus.GaugeValue, float64(m.d.discovery.LeftOut()), "max_databases")
	for _, e := range m.d.discovery.Entries() {
		reason := ""
		if e.Err != nil {
			reason = discoverReason(e.Err)
		}
		ch <- prometheus.MustNewConstMetric(m.entryUp, prometheus.GaugeValue, boolGauge(e.Err == nil), e.Name)
		for _, r := range discoverReasons {
			ch <- prometheus.MustNewConstMetric(m.entryDown, prometheus.GaugeValue, boolGauge(r == reason), e.Name, r)
		}
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
