package main

// wire builds the exporter's parts from the flags (internal/cli), each by its package's
// constructor, and routes the HTTP paths to them.

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/exporter-toolkit/web"

	"github.com/pg-liveness/pg_liveness_exporter/collector"
	"github.com/pg-liveness/pg_liveness_exporter/internal/cli"
	"github.com/pg-liveness/pg_liveness_exporter/internal/database"
	"github.com/pg-liveness/pg_liveness_exporter/internal/discovery"
	"github.com/pg-liveness/pg_liveness_exporter/internal/dsn"
	"github.com/pg-liveness/pg_liveness_exporter/internal/nodeagent"
	"github.com/pg-liveness/pg_liveness_exporter/internal/probe"
	"github.com/pg-liveness/pg_liveness_exporter/internal/reload"
	"github.com/pg-liveness/pg_liveness_exporter/internal/server"
	statuspage "github.com/pg-liveness/pg_liveness_exporter/internal/status"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/targets"
	"github.com/pg-liveness/pg_liveness_exporter/internal/webconfig"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

type wired struct {
	dsnSwitch *database.DSNSwitch
	reloads   *reload.Status
	status    *database.BinaryStatus
	database  string // the main DSN rebuilt without its password, for log lines
	source    *store.Source
	pool      *pgxpool.Pool        // nil with --config.file and no DSN: /probe only
	agent     *liveness.Agent      // nil with --no-agent
	nodeAgent *nodeagent.Server    // nil without --node-agent.socket or --node-agent.listen-address
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

// loadWeb checks --web.telemetry-path and loads --web.config.file (nil without it).
func loadWeb(c *cli.Config) (*webconfig.Served, error) {
	if err := server.ValidPath(c.TelemetryPath); err != nil {
		return nil, fmt.Errorf("--web.telemetry-path %q: %w", c.TelemetryPath, err)
	}
	if c.TelemetryPath == "/status" || c.TelemetryPath == "/status.json" {
		return nil, fmt.Errorf("--web.telemetry-path %q is the status page's path", c.TelemetryPath)
	}
	if c.ConfigFile != "" && (c.TelemetryPath == "/probe" || c.TelemetryPath == "/targets" || strings.HasPrefix(c.TelemetryPath, "/targets/")) {
		return nil, fmt.Errorf("--web.telemetry-path %q is a path of --config.file's targets (/probe, /targets)", c.TelemetryPath)
	}
	if *c.Web.WebConfigFile == "" {
		return nil, nil
	}
	served, err := webconfig.Load(*c.Web.WebConfigFile)
	if err != nil {
		return nil, fmt.Errorf("--web.config.file %w", err)
	}
	return served, nil
}

// wire checks the flags and builds the pool, the agent, the collectors and the HTTP
// handlers. The flags are checked before the pool exists; once it does, a failure closes
// it on the way out, in one place. Errors name fields (run names their flags).
func wire(c *cli.Config, envDSN string, logger *slog.Logger) (_ *wired, err error) {
	// With --config.file and no DSN the exporter answers /probe only.
	probeOnly := c.ConfigFile != "" && c.DSN == "" && c.DSNFile == "" && envDSN == ""
	if !probeOnly {
		if err := c.ResolveDSNs(envDSN); err != nil {
			return nil, err
		}
	}
	if err := cli.Check(c); err != nil {
		return nil, err
	}
	// The one parsed source: the collectors and the status page read it.
	source, err := store.NewSource(c.Source)
	if err != nil {
		return nil, err
	}
	w := &wired{reloads: reload.NewStatus(), status: &database.BinaryStatus{}, database: "none (--config.file only)", source: source}
	if c.ConfigFile != "" {
		if w.targets, err = loadTargets(c, logger); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				w.targets.Close()
			}
		}()
		if w.discover, err = discovery.New(w.targets, c.Collectors, source, c.DiscoverMaxSeries, logger); err != nil {
			return nil, err
		}
	}
	if probeOnly {
		w.mux, err = routes(c, w, nil, logger)
		return w, err
	}
	c.Pool.ApplicationName, c.Pool.Logger = server.Name+":pool", logger.With("component", "database")
	if w.pool, w.dsnSwitch, err = database.NewSwitchablePool(c.Pool); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			w.pool.Close()
		}
	}()
	w.database = dsn.Describe(c.Pool.DSN)
	if err := c.ReadNodeAgentToken(); err != nil {
		return nil, err
	}
	if c.NodeAgent.Socket != "" || c.NodeAgent.ListenAddress != "" {
		// The node's processes attach to it, and so does the exporter's own agent: one
		// liveness session for the node.
		n := c.NodeAgent
		n.DirectDSN, n.Schema, n.ServiceName = c.Agent.DirectDSN, c.Agent.Schema, c.Agent.ServiceName
		n.KeepaliveIdle, n.KeepaliveInterval, n.KeepaliveCount = c.Agent.KeepaliveIdle, c.Agent.KeepaliveInterval, c.Agent.KeepaliveCount
		n.UserTimeout, n.Logger = c.Agent.UserTimeout, logger.With("component", "node_agent")
		if w.nodeAgent, err = nodeagent.New(n); err != nil {
			return nil, err
		}
		c.Agent.NodeAgentSocket = n.Socket
		if n.Socket == "" { // over TCP, on this host
			c.Agent.NodeAgentSocket, c.Agent.NodeAgentToken = "tcp://"+localAddress(n.ListenAddress), n.Token
		}
		c.Collectors.NodeAgent.Source = w.nodeAgent
	}
	var agent collector.AgentSource // a nil interface without an agent, never a nil *Agent
	if c.AgentOn {
		if c.Agent.InstanceID == uuid.Nil {
			c.Agent.InstanceID = uuid.New()
		}
		c.Agent.Pool, c.Agent.Logger = w.pool, logger.With("component", "agent", "instance_id", c.Agent.InstanceID.String())
		if w.agent, err = liveness.NewAgent(c.Agent); err != nil {
			return nil, err
		}
		agent = w.agent
	}
	w.mux, err = routes(c, w, agent, logger)
	return w, err
}

// localAddress is where this host reaches a TCP listener of addr: its own host, or the
// loopback address when addr listens on every address.
func localAddress(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr // nodeagent.New has refused it
	}
	switch ip := net.ParseIP(host); {
	case host == "" || ip != nil && ip.IsUnspecified() && ip.To4() != nil:
		host = "127.0.0.1"
	case ip != nil && ip.IsUnspecified():
		host = "::1"
	}
	return net.JoinHostPort(host, port)
}

// loadTargets reads --config.file and opens (without connecting) the targets' pools.
func loadTargets(c *cli.Config, logger *slog.Logger) (*targets.Pools, error) {
	if c.DiscoverMaxSeries < 1 {
		return nil, fmt.Errorf("--discover.max-series must be at least 1, got %d", c.DiscoverMaxSeries)
	}
	cfg, err := targets.Load(c.ConfigFile)
	if err != nil {
		return nil, fmt.Errorf("--config.file %s: %w", c.ConfigFile, err)
	}
	c.Probe.ApplicationName, c.Probe.Logger = server.Name+":probe", logger.With("component", "database")
	return targets.NewPools(cfg, c.Probe) // errors name Options' fields
}

// routes builds the collectors and the status page of the exporter's own database (if
// it has one) on the one source, /probe, /targets and the discovered databases (with
// --config.file), and the mux that serves them with the landing page.
func routes(c *cli.Config, w *wired, agent collector.AgentSource, logger *slog.Logger) (*http.ServeMux, error) {
	reg := server.Registry(w.reloads)
	mux := http.NewServeMux()
	links := []web.LandingLinks{{Address: c.TelemetryPath, Text: "Metrics"}}
	var own *collector.Exporter // nil for /probe only
	if w.pool != nil {
		var status store.StatusSource
		if w.source.Kind() != store.SourceWhizbang { // a Whizbang database has no schema of ours to report on
			status = w.status
		}
		c.Collectors.Status, c.Collectors.Source = status, w.source
		var err error
		if own, err = collector.New(c.Collectors, w.pool, agent, logger.With("component", "collector")); err != nil {
			return nil, err
		}
		// The status page reads the source the collectors read.
		var node statuspage.NodeAgentSource // a nil interface without a node agent, never a nil *nodeagent.Server
		if w.nodeAgent != nil {
			node = w.nodeAgent
		}
		page, err := statuspage.New(statuspage.Config{DB: w.pool, Source: w.source, Agent: agent, NodeAgent: node, Status: status,
			Logger: logger.With("component", "status")})
		if err != nil {
			return nil, err
		}
		mux.Handle("/status", page)
		mux.Handle("/status.json", page)
		links = append(links, web.LandingLinks{Address: "/status", Text: "Status"})
	}
	if w.discover == nil {
		mux.Handle(c.TelemetryPath, own.Handler(reg))
		return mux, server.Landing(mux, c.TelemetryPath, links)
	}
	// With --config.file: every database discovery finds is on /metrics too, each with
	// its database label, under --discover.max-series; each target is on /probe.
	mux.Handle(c.TelemetryPath, w.discover.Handler(reg, own))
	cfg := c.Collectors
	cfg.Source = w.source
	p, err := probe.New(w.targets, cfg, logger)
	if err != nil {
		return nil, err
	}
	reg.MustRegister(probe.PoolMetrics(w.targets, c.Probe.MaxConns), w.discover.Metrics())
	mux.Handle("/probe", p)
	mainDB := w.database // the page links the exporter's own database, when it has one
	if w.pool == nil {
		mainDB = ""
	}
	mux.Handle("/targets", targets.ListPage(mainDB, w.targets, w.discover.Listed))
	mux.HandleFunc("/targets/{target}/status", p.StatusPage)
	mux.HandleFunc("/targets/{target}/status.json", p.StatusPage)
	// A discovered database's page has one path segment more than a target's (a target's
	// name holds no '/'), so the two never meet, whatever the names.
	mux.HandleFunc("/targets/{entry}/{database}/status", w.discover.StatusPage)
	mux.HandleFunc("/targets/{entry}/{database}/status.json", w.discover.StatusPage)
	if w.pool == nil {
		mux.Handle("/status", http.RedirectHandler("/targets", http.StatusFound))
	}
	return mux, server.Landing(mux, c.TelemetryPath, append(links, web.LandingLinks{Address: "/targets", Text: "Probe targets"}))
}
