// Package reload keeps what can change while the exporter runs in step with the files
// on disk: --db.dsn-file (or the DATA_SOURCE_*_FILE files) and --config.file (its
// targets, credentials and discover entries, and the password and DSN files it names),
// --web.config.file and the files it names; and the metrics that say whether the last
// reload of them succeeded (Status). Each is reloaded on SIGHUP, on POST /-/reload (with
// --web.enable-lifecycle, Reloader.Handler) and when one of its files changes on disk,
// Kubernetes' swap of a mounted Secret's ..data link included. Every reload runs in the
// Reloader's one loop, never two at once.
package reload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pg-liveness/pg_liveness_exporter/internal/database"
	"github.com/pg-liveness/pg_liveness_exporter/internal/discovery"
	"github.com/pg-liveness/pg_liveness_exporter/internal/dsn"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/targets"
	"github.com/pg-liveness/pg_liveness_exporter/internal/webconfig"
)

// Config is what a Reloader reloads.
type Config struct {
	// DSN switches the pool's DSN: nil when it is not read from files (--db.dsn, or no
	// pool of the exporter's own: /probe only).
	DSN *database.DSNSwitch
	// DSNFile is --db.dsn-file; "" reads postgres_exporter's DATA_SOURCE_*_FILE
	// variables' files.
	DSNFile string
	// Web is --web.config.file in force; nil without it.
	Web *webconfig.Served
	// TargetsFile is --config.file; "" without it. Targets are its pools, and Discovered
	// its discover entries' databases, which follow the configuration in force.
	TargetsFile string
	Targets     *targets.Pools
	Discovered  *discovery.Databases
	// Status records each reload's outcome, for its metrics.
	Status *Status
	Logger *slog.Logger
}

// Reloader reloads Config's files: on SIGHUP, on /-/reload's requests and when they
// change on disk, in one loop, from Start until Stop.
type Reloader struct {
	cfg      Config
	requests chan chan error // /-/reload's, each answered with the refusals
	done     chan struct{}   // closed once the loop has ended
	stop     context.CancelFunc
}

// New returns the Reloader of cfg; nothing is watched until Start.
func New(cfg Config) *Reloader {
	return &Reloader{cfg: cfg, requests: make(chan chan error), done: make(chan struct{})}
}

// Start takes SIGHUP over (before it returns: from then on the signal never stops the
// process), takes the first look at the files (what is on disk now is in force) and runs
// the loop until ctx ends or Stop.
func (r *Reloader) Start(ctx context.Context) {
	ctx, r.stop = context.WithCancel(ctx)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	files := r.newFileWatch()
	go func() {
		defer close(r.done)
		defer signal.Stop(hup)
		r.loop(ctx, hup, files)
	}()
}

// Stop ends the loop and waits for it; /-/reload then answers 503.
func (r *Reloader) Stop() {
	r.stop()
	<-r.done
}

// loop reloads until ctx ends: on SIGHUP, on /-/reload's requests, and whenever a file it
// reads changes on disk.
func (r *Reloader) loop(ctx context.Context, hup <-chan os.Signal, files *fileWatch) {
	var webPoll <-chan time.Time // nil, never ready, without --web.config.file
	if r.cfg.Web != nil {
		poll := time.NewTicker(webConfigPoll)
		defer poll.Stop()
		webPoll = poll.C
	}
	var filesPoll <-chan time.Time // nil without files to watch
	if files.any() {
		poll := time.NewTicker(filePoll)
		defer poll.Stop()
		filesPoll = poll.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			_ = r.reload("SIGHUP")
		case result := <-r.requests:
			result <- r.reload("/-/reload")
		case <-webPoll:
			_ = reloadWebConfig(r.cfg.Web, r.cfg.Status, false, r.cfg.Logger)
		case <-filesPoll:
			r.poll(files)
		}
	}
}

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

// Status is pg_liveness_exporter_config_last_reload_successful and
// ..._success_timestamp_seconds, as Prometheus and Alertmanager name theirs: successful is
// 0 while the last reload of either file was refused (the previous configuration is in
// force, and the file on disk is not what runs), and the timestamp is when everything on
// disk was last in force (the start-up counts as one).
type Status struct {
	successful, timestamp *prometheus.Desc

	mu          sync.Mutex
	refused     map[string]bool
	lastSuccess time.Time
}

// NewStatus returns the Status of a start-up: every file in force, now.
func NewStatus() *Status {
	return &Status{
		successful: prometheus.NewDesc("pg_liveness_exporter_config_last_reload_successful",
			"1 when the last reload of --web.config.file, --db.dsn-file and --config.file succeeded; 0 while one was refused and the previous configuration stays in force.",
			nil, nil),
		timestamp: prometheus.NewDesc("pg_liveness_exporter_config_last_reload_success_timestamp_seconds",
			"When the files on disk were last all in force: the start-up, or the last reload after which nothing was refused.",
			nil, nil),
		refused:     map[string]bool{},
		lastSuccess: time.Now(),
	}
}

// record notes the outcome of a reload of one source.
func (r *Status) record(source string, err error) {
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

func (r *Status) Describe(ch chan<- *prometheus.Desc) {
	ch <- r.successful
	ch <- r.timestamp
}

func (r *Status) Collect(ch chan<- prometheus.Metric) {
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
func reloadWebConfig(web *webconfig.Served, status *Status, force bool, logger *slog.Logger) error {
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
func (r *Reloader) dsnFiles() []string {
	switch {
	case r.cfg.DSN == nil:
		return nil
	case r.cfg.DSNFile != "":
		return []string{r.cfg.DSNFile}
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
func (r *Reloader) targetFiles() []string {
	if r.cfg.TargetsFile == "" {
		return nil
	}
	return append([]string{r.cfg.TargetsFile}, r.cfg.Targets.Files()...)
}

// newFileWatch takes the first look, at start-up: what is on disk now is in force.
func (r *Reloader) newFileWatch() *fileWatch {
	fw := &fileWatch{}
	fw.dsn.changed(r.dsnFiles())
	fw.targets.changed(r.targetFiles())
	return fw
}

// any reports whether there is a file to watch.
func (fw *fileWatch) any() bool { return len(fw.dsn)+len(fw.targets) > 0 }

// poll reloads each source whose files changed since the last look.
func (r *Reloader) poll(fw *fileWatch) {
	if fw.dsn.changed(r.dsnFiles()) {
		_ = r.reloadDSN("a DSN file changed")
	}
	if fw.targets.changed(r.targetFiles()) {
		if r.reloadTargets("--config.file or a file it names changed") == nil {
			fw.targets.changed(r.targetFiles()) // the files it now names are in force
		}
	}
}

// reload handles SIGHUP and /-/reload (why says which): it re-reads --web.config.file,
// --config.file and the DSN's file, whose DSN the pool's new connections then use
// (credential rotation; the alive lock's direct connection keeps the DSN it started
// with). A file that is refused leaves the previous configuration in force and says so;
// the refusals are returned.
func (r *Reloader) reload(why string) error {
	files, logger := r.dsnFiles(), r.cfg.Logger
	if r.cfg.Web == nil && len(files) == 0 && r.cfg.TargetsFile == "" {
		logger.Info(why + ": nothing to reload without --db.dsn-file, --web.config.file or --config.file")
		return nil
	}
	var errs []error
	if r.cfg.Web != nil {
		errs = append(errs, reloadWebConfig(r.cfg.Web, r.cfg.Status, true, logger))
	}
	if r.cfg.TargetsFile != "" {
		errs = append(errs, r.reloadTargets(why))
	}
	if len(files) > 0 {
		errs = append(errs, r.reloadDSN(why))
	}
	return errors.Join(errs...)
}

// reloadDSN reads the pool's DSN again from its file (or files).
func (r *Reloader) reloadDSN(why string) error {
	source, logger := sourceDSNFile, r.cfg.Logger
	var s string
	var err error
	if r.cfg.DSNFile != "" {
		s, err = dsn.Resolve("", r.cfg.DSNFile, "")
	} else {
		source = sourceDSNEnv
		if s, err = dsn.FromEnvironment(os.Getenv); err == nil && s == "" {
			err = errors.New("the DATA_SOURCE_* variables name no database")
		}
	}
	if err == nil {
		err = r.cfg.DSN.Set(s)
	}
	r.cfg.Status.record(source, err)
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
func (r *Reloader) reloadTargets(why string) error {
	file, logger := r.cfg.TargetsFile, r.cfg.Logger
	cfg, err := targets.Load(file)
	r.cfg.Status.record(sourceTargets, err)
	if err != nil {
		logger.Error(why+": refused --config.file; the previous targets stay in force", "file", file, "err", err)
		return fmt.Errorf("--config.file %s: %w", file, err)
	}
	r.cfg.Targets.Replace(cfg)
	r.cfg.Discovered.Sync() // starts the re-checks for a first entry, stops them with the last
	logger.Info(why+": reloaded --config.file", "file", file, "targets", len(cfg.Names()), "discover_entries", len(cfg.Discover()))
	return nil
}

// Handler serves /-/reload: when enabled (--web.enable-lifecycle) a POST or PUT reloads
// as SIGHUP does, in the loop, and answers 200, or 500 with the refusals; else 403, as
// Prometheus answers. Once the loop has ended, a request does not wait for it: 503.
func (r *Reloader) Handler(enabled bool) http.Handler {
	requests, done := r.requests, r.done
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
