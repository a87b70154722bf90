package collector

import (
	"fmt"
	"log/slog"
	"strconv"

	"github.com/alecthomas/kingpin/v2"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Collector names, as used in --[no-]collector.<name> and in the collector label.
const (
	NameInstances     = "instances"
	NameLeases        = "leases"
	NameAdvisoryLocks = "advisory_locks"
	NameStatements    = "statements"
	NameAgent         = "agent"
	NameNodeAgent     = "node_agent"
)

// registry is every collector, in the order of their flags. The flags (AddFlags), the
// defaults (DefaultConfig), the checks (Config.validate), New and the benchmarks all
// read it. Adding a collector is its own file (the collector, its settings type and its
// constructor) plus one row here, and the settings' field in Config.
var registry = []registration{
	{name: NameInstances, on: true, db: true, settings: func(c *Config) settings { return &c.Instances },
		help: "Export instance counts by state and heartbeat ages", build: newInstancesCollector},
	{name: NameLeases, on: true, db: true, settings: func(c *Config) settings { return &c.Leases },
		help: "Export leases", build: newLeasesCollector},
	{name: NameAdvisoryLocks, on: true, db: true, settings: func(c *Config) settings { return &c.AdvisoryLocks },
		help: "Export advisory locks and the backends that hold or await them", build: newAdvisoryLocksCollector},
	{name: NameStatements, on: true, db: true, settings: func(c *Config) settings { return &c.Statements },
		help: "Export call counts of the liveness statements from pg_stat_statements", build: newStatementsCollector},
	{name: NameAgent, on: true, settings: func(c *Config) settings { return &c.Agent },
		help: "Export the local agent's state", build: newAgentCollector},
	{name: NameNodeAgent, on: true, settings: func(c *Config) settings { return &c.NodeAgent },
		help: "Export the node agent's state (with --node-agent.socket)", build: newNodeAgentCollector},
}

// registration is one collector as the registry knows it.
type registration struct {
	name string // in --[no-]collector.<name> and in the collector label
	help string // of --[no-]collector.<name>
	on   bool   // enabled by default
	db   bool   // talks to PostgreSQL, so its outcome tells whether the server answers
	// settings returns the collector's part of c.
	settings func(c *Config) settings
	// build makes the collector. A nil collector with a nil error means it has nothing
	// to run on (the agent collector without an agent) and is left out.
	build func(deps) (collector, error)
}

// settings is a collector's part of Config; the collector's file defines it.
type settings interface {
	// enabled is where --[no-]collector.<name> lands.
	enabled() *bool
	// defaults sets the options to their defaults (not enabled: the registry's on does).
	defaults()
	// flags registers the options' flags, --collector.<name>.<option>, with the current
	// values as their defaults.
	flags(app *kingpin.Application)
	// check validates the options of an enabled collector against the whole
	// configuration; errors name the flag.
	check(c *Config) error
}

// limit is an integer option of a collector: its flag, whose default is the option's
// value when the flag is registered, and the least value it may take. Registering the
// flag and checking the value both read it, so each flag's name and rule are written
// once.
type limit struct {
	flag  string // --<flag>
	help  string
	value *int
	least int
}

func (l limit) register(app *kingpin.Application) {
	app.Flag(l.flag, l.help).Default(strconv.Itoa(*l.value)).IntVar(l.value)
}

func (l limit) check() error {
	switch {
	case *l.value >= l.least:
		return nil
	case l.least == 0:
		return fmt.Errorf("--%s must be 0 or more, got %d", l.flag, *l.value)
	default:
		return fmt.Errorf("--%s must be at least %d, got %d", l.flag, l.least, *l.value)
	}
}

// deps is what every collector is built from.
type deps struct {
	cfg    *Config       // validated
	pool   *pgxpool.Pool // nil only when no database collector is enabled
	agent  AgentSource   // nil without an agent
	logger *slog.Logger  // the exporter's, with the collector's name
}
