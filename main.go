// Command pg_liveness_exporter exports the liveness of a PostgreSQL-coordinated fleet as
// Prometheus metrics: the state of every instance, every lease, the advisory locks and
// the fleet's statements in pg_stat_statements, with a status page beside /metrics.
// Unless run with --no-agent it also takes part in the fleet as an instance (alive lock,
// adaptive heartbeat, lease-protected reaper), and reports that agent too.
//
// This file wires the flags to the constructors (the pool, the agent, the one source,
// the collectors and the status page) and runs them until SIGINT or SIGTERM. Every flag
// and the table from the packages' fields to them are in flags.go, serving in serve.go,
// and what SIGHUP reloads in reload.go.
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
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/common/version"

	"github.com/pg-liveness/pg_liveness_exporter/collector"
	"github.com/pg-liveness/pg_liveness_exporter/internal/database"
	"github.com/pg-liveness/pg_liveness_exporter/internal/discovery"
	"github.com/pg-liveness/pg_liveness_exporter/internal/dsn"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/targets"
	"github.com/pg-liveness/pg_liveness_exporter/internal/webconfig"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

const exporterName = "pg_liveness_exporter"

// Exit codes: 2 for bad flags or configuration (before listening), 1 for failures after.
const (
	exitRuntime = 1
	exitConfig  = 2
)

func main() {
	// The heap is small and mostly each scrape's garbage, and scrapes come seconds apart:
	// collecting at 50 % growth instead of Go's 100 % costs little CPU and keeps a few MiB
	// less resident. GOGC (and GOMEMLIMIT) in the environment still decide.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(50)
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
func newLogger(c *config, w io.Writer) *slog.Logger {
	return logging.Wrap(promslog.New(&promslog.Config{Level: c.log.Level, Format: c.log.Format, Writer: w}))
}

// configError prints a configuration error as the one line the operator sees, flags
// named and passwords removed, and returns exitConfig.
func configError(stderr io.Writer, err error) int {
	fmt.Fprintf(stderr, "%s: error: %s\n", exporterName, logging.Redact(asFlagError(err).Error()))
	return exitConfig
}

func run(ctx context.Context, args []string, envDSN string, stderr io.Writer) int {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return configError(stderr, err)
	}
	logger := newLogger(c, stderr)
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
	w.web = webConfig
	defer w.close()
	// Binding the listeners now turns a bad address or a port in use into a
	// configuration error, before anything starts.
	listeners, err := listen(c.web)
	if err != nil {
		return configError(stderr, err)
	}
	defer closeAll(listeners)
	logger.Info("starting "+exporterName, "version", version.Info(), "database", w.database, "source", w.source.Kind(),
		"schema", c.source.Schema, "agent", c.agentOn)

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
	reloads, loopDone := make(chan chan error), make(chan struct{})
	w.mux.Handle("/-/reload", reloadHandler(c.enableLifecycle, reloads, loopDone))
	srv := serve(c.web, webConfig, listeners, w.mux, logger)
	code := waitForEnd(ctx, c, w, srv, agentFailed, nodeFailed, reloads, logger)
	close(loopDone)
	stopBG()
	wg.Wait() // the agent releases its leases and removes its row before we go on
	stopNode()
	nodeWG.Wait() // then the node agent lets every lock go
	srv.shutdown()
	return code
}

// waitForEnd runs until ctx ends (exit 0), the agent gave up or the server failed (exit
// 1). Meanwhile it reloads (reload.go): on SIGHUP, which never stops the process, on
// /-/reload's requests, and whenever a file it reads changes on disk.
func waitForEnd(ctx context.Context, c *config, w *wired, srv *server, agentFailed, nodeFailed <-chan error,
	reloads <-chan chan error, logger *slog.Logger) int {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var webPoll <-chan time.Time // nil, never ready, without --web.config.file
	if w.web != nil {
		poll := time.NewTicker(webConfigPoll)
		defer poll.Stop()
		webPoll = poll.C
	}
	files := newFileWatch(c, w)
	var filesPoll <-chan time.Time // nil without files to watch
	if files.any() {
		poll := time.NewTicker(filePoll)
		defer poll.Stop()
		filesPoll = poll.C
	}
	for {
		select {
		case <-ctx.Done():
			logger.Info("shutting down")
			return 0
		case <-hup:
			_ = reload(c, w, "SIGHUP", logger)
		case result := <-reloads:
			result <- reload(c, w, "/-/reload", logger)
		case <-webPoll:
			_ = reloadWebConfig(w.web, w.reloads, false, logger)
		case <-filesPoll:
			files.poll(c, w, logger)
		case <-agentFailed:
			return exitRuntime
		case <-nodeFailed: // its socket could not be listened on
			return exitRuntime
		case err := <-srv.served:
			if errors.Is(err, http.ErrServerClosed) {
				return 0
			}
			logger.Error("cannot serve", "err", err)
			return exitRuntime
		}
	}
}

// runAgent prepares the schema and runs the agent until ctx ends. Whatever happens here,
// the exporter keeps serving: an agent that cannot join leaves an observer, and
// pg_liveness_agent_joined says so.
func runAgent(ctx context.Context, c *config, w *wired, failed chan<- error, logger *slog.Logger) {
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
	err := database.PrepareSchema(ctx, w.pool, c.source.Schema, c.applyMigrations, w.status.schema, logger.With("component", "schema"))
	if err != nil {
		if ctx.Err() == nil {
			logger.Error("serving as an observer only", "agent", w.agent != nil, "err", err)
		}
		return
	}
	if w.agent == nil {
		return
	}
	w.status.agentStarted.Store(true)
	if err := w.agent.Run(ctx); err != nil {
		logger.Error("agent shutdown", "err", err)
		if errors.Is(err, liveness.ErrDuplicateInstance) {
			failed <- err
		}
	}
}

// binaryStatus is the collector's view of the start-up step.
type binaryStatus struct {
	schema       *database.SchemaStatus
	agentStarted atomic.Bool
}

func (b *binaryStatus) Status() store.BinaryStatus {
	s := b.schema.Get()
	return store.BinaryStatus{
		SchemaRead: s.Read, SchemaVersion: s.State.Version, SchemaCompatibleFrom: s.State.CompatibleFrom,
		BinaryVersion: s.Binary, SchemaCompatible: s.Compatible, AgentStarted: b.agentStarted.Load(),
	}
}

type wired struct {
	dsnSwitch *database.DSNSwitch
	web       *webconfig.Served // nil without --web.config.file
	reloads   *reloadStatus
	status    *binaryStatus
	database  string // the main DSN rebuilt without its password, for log lines
	source    *store.Source
	pool      *pgxpool.Pool        // nil with --config.file and no DSN: /probe only
	agent     *liveness.Agent      // nil with --no-agent
	nodeAgent *liveness.NodeAgent  // nil without --node-agent.socket
	targets   *targets.Pools       // nil without --config.file
	discover  *discovery.Databases // nil without --config.file
	mux       *http.ServeMux
}

// close closes the pools once the server and the agent have stopped.
func (w *wired) close() {
	if w.pool != nil {
		w.pool.Close()
	}
	if w.targets != nil {
		w.targets.Close()
	}
}

// wire checks the flags and builds the pool, the agent, the collectors and the HTTP
// handlers. The flags are checked before the pool exists; once it does, a failure closes
// it on the way out, in one place. Errors name fields (run names their flags).
func wire(c *config, envDSN string, logger *slog.Logger) (_ *wired, err error) {
	// With --config.file and no DSN the exporter answers /probe only.
	probeOnly := c.configFile != "" && c.dsn == "" && c.dsnFile == "" && envDSN == ""
	if !probeOnly {
		if err := resolveDSNs(c, envDSN); err != nil {
			return nil, err
		}
	}
	if err := checkFlags(c); err != nil {
		return nil, err
	}
	// The one parsed source: the collectors and the status page read it.
	source, err := store.NewSource(c.source)
	if err != nil {
		return nil, err
	}
	var pools *targets.Pools
	if c.configFile != "" {
		if pools, err = loadTargets(c, logger); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				pools.Close()
			}
		}()
	}
	var discovered *discovery.Databases
	if pools != nil {
		if discovered, err = discovery.New(pools, c.collectors, source, c.discoverMaxSeries, logger); err != nil {
			return nil, err
		}
	}
	if probeOnly {
		w := &wired{reloads: newReloadStatus(), status: &binaryStatus{schema: &database.SchemaStatus{}},
			database: "none (--config.file only)", source: source, targets: pools, discover: discovered}
		if w.mux, err = newProbeOnlyHandler(c, w, logger); err != nil {
			return nil, err
		}
		return w, nil
	}
	c.pool.ApplicationName, c.pool.Logger = exporterName+":pool", logger.With("component", "database")
	pool, dsnSwitch, err := database.NewSwitchablePool(c.pool)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			pool.Close()
		}
	}()
	w := &wired{dsnSwitch: dsnSwitch, reloads: newReloadStatus(), status: &binaryStatus{schema: &database.SchemaStatus{}},
		database: dsn.Describe(c.pool.DSN), source: source, pool: pool, targets: pools, discover: discovered}
	if c.nodeAgent.Socket != "" {
		// The node's processes attach to it, and so does the exporter's own agent: one
		// liveness session for the node.
		n := c.nodeAgent
		n.DirectDSN, n.Schema, n.ServiceName = c.agent.DirectDSN, c.agent.Schema, c.agent.ServiceName
		n.KeepaliveIdle, n.KeepaliveInterval, n.KeepaliveCount = c.agent.KeepaliveIdle, c.agent.KeepaliveInterval, c.agent.KeepaliveCount
		n.UserTimeout, n.Logger = c.agent.UserTimeout, logger.With("component", "node_agent")
		if w.nodeAgent, err = liveness.NewNodeAgent(n); err != nil {
			return nil, err
		}
		c.agent.NodeAgentSocket = n.Socket
		c.collectors.NodeAgent.Source = w.nodeAgent
	}
	var agent collector.AgentSource // a nil interface without an agent, never a nil *Agent
	if c.agentOn {
		if c.agent.InstanceID == uuid.Nil {
			c.agent.InstanceID = uuid.New()
		}
		c.agent.Pool, c.agent.Logger = pool, logger.With("component", "agent", "instance_id", c.agent.InstanceID.String())
		if w.agent, err = liveness.NewAgent(c.agent); err != nil {
			return nil, err
		}
		agent = w.agent
	}
	if w.mux, err = newHandler(c, w, agent, logger); err != nil {
		return nil, err
	}
	return w, nil
}

// resolveDSNs sets the pool's DSN from --db.dsn, --db.dsn-file or DATA_SOURCE_NAME, and
// the alive lock's from --db.direct-dsn, --db.direct-dsn-file or else the same.
func resolveDSNs(c *config, envDSN string) error {
	mainDSN, err := dsn.Resolve(c.dsn, c.dsnFile, envDSN)
	if err != nil {
		return err
	}
	c.pool.DSN = mainDSN
	if c.agent.DirectDSN, err = dsn.ResolveDirect(c.agent.DirectDSN, c.directDSNFile); err != nil {
		return err
	}
	if c.agent.DirectDSN == "" {
		c.agent.DirectDSN = mainDSN
	}
	return nil
}
