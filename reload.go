package main

// What can change while the exporter runs: --db.dsn-file (or the DATA_SOURCE_*_FILE
// files) and --config.file (its targets, credentials and discover entries, and the
// password and DSN files it names), --web.config.file and the files it names; and the
// metrics that say whether the last reload of them succeeded. Each is reloaded on SIGHUP,
// on POST /-/reload (with --web.enable-lifecycle) and when one of its files changes on
// disk, Kubernetes' swap of a mounted Secret's ..data link included. Every reload runs in
// run's one loop (waitForEnd), never two at once.

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pg-liveness/pg_liveness_exporter/internal/dsn"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
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
	sourceDSNEnv    = "DATA_SOURCE_*_FILE"
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
func reloadWebConfig(web *webconfig.Served, status *reloadStatus, force bool, logger *slog.Logger) error {
	r := web.Reload(force)
	if !r.Attempted {
		return nil
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
	return r.Err
}

// filePoll is how often the files the DSN and --config.file are read from are looked at
// (a stat each, not a read) for a change: Kubernetes updates a mounted Secret without a
// signal, by swapping the ..data link of its folder.
const filePoll = 2 * time.Second

// fileStamp is what a change of a file changes, as stat(2) sees it through symbolic
// links: a swapped ..data link gives another inode, a rewrite another size or times, a
// chmod another mode and ctime.
type fileStamp struct {
	dev, ino     uint64
	size         int64
	mtime, ctime syscall.Timespec
	mode         uint32
	missing      bool
}

func stampOf(path string) fileStamp {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileStamp{missing: true}
	}
	return fileStamp{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim, mode: st.Mode}
}

// watched is the stamps of one source's files at the last look.
type watched map[string]fileStamp

// changed looks at paths again and reports whether they differ from the last look (a
// path added or gone counts).
func (w *watched) changed(paths []string) bool {
	now := make(watched, len(paths))
	for _, p := range paths {
		now[p] = stampOf(p)
	}
	differ := !maps.Equal(*w, now)
	*w = now
	return differ
}

// fileWatch looks for changes of the files the DSN and the targets are read from.
type fileWatch struct {
	dsn, targets watched
}

// dsnFiles are the files the pool's DSN is read from: --db.dsn-file, or postgres_exporter's
// DATA_SOURCE_*_FILE variables' files when neither --db.dsn nor --db.dsn-file is given.
func dsnFiles(c *config, w *wired) []string {
	switch {
	case w.dsnSwitch == nil || c.dsn != "":
		return nil
	case c.dsnFile != "":
		return []string{c.dsnFile}
	}
	var out []string
	for _, v := range []string{dsn.EnvURIFile, dsn.EnvUserFile, dsn.EnvPassFile} {
		if f := os.Getenv(v); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// targetFiles are --config.file and the password and DSN files of the targets in force.
func targetFiles(c *config, w *wired) []string {
	if c.configFile == "" {
		return nil
	}
	return append([]string{c.configFile}, w.targets.Files()...)
}

// newFileWatch takes the first look, at start-up: what is on disk now is in force.
func newFileWatch(c *config, w *wired) *fileWatch {
	fw := &fileWatch{}
	fw.dsn.changed(dsnFiles(c, w))
	fw.targets.changed(targetFiles(c, w))
	return fw
}

// any reports whether there is a file to watch.
func (fw *fileWatch) any() bool { return len(fw.dsn)+len(fw.targets) > 0 }

// poll reloads each source whose files changed since the last look.
func (fw *fileWatch) poll(c *config, w *wired, logger *slog.Logger) {
	if fw.dsn.changed(dsnFiles(c, w)) {
		_ = reloadDSN(c, w, "a DSN file changed", logger)
	}
	if fw.targets.changed(targetFiles(c, w)) {
		if reloadTargets(c, w, "--config.file or a file it names changed", logger) == nil {
			fw.targets.changed(targetFiles(c, w)) // the files it now names are in force
		}
	}
}

// reload handles SIGHUP and /-/reload (why says which): it re-reads --web.config.file,
// --config.file and the DSN's file, whose DSN the pool's new connections then use
// (credential rotation; the alive lock's direct connection keeps the DSN it started
// with). A file that is refused leaves the previous configuration in force and says so;
// the refusals are returned.
func reload(c *config, w *wired, why string, logger *slog.Logger) error {
	files := dsnFiles(c, w)
	if w.web == nil && len(files) == 0 && c.configFile == "" {
		logger.Info(why + ": nothing to reload without --db.dsn-file, --web.config.file or --config.file")
		return nil
	}
	var errs []error
	if w.web != nil {
		errs = append(errs, reloadWebConfig(w.web, w.reloads, true, logger))
	}
	if c.configFile != "" {
		errs = append(errs, reloadTargets(c, w, why, logger))
	}
	if len(files) > 0 {
		errs = append(errs, reloadDSN(c, w, why, logger))
	}
	return errors.Join(errs...)
}

// reloadDSN reads the pool's DSN again from its file (or files).
func reloadDSN(c *config, w *wired, why string, logger *slog.Logger) error {
	source := sourceDSNFile
	var s string
	var err error
	if c.dsnFile != "" {
		s, err = dsn.Resolve("", c.dsnFile, "")
	} else {
		source = sourceDSNEnv
		if s, err = dsn.FromEnvironment(os.Getenv); err == nil && s == "" {
			err = errors.New("the DATA_SOURCE_* variables name no database")
		}
	}
	if err == nil {
		err = w.dsnSwitch.Set(s)
	}
	w.reloads.record(source, err)
	if err != nil {
		logger.Error(why+": keeping the previous DSN", "err", err)
		return err
	}
	logger.Info(why+": reloaded "+source+"; new pool connections use it", "database", dsn.Describe(s))
	return nil
}

// reloadTargets re-reads --config.file: a file that is refused leaves the targets and
// discover entries in force as they were; one that is taken keeps the pools of targets
// and discovered databases whose DSN is unchanged and closes the others'. Discovery
// follows: an added entry is checked within a second (the first one starts the
// re-checks), a changed one is checked again at once, a removed one's databases go with
// their pools (the last one stops the re-checks' goroutine).
func reloadTargets(c *config, w *wired, why string, logger *slog.Logger) error {
	cfg, err := targets.Load(c.configFile)
	w.reloads.record(sourceTargets, err)
	if err != nil {
		logger.Error(why+": refused --config.file; the previous targets stay in force", "file", c.configFile, "err", err)
		return fmt.Errorf("--config.file %s: %w", c.configFile, err)
	}
	w.targets.Replace(cfg)
	w.discover.Sync() // starts the re-checks for a first entry, stops them with the last
	logger.Info(why+": reloaded --config.file", "file", c.configFile, "targets", len(cfg.Names()), "discover_entries", len(cfg.Discover()))
	return nil
}

// reloadHandler serves /-/reload: with --web.enable-lifecycle a POST or PUT reloads as
// SIGHUP does, in waitForEnd's loop (requests), and answers 200, or 500 with the
// refusals; without it, 403, as Prometheus answers. done is closed once the loop has
// ended, so that a request then does not wait for it.
func reloadHandler(enabled bool, requests chan<- chan error, done <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if !enabled {
			http.Error(rw, "Lifecycle API is not enabled: start the exporter with --web.enable-lifecycle", http.StatusForbidden)
			return
		}
		if r.Method != http.MethodPost && r.Method != http.MethodPut {
			rw.Header().Set("Allow", "POST, PUT")
			http.Error(rw, "Only POST or PUT requests allowed", http.StatusMethodNotAllowed)
			return
		}
		result := make(chan error, 1)
		select {
		case requests <- result:
		case <-done:
			http.Error(rw, "shutting down", http.StatusServiceUnavailable)
			return
		case <-r.Context().Done():
			return
		}
		select {
		case err := <-result:
			if err != nil {
				http.Error(rw, "failed to reload config: "+logging.Redact(err.Error()), http.StatusInternalServerError)
				return
			}
			fmt.Fprintln(rw, "reloaded")
		case <-done:
			http.Error(rw, "shutting down", http.StatusServiceUnavailable)
		case <-r.Context().Done():
		}
	})
}
