// Command pg_liveness_exporter exports the liveness of a PostgreSQL-coordinated fleet as
// Prometheus metrics: the state of every instance, every lease, the advisory locks and
// the fleet's statements in pg_stat_statements, with a status page beside /metrics.
// Unless run with --no-agent it also takes part in the fleet as an instance (alive lock,
// adaptive heartbeat, lease-protected reaper), and reports that agent too.
//
// This file parses and checks the flags (the source's in source.go), builds the pool, the
// agent, the one source, the collectors and the status page from them, serves HTTP,
// reloads on SIGHUP (reload.go) and shuts down on SIGINT or SIGTERM.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/alecthomas/kingpin/v2"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/common/promslog/flag"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"
	"github.com/prometheus/exporter-toolkit/web/kingpinflag"

	"github.com/pg-liveness/pg_liveness_exporter/collector"
	"github.com/pg-liveness/pg_liveness_exporter/internal/database"
	"github.com/pg-liveness/pg_liveness_exporter/internal/dsn"
	statuspage "github.com/pg-liveness/pg_liveness_exporter/internal/status"
	"github.com/pg-liveness/pg_liveness_exporter/internal/webconfig"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
	"github.com/pg-liveness/pg_liveness_exporter/logging"
	"github.com/pg-liveness/pg_liveness_exporter/store"
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
	os.Exit(run(ctx, os.Args[1:], os.Getenv("DATA_SOURCE_NAME"), os.Stderr))
}

type flags struct {
	web           *web.FlagConfig
	telemetryPath string
	log           promslog.Config

	dsn, dsnFile, directDSN string
	maxConns                int
	schema                  string
	connectTimeout          time.Duration
	applyMigrations         bool

	agent                                         bool
	instanceID, serviceName, mode                 string
	interval, slowInterval, stale, definitiveDead time.Duration
	lockGrace                                     time.Duration
	keepIdle, keepInterval, userTimeout           time.Duration
	keepCount                                     int
	reaper                                        bool
	reaperInterval, reaperTTL                     time.Duration
	duplicateTimeout                              time.Duration

	// source is where instances are read from, bound to the data layer's type; its
	// Schema and Fallback come from --db.schema and the agent's timing flags.
	source     store.SourceConfig
	collectors *collector.Config
}

func parseFlags(args []string, stderr io.Writer) (*flags, error) {
	app, f := newApp(stderr)
	if _, err := app.Parse(args); err != nil {
		return nil, nameFlagInError(err, args)
	}
	return f, nil
}

// newApp declares every flag of the binary.
func newApp(stderr io.Writer) (*kingpin.Application, *flags) {
	app := kingpin.New(exporterName, "Takes part in a PostgreSQL-coordinated fleet and exports its liveness, leases and advisory locks.")
	app.UsageWriter(stderr)
	app.ErrorWriter(stderr)
	app.Version(version.Print(exporterName))
	app.HelpFlag.Short('h')
	f := &flags{log: promslog.Config{}}

	f.web = kingpinflag.AddFlags(app, ":9816")
	app.Flag("web.telemetry-path", "Path under which to expose metrics.").Default("/metrics").StringVar(&f.telemetryPath)
	flag.AddFlags(app, &f.log)

	app.Flag("db.dsn", "PostgreSQL DSN (keyword/value or URL). Overrides DATA_SOURCE_NAME. Prefer --db.dsn-file: flags are visible in the process list.").StringVar(&f.dsn)
	app.Flag("db.dsn-file", "File holding the PostgreSQL DSN.").StringVar(&f.dsnFile)
	app.Flag("db.direct-dsn", "DSN for the alive lock's dedicated session. Must reach PostgreSQL directly, not a pooler in transaction mode. Default: the main DSN.").StringVar(&f.directDSN)
	app.Flag("db.max-conns", "Maximum connections in the pool for short statements (the alive lock adds one).").Default("2").IntVar(&f.maxConns)
	app.Flag("db.schema", "Schema of the liveness objects.").Default(liveness.DefaultSchema).StringVar(&f.schema)
	app.Flag("db.connect-timeout", "Timeout of one connection attempt.").Default("5s").DurationVar(&f.connectTimeout)
	app.Flag("migrations.apply", "Apply the embedded migrations once the database answers.").Default("true").BoolVar(&f.applyMigrations)

	app.Flag("agent", "Take part as a live instance (alive lock, heartbeat, reaper). --no-agent runs a pure observer.").Default("true").BoolVar(&f.agent)
	app.Flag("agent.instance-id", "Instance id (uuid). Default: a new one per start.").StringVar(&f.instanceID)
	app.Flag("agent.service-name", "Service name recorded in the instances table.").Default(exporterName).StringVar(&f.serviceName)
	app.Flag("agent.liveness-mode", "advisory-lock-when-available or heartbeat-table-only.").Default(string(liveness.ModeAdvisoryLockWhenAvailable)).
		EnumVar(&f.mode, string(liveness.ModeAdvisoryLockWhenAvailable), string(liveness.ModeHeartbeatTableOnly))
	app.Flag("agent.heartbeat-interval", "Fast heartbeat cadence, used while the alive lock is not held.").Default(liveness.DefaultHeartbeatInterval.String()).DurationVar(&f.interval)
	app.Flag("agent.heartbeat-slow-interval", "Slow heartbeat cadence, used while the alive lock is held and verified.").Default(liveness.DefaultHeartbeatSlowInterval.String()).DurationVar(&f.slowInterval)
	app.Flag("agent.stale-threshold", "A heartbeat older than this is stale (unless the alive lock is held). Recorded in the agent's instance row; as an observer, used only for rows that record none.").Default(liveness.DefaultStaleThreshold.String()).DurationVar(&f.stale)
	app.Flag("agent.definitive-dead-cutoff", "A heartbeat older than this is dead even with the alive lock held (half-open sessions, hung processes). Recorded in the agent's instance row; as an observer, used only for rows that record none.").Default(liveness.DefaultDefinitiveDeadCutoff.String()).DurationVar(&f.definitiveDead)
	app.Flag("agent.lock-grace", "How long observers wait for proof of life after this agent's alive lock vanished before they call it dead. Recorded in its instance row.").Default(liveness.DefaultLockGrace.String()).DurationVar(&f.lockGrace)
	app.Flag("agent.tcp-keepalive-idle", "Server-side tcp_keepalives_idle of the alive lock's session.").Default(liveness.DefaultKeepaliveIdle.String()).DurationVar(&f.keepIdle)
	app.Flag("agent.tcp-keepalive-interval", "Server-side tcp_keepalives_interval of the alive lock's session.").Default(liveness.DefaultKeepaliveInterval.String()).DurationVar(&f.keepInterval)
	app.Flag("agent.tcp-keepalive-count", "Server-side tcp_keepalives_count of the alive lock's session.").Default(strconv.Itoa(liveness.DefaultKeepaliveCount)).IntVar(&f.keepCount)
	app.Flag("agent.tcp-user-timeout", "Server-side tcp_user_timeout of the alive lock's session.").Default(liveness.DefaultUserTimeout.String()).DurationVar(&f.userTimeout)
	app.Flag("agent.reaper", "Run cleanup_stale_instances as a lease-protected singleton.").Default("true").BoolVar(&f.reaper)
	app.Flag("agent.reaper-interval", "How often the reaper runs.").Default(liveness.DefaultReaperInterval.String()).DurationVar(&f.reaperInterval)
	app.Flag("agent.reaper-lease-ttl", "TTL of the reaper's lease; renewed every ttl/4.").Default(liveness.DefaultReaperLeaseTTL.String()).DurationVar(&f.reaperTTL)
	app.Flag("agent.duplicate-timeout", "How long the agent waits, writing nothing, while another process holds its instance id's alive lock, before it exits non-zero.").Default(liveness.DefaultDuplicateTimeout.String()).DurationVar(&f.duplicateTimeout)

	addSourceFlags(app, &f.source)
	f.collectors = collector.AddFlags(app)
	return app, f
}

// nameFlagInError prefixes kingpin's value errors ("time: invalid duration \"soon\"")
// with the flag whose value they quote, so the one line says which flag is wrong.
func nameFlagInError(err error, args []string) error {
	msg := err.Error()
	if strings.Contains(msg, "--") || strings.Contains(msg, "flag") {
		return err
	}
	for i, a := range args {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") {
			continue
		}
		if !ok && i+1 < len(args) {
			value = args[i+1]
		}
		if value != "" && strings.Contains(msg, value) {
			return fmt.Errorf("--%s: %s", name, msg)
		}
	}
	return err
}

// newLogger builds the binary's one logger, from --log.level and --log.format. Every line
// passes the redacting handler, so no line can print a password; its parts get it with
// With("component", …) once, from here.
func newLogger(f *flags, w io.Writer) *slog.Logger {
	return logging.Wrap(promslog.New(&promslog.Config{Level: f.log.Level, Format: f.log.Format, Writer: w}))
}

func run(ctx context.Context, args []string, envDSN string, stderr io.Writer) int {
	f, err := parseFlags(args, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "%s: error: %s\n", exporterName, logging.Redact(err.Error()))
		return exitConfig
	}
	logger := newLogger(f, stderr)

	// Everything that can be wrong with the configuration is found before listening.
	webConfig, err := loadWeb(f)
	if err != nil {
		fmt.Fprintf(stderr, "%s: error: %s\n", exporterName, logging.Redact(err.Error()))
		return exitConfig
	}
	if webConfig != nil {
		defer webConfig.Close() // after the server's shutdown: the toolkit reads it until then
	}
	w, err := wire(f, envDSN, logger)
	if err != nil {
		fmt.Fprintf(stderr, "%s: error: %s\n", exporterName, logging.Redact(err.Error()))
		return exitConfig
	}
	w.web = webConfig
	defer w.pool.Close()
	// Binding the listeners now turns a bad address or a port in use into a
	// configuration error, before anything starts.
	listeners, err := listen(f)
	if err != nil {
		fmt.Fprintf(stderr, "%s: error: %s\n", exporterName, err)
		return exitConfig
	}
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	logger.Info("starting "+exporterName, "version", version.Info(), "database", w.database, "source", w.source.Kind(), "schema", f.schema, "agent", f.agent)

	var wg sync.WaitGroup
	bg, stopBG := context.WithCancel(ctx)
	defer stopBG()
	agentFailed := make(chan error, 1) // the agent gave up for good: exit non-zero
	wg.Go(func() {
		// Whatever happens here, the exporter keeps serving: an agent that cannot join
		// leaves an observer, and pg_liveness_agent_joined says so.
		if w.source.Kind() == store.SourceWhizbang {
			// A Whizbang database is observed as it is: no schema of ours, no agent.
			if err := w.source.CheckTable(bg, w.pool, 5*time.Second); err != nil && bg.Err() == nil {
				logger.Error("cannot read the Whizbang source; check --source.whizbang.schema, --source.whizbang.prefix and the role's grants",
					"err", err)
			}
			return
		}
		err := database.PrepareSchema(bg, w.pool, f.schema, f.applyMigrations, w.status.schema, logger.With("component", "schema"))
		if err != nil {
			if bg.Err() == nil {
				logger.Error("serving as an observer only", "agent", w.agent != nil, "err", err)
			}
			return
		}
		if w.agent != nil {
			w.status.agentStarted.Store(true)
			if err := w.agent.Run(bg); err != nil {
				logger.Error("agent shutdown", "err", err)
				if errors.Is(err, liveness.ErrDuplicateInstance) {
					agentFailed <- err
				}
			}
		}
	})

	// The toolkit reads the web configuration in force, kept in memory, never the
	// operator's file: a change of that is checked first (reload.go).
	toolkitFlags := *f.web
	if webConfig != nil {
		path := webConfig.Path()
		toolkitFlags.WebConfigFile = &path
		wg.Go(func() { watchWebConfig(bg, webConfig, w.reloads, logger) })
	}
	srv := &http.Server{Handler: w.mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() {
		if listeners == nil { // systemd socket activation or vsock: the toolkit listens
			served <- web.ListenAndServe(srv, &toolkitFlags, logger)
			return
		}
		served <- web.ServeMultiple(listeners, srv, &toolkitFlags, logger)
	}()

	// SIGHUP reloads what can be reloaded and never stops the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	code := 0
loop:
	for {
		select {
		case <-ctx.Done():
			logger.Info("shutting down")
			break loop
		case <-hup:
			reload(f, w, logger)
		case <-agentFailed:
			code = exitRuntime
			break loop
		case err := <-served:
			if !errors.Is(err, http.ErrServerClosed) {
				logger.Error("cannot serve", "err", err)
				code = exitRuntime
			}
			break loop
		}
	}
	stopBG()
	wg.Wait() // the agent releases its leases and removes its row before we go on
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	return code
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
	pool      *pgxpool.Pool
	agent     *liveness.Agent
	mux       *http.ServeMux
}

// wire checks the flags and builds the pool, the agent, the exporter and the HTTP
// handlers. The flags are checked before the pool exists; once it does, a failure closes
// it on the way out, in one place.
func wire(f *flags, envDSN string, logger *slog.Logger) (_ *wired, err error) {
	mainDSN, err := dsn.Resolve(f.dsn, f.dsnFile, envDSN)
	if err != nil {
		return nil, err
	}
	directDSN := mainDSN
	if f.directDSN != "" {
		if err := dsn.Validate(f.directDSN); err != nil {
			return nil, fmt.Errorf("--db.direct-dsn: malformed DSN: %w", err)
		}
		directDSN = f.directDSN
	}
	if err := store.ValidateSchemaName(f.schema); err != nil {
		return nil, fmt.Errorf("--db.schema %s", err)
	}
	// The one parsed source: the collectors, the status page and its Reader all read it.
	f.source.Schema = f.schema
	f.source.Fallback = liveness.Timing{StaleThreshold: f.stale, DefinitiveDeadCutoff: f.definitiveDead}
	if err := checkSourceFlags(f); err != nil {
		return nil, err
	}
	source, err := store.NewSource(f.source)
	if err != nil {
		return nil, asFlagError(err)
	}
	if err := validateLabelFlag(f.serviceName); err != nil {
		return nil, fmt.Errorf("--agent.service-name: %w", err)
	}
	if f.maxConns < 1 || f.maxConns > 1000 {
		return nil, fmt.Errorf("--db.max-conns must be between 1 and 1000, got %d", f.maxConns)
	}
	if f.connectTimeout <= 0 {
		return nil, fmt.Errorf("--db.connect-timeout must be above zero, got %s", f.connectTimeout)
	}
	whizbangSource := source.Kind() == store.SourceWhizbang
	if whizbangSource && f.agent {
		return nil, errors.New("--source=whizbang observes a Whizbang database and writes nothing to it: add --no-agent")
	}
	var instanceID uuid.UUID
	if f.agent {
		if instanceID, err = checkAgentFlags(f); err != nil {
			return nil, err
		}
	}

	pool, dsnSwitch, err := database.NewSwitchablePool(database.PoolConfig{
		DSN: mainDSN, MaxConns: int32(f.maxConns), ApplicationName: exporterName + ":pool", ConnectTimeout: f.connectTimeout,
		Logger: logger.With("component", "database"),
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			pool.Close()
		}
	}()

	var agent *liveness.Agent
	var agentSource collector.AgentSource
	if f.agent {
		host, _ := os.Hostname()
		agent, err = liveness.NewAgent(liveness.AgentConfig{
			Pool: pool, DirectDSN: directDSN, Schema: f.schema,
			InstanceID: instanceID, ServiceName: f.serviceName, HostName: host, ProcessID: os.Getpid(),
			Mode: liveness.Mode(f.mode),
			Timing: liveness.Timing{HeartbeatInterval: f.interval, HeartbeatSlowInterval: f.slowInterval,
				StaleThreshold: f.stale, DefinitiveDeadCutoff: f.definitiveDead, LockGrace: f.lockGrace},
			KeepaliveIdle: f.keepIdle, KeepaliveInterval: f.keepInterval, KeepaliveCount: f.keepCount, UserTimeout: f.userTimeout,
			Reaper: f.reaper, ReaperInterval: f.reaperInterval, ReaperLeaseTTL: f.reaperTTL,
			DuplicateTimeout: f.duplicateTimeout,
			Logger:           logger.With("component", "agent", "instance_id", instanceID.String()),
		})
		if err != nil {
			return nil, asFlagError(err)
		}
		agentSource = agent
	}

	status := &binaryStatus{schema: &database.SchemaStatus{}}
	if !whizbangSource { // no schema of ours to report on
		f.collectors.Status = status
	}
	f.collectors.Source = source
	exporter, err := collector.New(*f.collectors, pool, agentSource, logger.With("component", "collector"))
	if err != nil {
		return nil, err
	}

	reloads := newReloadStatus()
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		versioncollector.NewCollector(exporterName),
		reloads,
	)
	page, err := newStatusPage(f, pool, source, agentSource, status, logger)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(f.telemetryPath, exporter.Handler(reg))
	mux.Handle("/status", page)
	mux.Handle("/status.json", page)
	if f.telemetryPath != "/" {
		landing, err := web.NewLandingPage(web.LandingConfig{
			Name:        exporterName,
			Description: "Liveness, leases and advisory locks of services that coordinate through PostgreSQL",
			Version:     version.Info(),
			Links:       []web.LandingLinks{{Address: f.telemetryPath, Text: "Metrics"}, {Address: "/status", Text: "Status"}},
		})
		if err != nil {
			return nil, err
		}
		mux.Handle("/", landing)
	}
	return &wired{dsnSwitch: dsnSwitch, reloads: reloads, status: status, database: dsn.Describe(mainDSN), source: source, pool: pool,
		agent: agent, mux: mux}, nil
}

// checkAgentFlags checks the agent's flags that the library would take differently, and
// returns the instance id: --agent.instance-id, or a new one.
func checkAgentFlags(f *flags) (uuid.UUID, error) {
	id := uuid.New()
	if f.instanceID != "" {
		var err error
		if id, err = uuid.Parse(f.instanceID); err != nil {
			return uuid.Nil, fmt.Errorf("--agent.instance-id: %q is not a uuid", f.instanceID)
		}
	}
	// The library takes zero for its default; on the command line a zero is a mistake.
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"--agent.heartbeat-interval", f.interval}, {"--agent.heartbeat-slow-interval", f.slowInterval},
		{"--agent.stale-threshold", f.stale}, {"--agent.definitive-dead-cutoff", f.definitiveDead},
		{"--agent.lock-grace", f.lockGrace}, {"--agent.reaper-interval", f.reaperInterval},
		{"--agent.reaper-lease-ttl", f.reaperTTL}, {"--agent.duplicate-timeout", f.duplicateTimeout},
	} {
		if d.v <= 0 {
			return uuid.Nil, fmt.Errorf("%s (%s) must be positive", d.flag, d.v)
		}
	}
	return id, nil
}

// newStatusPage builds /status and /status.json, under the same web configuration as
// the metrics, on the source the collectors read.
func newStatusPage(f *flags, pool *pgxpool.Pool, source *store.Source, agent collector.AgentSource, status store.StatusSource,
	logger *slog.Logger) (http.Handler, error) {
	if f.telemetryPath == "/status" || f.telemetryPath == "/status.json" {
		return nil, fmt.Errorf("--web.telemetry-path %q is the status page's path", f.telemetryPath)
	}
	if source.Kind() == store.SourceWhizbang {
		status = nil // no schema of ours to report on
	}
	return statuspage.New(statuspage.Config{DB: pool, Source: source, Agent: agent, Status: status,
		Logger: logger.With("component", "status")})
}

// validateLabelFlag refuses a value that ends up as a label value and in the database
// as text: it must be non-empty, valid UTF-8 and free of control characters.
func validateLabelFlag(s string) error {
	if s == "" {
		return errors.New("must not be empty")
	}
	if !utf8.ValidString(s) {
		return errors.New("is not valid UTF-8")
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("contains the control character %U", r)
		}
	}
	return nil
}

// loadWeb checks --web.telemetry-path and loads --web.config.file (nil without it).
func loadWeb(f *flags) (*webconfig.Served, error) {
	if err := validateTelemetryPath(f.telemetryPath); err != nil {
		return nil, fmt.Errorf("--web.telemetry-path %q: %w", f.telemetryPath, err)
	}
	if *f.web.WebConfigFile == "" {
		return nil, nil
	}
	served, err := webconfig.Load(*f.web.WebConfigFile)
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
func listen(f *flags) ([]net.Listener, error) {
	if f.web.WebSystemdSocket != nil && *f.web.WebSystemdSocket {
		return nil, nil
	}
	for _, a := range *f.web.WebListenAddresses {
		if strings.HasPrefix(a, "vsock://") {
			return nil, nil
		}
	}
	var ls []net.Listener
	for _, a := range *f.web.WebListenAddresses {
		l, err := net.Listen("tcp", a)
		if err != nil {
			for _, l := range ls {
				_ = l.Close()
			}
			return nil, fmt.Errorf("--web.listen-address %q: %w", a, err)
		}
		ls = append(ls, l)
	}
	return ls, nil
}

// libraryFlagFields is the one table from the library's configuration fields (the liveness
// package's AgentConfig, the data layer's SourceConfig) to the flags that set them: the
// library's errors name fields, and the binary reports flags.
var libraryFlagFields = map[string]string{
	"AgentConfig.DirectDSN":                    "--db.direct-dsn",
	"AgentConfig.InstanceID":                   "--agent.instance-id",
	"AgentConfig.ServiceName":                  "--agent.service-name",
	"AgentConfig.Mode":                         "--agent.liveness-mode",
	"AgentConfig.Timing.HeartbeatInterval":     "--agent.heartbeat-interval",
	"AgentConfig.Timing.HeartbeatSlowInterval": "--agent.heartbeat-slow-interval",
	"AgentConfig.Timing.StaleThreshold":        "--agent.stale-threshold",
	"AgentConfig.Timing.DefinitiveDeadCutoff":  "--agent.definitive-dead-cutoff",
	"AgentConfig.Timing.LockGrace":             "--agent.lock-grace",
	"AgentConfig.KeepaliveIdle":                "--agent.tcp-keepalive-idle",
	"AgentConfig.KeepaliveInterval":            "--agent.tcp-keepalive-interval",
	"AgentConfig.KeepaliveCount":               "--agent.tcp-keepalive-count",
	"AgentConfig.UserTimeout":                  "--agent.tcp-user-timeout",
	"AgentConfig.ReaperInterval":               "--agent.reaper-interval",
	"AgentConfig.ReaperLeaseTTL":               "--agent.reaper-lease-ttl",
	"AgentConfig.DuplicateTimeout":             "--agent.duplicate-timeout",

	"SourceConfig.Kind":                                  "--source",
	"SourceConfig.Schema":                                "--db.schema",
	"SourceConfig.Fallback.StaleThreshold":               "--agent.stale-threshold",
	"SourceConfig.Fallback.DefinitiveDeadCutoff":         "--agent.definitive-dead-cutoff",
	"SourceConfig.Whizbang.Schema":                       "--source.whizbang.schema",
	"SourceConfig.Whizbang.Prefix":                       "--source.whizbang.prefix",
	"SourceConfig.Whizbang.NoPrefix":                     "--source.whizbang.prefix",
	"SourceConfig.Whizbang.LockKeyPrefix":                "--source.whizbang.lock-key-prefix",
	"SourceConfig.Whizbang.Timing.HeartbeatInterval":     "--source.whizbang.heartbeat-interval",
	"SourceConfig.Whizbang.Timing.HeartbeatSlowInterval": "--source.whizbang.heartbeat-slow-interval",
	"SourceConfig.Whizbang.Timing.StaleThreshold":        "--source.whizbang.stale-threshold",
	"SourceConfig.Whizbang.Timing.DefinitiveDeadCutoff":  "--source.whizbang.definitive-dead-cutoff",
}

// asFlagError rewrites a *liveness.ConfigError (the library's one error type for its
// configuration) in terms of the flags.
func asFlagError(err error) error {
	var ce *liveness.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	field := ce.Field
	if flag, ok := libraryFlagFields[field]; ok {
		field = flag
	}
	reason := ce.Reason
	// Longest field first, so that no field's name is rewritten inside a longer one's.
	fields := slices.SortedFunc(maps.Keys(libraryFlagFields), func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	for _, from := range fields {
		reason = strings.ReplaceAll(reason, from, libraryFlagFields[from])
	}
	return errors.New(field + " " + reason)
}
