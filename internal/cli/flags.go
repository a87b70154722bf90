// Package cli is the exporter's command line: every flag of the binary, declared in
// flags.go and nowhere else, bound to the configuration types of the library
// (liveness.AgentConfig), the node agent's server (nodeagent.Config), the data layer's
// source (store.SourceConfig), the pool (database.PoolConfig), the collectors
// (collector.Config) and the targets' pools (targets.Options), with those packages'
// defaults as their defaults; and fieldFlags, the one table from those types' fields to
// the flags, which turns every error that names a field into one that names the flag.
// Package main only passes Config on to the constructors.
package cli

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/alecthomas/kingpin/v2"
	"github.com/google/uuid"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/common/promslog/flag"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"
	"github.com/prometheus/exporter-toolkit/web/kingpinflag"

	"github.com/pg-liveness/pg_liveness_exporter/collector"
	"github.com/pg-liveness/pg_liveness_exporter/internal/database"
	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/discovery"
	"github.com/pg-liveness/pg_liveness_exporter/internal/dsn"
	"github.com/pg-liveness/pg_liveness_exporter/internal/nodeagent"
	"github.com/pg-liveness/pg_liveness_exporter/internal/nodeagent/proto"
	"github.com/pg-liveness/pg_liveness_exporter/internal/regularfile"
	"github.com/pg-liveness/pg_liveness_exporter/internal/server"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/targets"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// exporterName is the application's name in --help and --version, and the default
// --agent.service-name.
const exporterName = server.Name

// Config is what the flags set: the library's configuration types, field by field, and
// the few settings of the binary's own. ResolveDSNs and package main fill in what no
// flag gives (the pool's DSN from --db.dsn, --db.dsn-file or DATA_SOURCE_NAME, a new
// instance id, the loggers).
type Config struct {
	Web           *web.FlagConfig
	TelemetryPath string
	// EnableLifecycle serves POST /-/reload (--web.enable-lifecycle).
	EnableLifecycle bool
	Log             promslog.Config

	DSN, DSNFile    string
	DirectDSNFile   string // the alive lock's, read into Agent.DirectDSN
	Pool            database.PoolConfig
	ApplyMigrations bool

	AgentOn   bool // --agent: take part as an instance; --no-agent only observes
	Agent     liveness.AgentConfig
	NodeAgent nodeagent.Config // --node-agent.*: serve the node's processes
	// NodeAgentTokenFile holds the node agent's token (--node-agent.token-file), read
	// into NodeAgent.Token by ReadNodeAgentToken.
	NodeAgentTokenFile string
	Source             store.SourceConfig
	Collectors         collector.Config

	ConfigFile string          // --config.file: the /probe targets and the discover entries
	Probe      targets.Options // their pools' bounds
	// DiscoverMaxSeries bounds the series of every discovered database on /metrics together.
	DiscoverMaxSeries int
}

// Parse parses the command line (and the flags' environment variables); a bad value's
// error names its flag.
func Parse(args []string, stderr io.Writer) (*Config, error) {
	app, c := NewApp(stderr)
	if err := postgresExporterEnv(app, os.Environ()); err != nil {
		return nil, err
	}
	if _, err := app.Parse(args); err != nil {
		return nil, nameFlagInError(err, args)
	}
	return c, nil
}

// NewApp declares every flag of the binary, bound to the returned Config's fields.
func NewApp(stderr io.Writer) (*kingpin.Application, *Config) {
	app := kingpin.New(exporterName, "Takes part in a PostgreSQL-coordinated fleet and exports its liveness, leases and advisory locks.")
	app.UsageWriter(stderr)
	app.ErrorWriter(stderr)
	app.Version(version.Print(exporterName))
	app.HelpFlag.Short('h')
	c := &Config{Collectors: collector.DefaultConfig()}

	c.Web = kingpinflag.AddFlags(app, ":9816")
	app.Flag("web.telemetry-path", "Path under which to expose metrics.").Default("/metrics").StringVar(&c.TelemetryPath)
	app.Flag("web.enable-lifecycle", "Enable POST /-/reload, which reloads the configuration files as SIGHUP does.").Default("false").BoolVar(&c.EnableLifecycle)
	flag.AddFlags(app, &c.Log)
	addDatabaseFlags(app, c)
	addAgentFlags(app, c)
	addSourceFlags(app, &c.Source)
	addCollectorFlags(app, &c.Collectors)
	addProbeFlags(app, c)
	addEnvars(app)
	return app, c
}

// envarPrefix starts the environment variable of every flag: --db.dsn-file is
// PG_LIVENESS_EXPORTER_DB_DSN_FILE (the flag's name upper-cased, "." and "-" as "_"). A
// flag on the command line wins over its variable; a repeatable flag's variable holds one
// value per line.
const envarPrefix = "PG_LIVENESS_EXPORTER"

// KingpinFlags are the flags kingpin adds to every application: they print and exit.
var KingpinFlags = []string{"help", "help-long", "help-man", "version", "completion-bash", "completion-script-bash", "completion-script-zsh"}

// addEnvars gives every flag its environment variable, but kingpin's own (help, version,
// completion), which a variable must not trigger.
func addEnvars(app *kingpin.Application) {
	for _, f := range app.Model().Flags {
		clause := app.GetFlag(f.Name)
		if slices.Contains(KingpinFlags, f.Name) {
			clause.NoEnvar()
			continue
		}
		clause.Envar(envarName(f.Name))
	}
}

// postgresExporterPrefix starts postgres_exporter's variables (PG_EXPORTER_WEB_LISTEN_ADDRESS,
// …), which a user moving from it may still have set.
const postgresExporterPrefix = "PG_EXPORTER_"

// postgresExporterVars are postgres_exporter's variables (its README and main.go): the flag
// of ours each one means, or, where none means the same, what to do instead. A
// PG_EXPORTER_ variable that is neither is refused too: none is ever silently ignored.
var postgresExporterVars = map[string]struct{ flag, instead string }{
	"PG_EXPORTER_WEB_LISTEN_ADDRESS": {flag: "web.listen-address"},
	"PG_EXPORTER_WEB_TELEMETRY_PATH": {flag: "web.telemetry-path"},
	"PG_EXPORTER_DISABLE_DEFAULT_METRICS": {instead: "postgres_exporter's default metrics are not this exporter's; " +
		"choose this exporter's collectors with --[no-]collector.<name>"},
	"PG_EXPORTER_DISABLE_SETTINGS_METRICS": {instead: "this exporter exports no pg_settings; choose its collectors with --[no-]collector.<name>"},
	"PG_EXPORTER_AUTO_DISCOVER_DATABASES":  {instead: "discover a server's databases with a discover entry in --config.file"},
	"PG_EXPORTER_EXCLUDE_DATABASES":        {instead: "discover a server's databases with a discover entry in --config.file"},
	"PG_EXPORTER_INCLUDE_DATABASES":        {instead: "discover a server's databases with a discover entry in --config.file"},
	"PG_EXPORTER_EXTEND_QUERY_PATH":        {instead: "this exporter runs no custom queries"},
	"PG_EXPORTER_CONSTANT_LABELS":          {instead: "add constant labels where Prometheus scrapes (relabel_configs, or a monitor's relabelings)"},
	"PG_EXPORTER_METRIC_PREFIX":            {instead: "this exporter's metrics are named pg_liveness_*"},
}

// postgresExporterEnv reads postgres_exporter's PG_EXPORTER_* variables in environ: one
// that means a flag of ours sets it as the flag's own variable would (the command line
// still wins), unless that variable is set too (an error, as DATA_SOURCE_NAME and
// DATA_SOURCE_URI together are); any other is an error that names it and says what to
// use instead.
func postgresExporterEnv(app *kingpin.Application, environ []string) error {
	set := map[string]bool{}
	var names []string
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		set[name] = value != ""
		if strings.HasPrefix(name, postgresExporterPrefix) && value != "" {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		v, ok := postgresExporterVars[name]
		switch {
		case !ok:
			return fmt.Errorf("%s is postgres_exporter's variable, not this exporter's: set the flags' own variables (%s_*), or unset it", name, envarPrefix)
		case v.flag == "":
			return fmt.Errorf("%s (postgres_exporter's) has no counterpart here: %s; unset it", name, v.instead)
		case set[envarName(v.flag)]:
			return fmt.Errorf("%s and %s (postgres_exporter's, for --%s) are both set; use one", envarName(v.flag), name, v.flag)
		}
		app.GetFlag(v.flag).Envar(name)
	}
	return nil
}

// envarName is the environment variable of the flag --name.
func envarName(name string) string {
	return envarPrefix + "_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(name))
}

// addDatabaseFlags declares --db.* and --migrations.apply. --db.schema is the agent's
// schema and the source's.
func addDatabaseFlags(app *kingpin.Application, c *Config) {
	app.Flag("db.dsn", "PostgreSQL DSN (keyword/value or URL). Overrides DATA_SOURCE_NAME. Prefer --db.dsn-file: flags are visible in the process list.").StringVar(&c.DSN)
	app.Flag("db.dsn-file", "File holding the PostgreSQL DSN.").StringVar(&c.DSNFile)
	app.Flag("db.direct-dsn", "DSN for the alive lock's dedicated session. Must reach PostgreSQL directly, not a pooler in transaction mode. Default: the main DSN.").StringVar(&c.Agent.DirectDSN)
	app.Flag("db.direct-dsn-file", "File holding the alive lock's DSN (see --db.direct-dsn).").StringVar(&c.DirectDSNFile)
	app.Flag("db.max-conns", "Maximum connections in the pool for short statements (the alive lock adds one).").
		Default(strconv.Itoa(database.DefaultMaxConns)).Int32Var(&c.Pool.MaxConns)
	app.Flag("db.schema", "Schema of the liveness objects.").Default(defaults.Schema).
		PlaceHolder(strconv.Quote(defaults.Schema)). // quoted, as kingpin shows a string's default
		SetValue(shared(func(s string) (string, error) { return s, nil }, &c.Agent.Schema, &c.Source.Schema))
	app.Flag("db.connect-timeout", "Timeout of one connection attempt.").Default(database.DefaultConnectTimeout.String()).
		SetValue(shared(time.ParseDuration, &c.Pool.ConnectTimeout, &c.Probe.ConnectTimeout))
	app.Flag("migrations.apply", "Apply the embedded migrations once the database answers.").Default("true").BoolVar(&c.ApplyMigrations)
}

// addAgentFlags declares --agent and --agent.*, bound to the agent's configuration. The
// stale threshold and the definitive-dead cutoff are also the source's fallback for rows
// that record no timing of their own.
func addAgentFlags(app *kingpin.Application, c *Config) {
	a, t, fallback := &c.Agent, &c.Agent.Timing, &c.Source.Fallback
	duration := func(name, help string, def time.Duration, fields ...*time.Duration) {
		app.Flag(name, help).Default(def.String()).SetValue(shared(time.ParseDuration, fields...))
	}
	app.Flag("agent", "Take part as a live instance (alive lock, heartbeat, reaper). --no-agent runs a pure observer.").Default("true").BoolVar(&c.AgentOn)
	app.Flag("agent.instance-id", "Instance id (uuid). Default: a new one per start.").SetValue(instanceIDValue{&a.InstanceID})
	app.Flag("agent.service-name", "Service name recorded in the instances table.").Default(exporterName).StringVar(&a.ServiceName)
	app.Flag("agent.liveness-mode", "advisory-lock-when-available or heartbeat-table-only.").Default(string(liveness.ModeAdvisoryLockWhenAvailable)).
		EnumVar((*string)(&a.Mode), string(liveness.ModeAdvisoryLockWhenAvailable), string(liveness.ModeHeartbeatTableOnly))
	duration("agent.heartbeat-interval", "Fast heartbeat cadence, used while the alive lock is not held.", defaults.HeartbeatInterval, &t.HeartbeatInterval)
	duration("agent.heartbeat-slow-interval", "Slow heartbeat cadence, used while the alive lock is held and verified.", defaults.HeartbeatSlowInterval, &t.HeartbeatSlowInterval)
	duration("agent.stale-threshold", "A heartbeat older than this is stale (unless the alive lock is held). Recorded in the agent's instance row; as an observer, used only for rows that record none.",
		defaults.StaleThreshold, &t.StaleThreshold, &fallback.StaleThreshold)
	duration("agent.definitive-dead-cutoff", "A heartbeat older than this is dead even with the alive lock held (half-open sessions, hung processes). Recorded in the agent's instance row; as an observer, used only for rows that record none.",
		defaults.DefinitiveDeadCutoff, &t.DefinitiveDeadCutoff, &fallback.DefinitiveDeadCutoff)
	duration("agent.lock-grace", "How long observers wait for proof of life after this agent's alive lock vanished before they call it dead. Recorded in its instance row.", defaults.LockGrace, &t.LockGrace)
	duration("agent.tcp-keepalive-idle", "Server-side tcp_keepalives_idle of the alive lock's session.", defaults.KeepaliveIdle, &a.KeepaliveIdle)
	duration("agent.tcp-keepalive-interval", "Server-side tcp_keepalives_interval of the alive lock's session.", defaults.KeepaliveInterval, &a.KeepaliveInterval)
	app.Flag("agent.tcp-keepalive-count", "Server-side tcp_keepalives_count of the alive lock's session.").Default(strconv.Itoa(defaults.KeepaliveCount)).IntVar(&a.KeepaliveCount)
	duration("agent.tcp-user-timeout", "Server-side tcp_user_timeout of the alive lock's session.", defaults.UserTimeout, &a.UserTimeout)
	app.Flag("node-agent.socket", "Also be this node's agent: hold the alive locks of the node's processes "+
		"(liveness.AgentConfig.NodeAgentSocket) on one direct session, and listen to the schema's channels once for them, "+
		"on this unix socket. The exporter's own agent attaches to it too.").StringVar(&c.NodeAgent.Socket)
	app.Flag("node-agent.listen-address", "Also, or instead of --node-agent.socket, take the node's processes on this TCP "+
		"address (host:port; AgentConfig.NodeAgentSocket tcp://host:port), where no socket can be shared: in Kubernetes, "+
		"behind a Service with internalTrafficPolicy Local. Needs --node-agent.token-file, and --node-agent.claims-file "+
		"without a socket.").StringVar(&c.NodeAgent.ListenAddress)
	app.Flag("node-agent.token-file", "File holding the token a process presents to attach over TCP "+
		"(AgentConfig.NodeAgentToken), at least 16 bytes; leading and trailing white space is ignored. Read once, at start; "+
		"never logged.").PlaceHolder("FILE").StringVar(&c.NodeAgentTokenFile)
	app.Flag("node-agent.claims-file", "Where the node agent keeps which process claimed each instance, across its "+
		"restarts. Default: the socket's path followed by .claims; required without --node-agent.socket.").
		PlaceHolder("FILE").StringVar(&c.NodeAgent.ClaimsFile)
	app.Flag("node-agent.socket-mode", "Permissions of the node agent's socket (octal): whoever may connect may attach "+
		"processes; an instance belongs to the process that claimed it.").Default("0660").SetValue(fileModeValue{&c.NodeAgent.SocketMode})
	app.Flag("node-agent.max-connections", "The most processes' connections the node agent keeps open at once (one per "+
		"attached instance); one past it is told why and closed, counted and logged.").
		Default(strconv.Itoa(defaults.NodeAgentMaxConnections)).IntVar(&c.NodeAgent.MaxConnections)
	app.Flag("node-agent.max-message-bytes", "The longest line of the node agent's protocol a process may send (at least "+
		"1024); a longer one closes its connection, counted and logged.").
		Default(strconv.Itoa(defaults.NodeAgentMaxMessageBytes)).IntVar(&c.NodeAgent.MaxMessageBytes)
	app.Flag("agent.reaper", "Run cleanup_stale_instances as a lease-protected singleton.").Default("true").BoolVar(&a.Reaper)
	duration("agent.reaper-interval", "How often the reaper runs.", defaults.ReaperInterval, &a.ReaperInterval)
	duration("agent.reaper-lease-ttl", "TTL of the reaper's lease; renewed every ttl/4.", defaults.ReaperLeaseTTL, &a.ReaperLeaseTTL)
	duration("agent.history-retention", "How long the schema's history of leaderships and deaths keeps a row; the reaper deletes older ones.",
		defaults.HistoryRetention, &a.HistoryRetention)
	duration("agent.duplicate-timeout", "How long the agent waits, writing nothing, while another process holds its instance id's alive lock, before it exits non-zero.",
		defaults.DuplicateTimeout, &a.DuplicateTimeout)
}

// addSourceFlags binds --source and --source.whizbang.* to the source's configuration,
// their defaults Whizbang's documented ones. --db.schema and the agent's stale threshold
// and definitive-dead cutoff (the fallback for rows that record no timing) set its Schema
// and Fallback too. The source is checked once, by store.NewSource, and reaches every
// reader.
func addSourceFlags(app *kingpin.Application, s *store.SourceConfig) {
	s.Kind, s.Whizbang = store.SourceLiveness, store.DefaultWhizbang()
	w, t := &s.Whizbang, &s.Whizbang.Timing
	app.Flag("source", "Where instances are read from: liveness (this project's schema) or whizbang (a Whizbang "+
		"database as it is, read only; needs --no-agent).").Default(string(store.SourceLiveness)).
		EnumVar((*string)(&s.Kind), string(store.SourceLiveness), string(store.SourceWhizbang))
	app.Flag("source.whizbang.schema", "Schema of Whizbang's tables.").Default(w.Schema).StringVar(&w.Schema)
	app.Flag("source.whizbang.prefix", "Prefix of Whizbang's tables: instances are read from <prefix>service_instances (empty: service_instances).").
		Default(w.Prefix).SetValue(whizbangPrefix{w})
	app.Flag("source.whizbang.lock-key-prefix", "Text before the instance id in Whizbang's alive-lock key, hashtext(<prefix> || instance_id).").
		Default(w.LockKeyPrefix).StringVar(&w.LockKeyPrefix)
	app.Flag("source.whizbang.heartbeat-interval", "Whizbang's fast heartbeat cadence (Whizbang stores no timing in its rows).").
		Default(t.HeartbeatInterval.String()).DurationVar(&t.HeartbeatInterval)
	app.Flag("source.whizbang.heartbeat-slow-interval", "Whizbang's slow heartbeat cadence, while the alive lock is held.").
		Default(t.HeartbeatSlowInterval.String()).DurationVar(&t.HeartbeatSlowInterval)
	app.Flag("source.whizbang.stale-threshold", "A Whizbang heartbeat older than this is stale; must be above the slow cadence.").
		Default(t.StaleThreshold.String()).DurationVar(&t.StaleThreshold)
	app.Flag("source.whizbang.definitive-dead-cutoff", "A Whizbang heartbeat older than this is dead even with the lock held (its cleanup_stale_instances p_definitive_dead_cutoff).").
		Default(t.DefinitiveDeadCutoff.String()).DurationVar(&t.DefinitiveDeadCutoff)
}

// addCollectorFlags declares --[no-]collector.<name> from the collectors' switches, each
// collector's options and --scrape.*, their defaults c's (collector.DefaultConfig's).
func addCollectorFlags(app *kingpin.Application, c *collector.Config) {
	for _, s := range c.Switches() {
		help := s.Help + "."
		if s.On {
			help = s.Help + " (--no-collector." + s.Name + " disables it)."
		}
		app.Flag("collector."+s.Name, help).Default(strconv.FormatBool(s.On)).BoolVar(s.Enabled)
	}
	limit := func(name, help string, v *int) { app.Flag(name, help).Default(strconv.Itoa(*v)).IntVar(v) }
	limit("collector.instances.max-series",
		"Most pg_liveness_instance_heartbeat_age_seconds series to export; the oldest heartbeats are kept.", &c.Instances.MaxSeries)
	limit("collector.instances.max-services",
		`Most services whose instance counts are exported one by one, those with dead instances first; the rest are summed into service="other".`,
		&c.Instances.MaxServices)
	app.Flag("collector.leases.table",
		`Leases table, as "table" or "schema.table" (default: <db.schema>.leases; with --source=whizbang, none unless given). A plain table without an epoch column works too.`).
		PlaceHolder("TABLE").StringVar(&c.Leases.Table)
	limit("collector.leases.max-series",
		`Most leases exported one by one, the most urgent first; the rest are exported together under the lease label other.`, &c.Leases.MaxSeries)
	app.Flag("collector.history.leaderless-objective",
		"How long a lease may go without a leader before pg_liveness_lease_leaderless_objective_seconds calls it late (the PgLivenessLeaseLeaderless alert), for a lease no --collector.history.lease-objective names.").
		Default(c.History.LeaderlessObjective.String()).DurationVar(&c.History.LeaderlessObjective)
	app.Flag("collector.history.lease-objective",
		"A lease's own leaderless objective, as NAME=DURATION. Repeatable.").
		PlaceHolder("NAME=DURATION").StringsVar(&c.History.Objectives)
	limit("collector.advisory_locks.max-applications",
		`Most application_name label values to export; the rest are folded into "other".`, &c.AdvisoryLocks.MaxApplications)
	app.Flag("collector.statements.pattern",
		`Classify pg_stat_statements entries whose query text matches regex as statement="name", as name=regex. Repeatable; merged over the defaults by name (an empty regex removes one). Defaults: `+
			strings.Join(collector.DefaultStatementPatterns, ", ")).
		PlaceHolder("NAME=REGEX").StringsVar(&c.Statements.Patterns)
	limit("collector.statements.cache-size", "Most pg_stat_statements queryids whose classification is remembered.", &c.Statements.CacheSize)
	app.Flag("scrape.timeout-offset",
		"Subtracted from the scraper's X-Prometheus-Scrape-Timeout-Seconds to leave time to send the answer.").
		Default(c.ScrapeTimeoutOffset.String()).DurationVar(&c.ScrapeTimeoutOffset)
	app.Flag("scrape.default-timeout",
		"Time allowed to collect when the scraper sends no X-Prometheus-Scrape-Timeout-Seconds.").
		Default(c.ScrapeDefaultTimeout.String()).DurationVar(&c.ScrapeDefaultTimeout)
	app.Flag("web.openmetrics-created-samples",
		"Add each counter's _created sample, where its start is known, to the OpenMetrics answer (for a Prometheus that ingests created timestamps).").
		Default(strconv.FormatBool(c.OpenMetricsCreated)).BoolVar(&c.OpenMetricsCreated)
}

// addProbeFlags declares --config.file, --probe.*, the targets' pools' bounds, and
// --discover.max-series.
func addProbeFlags(app *kingpin.Application, c *Config) {
	o := &c.Probe
	app.Flag("config.file", "File of named credentials, targets that /probe?target=NAME answers for, and servers whose databases /metrics discovers (YAML). Re-read on SIGHUP.").
		StringVar(&c.ConfigFile)
	app.Flag("probe.max-conns", "Most connections the /probe targets' pools hold together.").
		Default(fmt.Sprint(targets.DefaultMaxConns)).IntVar(&o.MaxConns)
	app.Flag("probe.max-conns-per-target", "Most connections of one /probe target's pool.").
		Default(fmt.Sprint(targets.DefaultMaxConnsPerTarget)).Int32Var(&o.MaxConnsPerTarget)
	app.Flag("probe.idle-timeout", "A /probe target's connection idle this long is closed.").
		Default(targets.DefaultIdleTimeout.String()).DurationVar(&o.IdleTimeout)
	app.Flag("discover.max-series", "Most series the databases that --config.file's discover entries find hold together on /metrics; "+
		"beyond it, whole databases (the last by label) export only pg_liveness_up and their scrape gauges.").
		Default(fmt.Sprint(discovery.DefaultMaxSeries)).IntVar(&c.DiscoverMaxSeries)
}

// sharedValue is a flag whose one value several configuration fields take.
type sharedValue[T any] struct {
	parse  func(string) (T, error)
	fields []*T
}

func shared[T any](parse func(string) (T, error), fields ...*T) sharedValue[T] {
	return sharedValue[T]{parse: parse, fields: fields}
}

func (v sharedValue[T]) Set(s string) error {
	x, err := v.parse(s)
	if err != nil {
		return err
	}
	for _, f := range v.fields {
		*f = x
	}
	return nil
}

func (v sharedValue[T]) String() string { return fmt.Sprint(*v.fields[0]) }

// fileModeValue is an octal file mode flag (--node-agent.socket-mode).
type fileModeValue struct{ mode *fs.FileMode }

func (v fileModeValue) Set(s string) error {
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o777 {
		return fmt.Errorf("%q is not an octal file mode such as 0660", s)
	}
	*v.mode = fs.FileMode(m)
	return nil
}

func (v fileModeValue) String() string {
	if v.mode == nil {
		return ""
	}
	return fmt.Sprintf("%#o", uint32(*v.mode))
}

// instanceIDValue is --agent.instance-id. Unset, it leaves the nil uuid, for which package
// main takes a new one; given, it must be a uuid other than the nil UUID.
type instanceIDValue struct{ id *uuid.UUID }

func (v instanceIDValue) Set(s string) error {
	id, err := uuid.Parse(s)
	switch {
	case err != nil:
		return fmt.Errorf("%q is not a uuid", s)
	case id == uuid.Nil:
		return fmt.Errorf("%q is the nil UUID", s)
	}
	*v.id = id
	return nil
}

func (v instanceIDValue) String() string {
	if *v.id == uuid.Nil {
		return ""
	}
	return v.id.String()
}

// whizbangPrefix is --source.whizbang.prefix: an empty value is no prefix
// (Whizbang.NoPrefix), where the library's empty Prefix is Whizbang's default.
type whizbangPrefix struct{ w *store.Whizbang }

func (p whizbangPrefix) Set(v string) error { p.w.Prefix, p.w.NoPrefix = v, v == ""; return nil }
func (p whizbangPrefix) String() string     { return p.w.Prefix }

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

// fieldFlags is the one table from the configuration fields that flags set (of
// liveness.AgentConfig, store.SourceConfig, database.PoolConfig, collector.Config and
// targets.Options) to those flags: the packages' errors name fields, and the binary
// reports flags. TestFieldFlagsAreTheFlags checks it against what each flag really sets.
var fieldFlags = map[string]string{
	"AgentConfig.DirectDSN":                    "--db.direct-dsn",
	"AgentConfig.Schema":                       "--db.schema",
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
	"AgentConfig.Reaper":                       "--agent.reaper",
	"AgentConfig.ReaperInterval":               "--agent.reaper-interval",
	"AgentConfig.ReaperLeaseTTL":               "--agent.reaper-lease-ttl",
	"AgentConfig.HistoryRetention":             "--agent.history-retention",
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

	"PoolConfig.MaxConns":       "--db.max-conns",
	"PoolConfig.ConnectTimeout": "--db.connect-timeout",

	// collector.Config
	"Config.ScrapeTimeoutOffset":           "--scrape.timeout-offset",
	"Config.ScrapeDefaultTimeout":          "--scrape.default-timeout",
	"Config.OpenMetricsCreated":            "--web.openmetrics-created-samples",
	"Config.Instances.Enabled":             "--collector.instances",
	"Config.Instances.MaxSeries":           "--collector.instances.max-series",
	"Config.Instances.MaxServices":         "--collector.instances.max-services",
	"Config.Leases.Enabled":                "--collector.leases",
	"Config.Leases.Table":                  "--collector.leases.table",
	"Config.Leases.MaxSeries":              "--collector.leases.max-series",
	"Config.History.Enabled":               "--collector.history",
	"Config.History.LeaderlessObjective":   "--collector.history.leaderless-objective",
	"Config.History.Objectives":            "--collector.history.lease-objective",
	"Config.AdvisoryLocks.Enabled":         "--collector.advisory_locks",
	"Config.AdvisoryLocks.MaxApplications": "--collector.advisory_locks.max-applications",
	"Config.Statements.Enabled":            "--collector.statements",
	"Config.Statements.Patterns":           "--collector.statements.pattern",
	"Config.Statements.CacheSize":          "--collector.statements.cache-size",
	"Config.Agent.Enabled":                 "--collector.agent",
	"Config.NodeAgent.Enabled":             "--collector.node_agent",

	"nodeagent.Config.Socket":          "--node-agent.socket",
	"nodeagent.Config.SocketMode":      "--node-agent.socket-mode",
	"nodeagent.Config.ListenAddress":   "--node-agent.listen-address",
	"nodeagent.Config.ClaimsFile":      "--node-agent.claims-file",
	"nodeagent.Config.MaxConnections":  "--node-agent.max-connections",
	"nodeagent.Config.MaxMessageBytes": "--node-agent.max-message-bytes",

	// targets.Options
	"Options.MaxConns":          "--probe.max-conns",
	"Options.MaxConnsPerTarget": "--probe.max-conns-per-target",
	"Options.IdleTimeout":       "--probe.idle-timeout",
	"Options.ConnectTimeout":    "--db.connect-timeout",
}

// FieldFlags returns a copy of fieldFlags, for tests that check every field's error.
func FieldFlags() map[string]string { return maps.Clone(fieldFlags) }

// flagOf is the flag that sets field, or field itself if none does.
func flagOf(field string) string { return cmp.Or(fieldFlags[field], field) }

// fieldNames matches every field of fieldFlags as a whole word, the longest first, so
// that no field is rewritten inside a longer one ("Options.MaxConnsPerTarget") or inside
// another type's ("nodeagent.Config.KeepaliveIdle").
var fieldNames = func() *regexp.Regexp {
	fields := slices.SortedFunc(maps.Keys(fieldFlags), func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	for i, f := range fields {
		fields[i] = regexp.QuoteMeta(f)
	}
	return regexp.MustCompile(`\b(` + strings.Join(fields, "|") + `)\b`)
}()

// FlagError rewrites an error in terms of the flags: a *ConfigError (the library's, or
// the data layer's, which the pool's configuration uses too) as the flag of the field it
// names and its reason; any other error as its text; in both, every field of fieldFlags
// mentioned as its flag.
func FlagError(err error) error {
	namingFlags := func(s string) string { return fieldNames.ReplaceAllStringFunc(s, flagOf) }
	var ce *store.ConfigError
	if le := (*liveness.ConfigError)(nil); errors.As(err, &le) {
		ce = &store.ConfigError{Field: le.Field, Reason: le.Reason}
	} else if !errors.As(err, &ce) {
		return errors.New(namingFlags(err.Error()))
	}
	return errors.New(flagOf(ce.Field) + " " + namingFlags(ce.Reason))
}

// setting is a configuration field and its value, for refuseUnset.
type setting struct {
	field string
	value any
}

// refuseUnset refuses a zero duration or an empty string among settings the library
// would take for its default: on the command line that is a mistake. Errors name the
// field's flag.
func refuseUnset(settings ...setting) error {
	for _, s := range settings {
		switch v := s.value.(type) {
		case time.Duration:
			if v == 0 {
				return fmt.Errorf("%s (%s) must be positive", flagOf(s.field), v)
			}
		case string:
			if v == "" {
				return fmt.Errorf("%s must not be empty", flagOf(s.field))
			}
		}
	}
	return nil
}

// Check refuses what the library would take differently from what the flags mean:
// a zero or empty value the library takes for its default, a service name that cannot be
// a label value, an agent writing to a Whizbang database. The rest the constructors
// check, by field.
func Check(c *Config) error {
	s, w, t := &c.Source, &c.Source.Whizbang, &c.Source.Whizbang.Timing
	settings := []setting{{"SourceConfig.Schema", s.Schema}}
	if s.Kind == store.SourceWhizbang { // an empty --source.whizbang.prefix is no prefix
		settings = append(settings, setting{"SourceConfig.Whizbang.Schema", w.Schema},
			setting{"SourceConfig.Whizbang.LockKeyPrefix", w.LockKeyPrefix},
			setting{"SourceConfig.Whizbang.Timing.HeartbeatInterval", t.HeartbeatInterval},
			setting{"SourceConfig.Whizbang.Timing.HeartbeatSlowInterval", t.HeartbeatSlowInterval},
			setting{"SourceConfig.Whizbang.Timing.StaleThreshold", t.StaleThreshold},
			setting{"SourceConfig.Whizbang.Timing.DefinitiveDeadCutoff", t.DefinitiveDeadCutoff})
	} else {
		settings = append(settings, setting{"SourceConfig.Fallback.StaleThreshold", s.Fallback.StaleThreshold},
			setting{"SourceConfig.Fallback.DefinitiveDeadCutoff", s.Fallback.DefinitiveDeadCutoff})
	}
	if err := refuseUnset(settings...); err != nil {
		return err
	}
	if err := validateLabel(c.Agent.ServiceName); err != nil {
		return fmt.Errorf("%s: %w", flagOf("AgentConfig.ServiceName"), err)
	}
	if !c.AgentOn {
		return nil
	}
	if c.ConfigFile != "" {
		// The agent takes part in one database; an exporter that probes many is an
		// observer of each, and must not join (and migrate) its --db.dsn by default.
		return errors.New("--config.file makes an observer of many databases, and the agent takes part in one: add --no-agent (run agents as sidecars with --db.dsn-file)")
	}
	if s.Kind == store.SourceWhizbang {
		return errors.New("--source=whizbang observes a Whizbang database and writes nothing to it: add --no-agent")
	}
	a := &c.Agent
	return refuseUnset(setting{"AgentConfig.Timing.HeartbeatInterval", a.Timing.HeartbeatInterval},
		setting{"AgentConfig.Timing.HeartbeatSlowInterval", a.Timing.HeartbeatSlowInterval},
		setting{"AgentConfig.Timing.StaleThreshold", a.Timing.StaleThreshold},
		setting{"AgentConfig.Timing.DefinitiveDeadCutoff", a.Timing.DefinitiveDeadCutoff},
		setting{"AgentConfig.Timing.LockGrace", a.Timing.LockGrace}, setting{"AgentConfig.ReaperInterval", a.ReaperInterval},
		setting{"AgentConfig.ReaperLeaseTTL", a.ReaperLeaseTTL}, setting{"AgentConfig.DuplicateTimeout", a.DuplicateTimeout})
}

// ResolveDSNs sets the pool's DSN from --db.dsn, --db.dsn-file or envDSN
// (DATA_SOURCE_NAME and the like), and the alive lock's from --db.direct-dsn,
// --db.direct-dsn-file or else the same.
func (c *Config) ResolveDSNs(envDSN string) error {
	mainDSN, err := dsn.Resolve(c.DSN, c.DSNFile, envDSN)
	if err != nil {
		return err
	}
	c.Pool.DSN = mainDSN
	if c.Agent.DirectDSN, err = dsn.ResolveDirect(c.Agent.DirectDSN, c.DirectDSNFile); err != nil {
		return err
	}
	if c.Agent.DirectDSN == "" {
		c.Agent.DirectDSN = mainDSN
	}
	return nil
}

// nodeAgentTokenMax bounds the token file's size.
const nodeAgentTokenMax = 4 << 10

// ReadNodeAgentToken reads --node-agent.token-file into the node agent's Token, as a
// secret's file (regularfile.ReadSecret: its owner's alone, or a Kubernetes Secret's
// mount), without its leading and trailing white space. The token is needed with
// --node-agent.listen-address and used nowhere else. Errors name the flag and the file,
// never the token.
func (c *Config) ReadNodeAgentToken() error {
	path := c.NodeAgentTokenFile
	switch {
	case path == "" && c.NodeAgent.ListenAddress != "":
		return errors.New("--node-agent.token-file must be set with --node-agent.listen-address: it is all that keeps " +
			"whoever reaches that address from attaching processes")
	case path == "":
		return nil
	case c.NodeAgent.ListenAddress == "":
		return errors.New("--node-agent.token-file is used only with --node-agent.listen-address")
	}
	b, err := regularfile.ReadSecret(path, nodeAgentTokenMax)
	if err != nil {
		return fmt.Errorf("--node-agent.token-file: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if len(token) < proto.TokenMin {
		return fmt.Errorf("--node-agent.token-file: %s holds %d bytes; the token must be at least %d (head -c 32 "+
			"/dev/urandom | base64 makes one)", path, len(token), proto.TokenMin)
	}
	c.NodeAgent.Token = token
	return nil
}

// validateLabel refuses a value that ends up as a label value and in the database as
// text: it must be non-empty, valid UTF-8 and free of control characters.
func validateLabel(s string) error {
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
