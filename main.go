// Command pg_liveness_exporter exports the liveness of a PostgreSQL-coordinated fleet as
// Prometheus metrics: the state of every instance, every lease, the advisory locks and
// the fleet's statements in pg_stat_statements, with a status page beside /metrics.
// Unless run with --no-agent it also takes part in the fleet as an instance (alive lock,
// adaptive heartbeat, lease-protected reaper), and reports that agent too.
//
// The command only wires: every flag is declared in package cli (internal/cli/flags.go),
// with the one table from the packages' fields to the flags; wire.go builds the parts from them (the pool, the
// agent, the one source, the collectors, the status page, /probe and discovery); this
// file runs them until SIGINT or SIGTERM, reloading what package reload reloads.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/common/promslog"
	"github.com/prometheus/common/version"

	"github.com/pg-liveness/pg_liveness_exporter/internal/cli"
	"github.com/pg-liveness/pg_liveness_exporter/internal/database"
	"github.com/pg-liveness/pg_liveness_exporter/internal/dsn"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/regularfile"
	"github.com/pg-liveness/pg_liveness_exporter/internal/reload"
	"github.com/pg-liveness/pg_liveness_exporter/internal/server"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// Exit codes: 2 for bad flags or configuration (before listening), 1 for failures after.
const (
	exitRuntime = 1
	exitConfig  = 2
)

// gcPercent is the heap growth that starts a collection. The heap is small and mostly
// each scrape's garbage, and scrapes come seconds apart: collecting at half Go's default
// growth costs little CPU and keeps a few MiB less resident. GOGC (and GOMEMLIMIT) in the
// environment still decide.
const gcPercent = 50

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// postgres_exporter's DATA_SOURCE_* variables; the flags' own variables kingpin reads.
	envDSN, err := dsn.FromEnvironment(os.Getenv)
	if err != nil {
		os.Exit(configError(os.Stderr, err))
	}
	os.Exit(run(ctx, os.Args[1:], envDSN, os.Stderr))
}

// newLogger builds the binary's one logger, from --log.level and --log.format. Every line
// passes the redacting handler, so no line can print a password; its parts get it with
// With("component", …) once, from here.
func newLogger(c *cli.Config, w io.Writer) *slog.Logger {
	return logging.Wrap(promslog.New(&promslog.Config{Level: c.Log.Level, Format: c.Log.Format, Writer: w}))
}

// configError prints a configuration error as the one line the operator sees, flags
// named and passwords removed, and returns exitConfig.
func configError(stderr io.Writer, err error) int {
	fmt.Fprintf(stderr, "%s: error: %s\n", server.Name, logging.Redact(cli.FlagError(err).Error()))
	return exitConfig
}

func run(ctx context.Context, args []string, envDSN string, stderr io.Writer) int {
	c, err := cli.Parse(args, stderr)
	if err != nil {
		return configError(stderr, err)
	}
	logger := newLogger(c, stderr)
	// A secret's file accepted although every user may read it (a Kubernetes Secret's
	// default mount) is one warning per read: at start, and on each reload.
	regularfile.SetLogger(logger)
	// Everything that can be wrong with the configuration is found before listening.
	webConfig, err := loadWeb(c)
	if err != nil {
		return configError(stderr, err)
	}
	if webConfig != nil {
		defer webConfig.Close() // after the server's shutdown: the toolkit reads it until then
	}
	w, err := wire(c, envDSN, logger)
	if err != nil {
		return configError(stderr, err)
	}
	defer w.close()
	// Binding the listeners now turns a bad address or a port in use into a
	// configuration error, before anything starts.
	listeners, err := server.Listen(c.Web)
	if err != nil {
		return configError(stderr, fmt.Errorf("--web.listen-address %w", err))
	}
	defer server.CloseAll(listeners)
	logger.Info("starting "+server.Name, "version", version.Info(), "database", w.database, "source", w.source.Kind(),
		"schema", c.Source.Schema, "agent", c.AgentOn)

	var wg sync.WaitGroup
	bg, stopBG := context.WithCancel(ctx)
	defer stopBG()
	// The node agent outlives the agent, which may hold its lock through it: the agent
	// removes its row while its lock is still held.
	var nodeWG sync.WaitGroup
	nodeCtx, stopNode := context.WithCancel(context.WithoutCancel(ctx))
	defer func() { stopNode(); nodeWG.Wait() }()
	nodeFailed := make(chan error, 1)
	if w.nodeAgent != nil {
		nodeWG.Go(func() {
			if err := w.nodeAgent.Run(nodeCtx); err != nil {
				logger.Error("node agent stopped", "err", err)
				nodeFailed <- err
			}
		})
	}
	agentFailed := make(chan error, 1) // the agent gave up for good: exit non-zero
	wg.Go(func() { runAgent(bg, c, w, agentFailed, logger) })
	if w.discover != nil {
		w.discover.Start(bg)    // and a reload starts, or stops, its re-checks
		defer w.discover.Stop() // they end with bg, before the pools close
	}
	rc := reload.Config{DSNFile: c.DSNFile, Web: webConfig, TargetsFile: c.ConfigFile, Targets: w.targets,
		Discovered: w.discover, Status: w.reloads, Logger: logger}
	if c.DSN == "" { // else the DSN is the flag's, and no file to watch
		rc.DSN = w.dsnSwitch
	}
	reloader := reload.New(rc)
	w.mux.Handle("/-/reload", reloader.Handler(c.EnableLifecycle))
	srv := server.Serve(c.Web, webConfig, listeners, w.mux, logger)
	reloader.Start(ctx) // SIGHUP, /-/reload and changes on disk, until the end
	code := waitForEnd(ctx, srv, agentFailed, nodeFailed, logger)
	reloader.Stop()
	stopBG()
	wg.Wait() // the agent releases its leases and removes its row before we go on
	stopNode()
	nodeWG.Wait() // then the node agent lets every lock go
	srv.Shutdown()
	return code
}

// waitForEnd waits until ctx ends (exit 0), or the agent gave up or the server failed
// (exit 1).
func waitForEnd(ctx context.Context, srv *server.Server, agentFailed, nodeFailed <-chan error, logger *slog.Logger) int {
	select {
	case <-ctx.Done():
		logger.Info("shutting down")
		return 0
	case <-agentFailed:
		return exitRuntime
	case <-nodeFailed: // its socket could not be listened on
		return exitRuntime
	case err := <-srv.Served():
		if errors.Is(err, http.ErrServerClosed) {
			return 0
		}
		logger.Error("cannot serve", "err", err)
		return exitRuntime
	}
}

// runAgent prepares the schema and runs the agent until ctx ends. Whatever happens here,
// the exporter keeps serving: an agent that cannot join leaves an observer, and
// pg_liveness_agent_joined says so.
func runAgent(ctx context.Context, c *cli.Config, w *wired, failed chan<- error, logger *slog.Logger) {
	if w.pool == nil { // /probe only: no database of its own
		return
	}
	if w.source.Kind() == store.SourceWhizbang {
		// A Whizbang database is observed as it is: no schema of ours, no agent.
		if err := w.source.CheckTable(ctx, w.pool, 5*time.Second); err != nil && ctx.Err() == nil {
			logger.Error("cannot read the Whizbang source; check --source.whizbang.schema, --source.whizbang.prefix and the role's grants",
				"err", err)
		}
		return
	}
	err := database.PrepareSchema(ctx, w.pool, c.Source.Schema, c.ApplyMigrations, &w.status.Schema, logger.With("component", "schema"))
	if err != nil {
		if ctx.Err() == nil {
			logger.Error("serving as an observer only", "agent", w.agent != nil, "err", err)
		}
		return
	}
	if w.agent == nil {
		return
	}
	w.status.AgentStarted.Store(true)
	if err := w.agent.Run(ctx); err != nil {
		logger.Error("agent shutdown", "err", err)
		if errors.Is(err, liveness.ErrDuplicateInstance) {
			failed <- err
		}
	}
}
