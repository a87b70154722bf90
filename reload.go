package main

// What can change while the exporter runs: --db.dsn-file and --config.file (its targets,
// credentials and discover entries) on SIGHUP, --web.config.file (on SIGHUP, and
// whenever the file or a certificate it names changes), and the metrics that say whether
// the last reload of them succeeded. Every
// reload runs in run's one loop (waitForEnd), never two at once.

import (
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pg-liveness/pg_liveness_exporter/internal/dsn"
	"github.com/pg-liveness/pg_liveness_exporter/internal/targets"
	"github.com/pg-liveness/pg_liveness_exporter/internal/webconfig"
)

// webConfigPoll is how often the web configuration and the files it names are read for
// changes: the toolkit used to pick a change up at the next request, and Kubernetes
// updates a mounted secret without a signal.
const webConfigPoll = time.Second

// Sources of reloads, as the log lines and reloadStatus name them.
const (
	sourceDSNFile   = "--db.dsn-file"
	sourceWebConfig = "--web.config.file"
	sourceTargets   = "--config.file"
)

// reloadStatus is pg_liveness_exporter_config_last_reload_successful and
// ..._success_timestamp_seconds, as Prometheus and Alertmanager name theirs: successful is
// 0 while the last reload of either file was refused (the previous configuration is in
// force, and the file on disk is not what runs), and the timestamp is when everything on
// disk was last in force (the start-up counts as one).
type reloadStatus struct {
	successful, timestamp *prometheus.Desc

	mu          sync.Mutex
	refused     map[string]bool
	lastSuccess time.Time
}

func newReloadStatus() *reloadStatus {
	return &reloadStatus{
		successful: prometheus.NewDesc(exporterName+"_config_last_reload_successful",
			"1 when the last reload of --web.config.file, --db.dsn-file and --config.file succeeded; 0 while one was refused and the previous configuration stays in force.",
			nil, nil),
		timestamp: prometheus.NewDesc(exporterName+"_config_last_reload_success_timestamp_seconds",
			"When the files on disk were last all in force: the start-up, or the last reload after which nothing was refused.",
			nil, nil),
		refused:     map[string]bool{},
		lastSuccess: time.Now(),
	}
}

// record notes the outcome of a reload of one source.
func (r *reloadStatus) record(source string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refused[source] = err != nil
	for _, refused := range r.refused {
		if refused {
			return
		}
	}
	r.lastSuccess = time.Now()
}

func (r *reloadStatus) Describe(ch chan<- *prometheus.Desc) {
	ch <- r.successful
	ch <- r.timestamp
}

func (r *reloadStatus) Collect(ch chan<- prometheus.Metric) {
	r.mu.Lock()
	ok := 1.0
	for _, refused := range r.refused {
		if refused {
			ok = 0
		}
	}
	at := r.lastSuccess
	r.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(r.successful, prometheus.GaugeValue, ok)
	ch <- prometheus.MustNewConstMetric(r.timestamp, prometheus.GaugeValue, float64(at.UnixNano())/1e9)
}

// reloadWebConfig reads --web.config.file again and reports a change, taken or refused,
// in one log line. force (SIGHUP) checks and reports the file even when it is as it was
// at the last look.
func reloadWebConfig(web *webconfig.Served, status *reloadStatus, force bool, logger *slog.Logger) {
	r := web.Reload(force)
	if !r.Attempted {
		return
	}
	status.record(sourceWebConfig, r.Err)
	switch {
	case r.Err != nil:
		logger.Error("refused a change of --web.config.file; the previous configuration stays in force", "err", r.Err)
	case r.Changed && len(r.RestartOnly) > 0:
		logger.Warn("reloaded --web.config.file; some of its changes take effect only at the next restart",
			"file", web.File(), "restart_only", strings.Join(r.RestartOnly, ","))
	case r.Changed:
		logger.Info("reloaded --web.config.file", "file", web.File())
	case force:
		logger.Info("SIGHUP: --web.config.file is unchanged", "file", web.File())
	default:
		logger.Info("--web.config.file is back to the configuration in force", "file", web.File())
	}
}

// reload handles SIGHUP: it re-reads --web.config.file, and --db.dsn-file, whose DSN the
// pool's new connections then use (credential rotation; the alive lock's direct
// connection keeps the DSN it started with). A file that is refused leaves the previous
// configuration in force and says so.
func reload(c *config, w *wired, logger *slog.Logger) {
	if w.web == nil && c.dsnFile == "" && c.configFile == "" {
		logger.Info("SIGHUP: nothing to reload without --db.dsn-file, --web.config.file or --config.file")
		return
	}
	if w.web != nil {
		reloadWebConfig(w.web, w.reloads, true, logger)
	}
	if c.configFile != "" {
		reloadTargets(c, w, logger)
	}
	if c.dsnFile == "" {
		return
	}
	s, err := dsn.Resolve("", c.dsnFile, "")
	if err == nil {
		err = w.dsnSwitch.Set(s)
	}
	w.reloads.record(sourceDSNFile, err)
	if err != nil {
		logger.Error("SIGHUP: keeping the previous DSN", "err", err)
		return
	}
	logger.Info("SIGHUP: reloaded --db.dsn-file; new pool connections use it", "database", dsn.Describe(s))
}

// reloadTargets re-reads --config.file: a file that is refused leaves the targets and
// discover entries in force as they were; one that is taken keeps the pools of targets
// and discovered databases whose DSN is unchanged and closes the others'. Discovery
// follows: an added entry is checked within a second (the first one starts the
// re-checks), a changed one is checked again at once, a removed one's databases go with
// their pools (the last one stops the re-checks' goroutine).
func reloadTargets(c *config, w *wired, logger *slog.Logger) {
	cfg, err := targets.Load(c.configFile)
	w.reloads.record(sourceTargets, err)
	if err != nil {
		logger.Error("SIGHUP: refused --config.file; the previous targets stay in force", "file", c.configFile, "err", err)
		return
	}
	w.targets.Replace(cfg)
	w.discover.sync() // starts the re-checks for a first entry, stops them with the last
	logger.Info("SIGHUP: reloaded --config.file", "file", c.configFile, "targets", len(cfg.Names()), "discover_entries", len(cfg.Discover()))
}
