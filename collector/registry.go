package collector

import (
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Collector names, as used in the collector label (and the binary's --[no-]collector.<name>).
const (
	NameInstances     = "instances"
	NameLeases        = "leases"
	NameAdvisoryLocks = "advisory_locks"
	NameStatements    = "statements"
	NameAgent         = "agent"
	NameNodeAgent     = "node_agent"
	NameHistory       = "history"
)

// registry is every collector, in the order of the binary's flags. The switches
// (Config.Switches, which the binary makes its --[no-]collector.<name> flags of), the
// defaults (DefaultConfig), the checks (Config.validate), New and the benchmarks all read
// it. Adding a collector is its own file (the collector, its settings type and its
// constructor) plus one row here, the settings' field in Config, and the flags of its
// options where the binary declares every flag.
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
	{name: NameHistory, on: true, db: true, settings: func(c *Config) settings { return &c.History },
		help: "Export failover times from the schema's history of leaderships and deaths, and the leases nobody leads", build: newHistoryCollector},
}

// registration is one collector as the registry knows it.
type registration struct {
	name string // in the collector label and in --[no-]collector.<name>
	help string // what it exports, for --[no-]collector.<name>
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
	// enabled is the collector's switch.
	enabled() *bool
	// defaults sets the options to their defaults (not enabled: the registry's on does).
	defaults()
	// check validates the options of an enabled collector against the whole
	// configuration; errors name the field ("Config.Leases.Table").
	check(c *Config) error
}

// limit is an integer option of a collector: its field, as errors name it, and the least
// value it may take.
type limit struct {
	field string // Config.<Collector>.<Option>
	value *int
	least int
}

func (l limit) check() error {
	switch {
	case *l.value >= l.least:
		return nil
	case l.least == 0:
		return fmt.Errorf("%s must be 0 or more, got %d", l.field, *l.value)
	default:
		return fmt.Errorf("%s must be at least %d, got %d", l.field, l.least, *l.value)
	}
}

// Switch is one collector's on/off setting, as the registry lists it.
type Switch struct {
	Name    string // the collector's, in the collector label
	Help    string // what it exports ("Export leases")
	On      bool   // enabled by default
	Enabled *bool  // the setting, in the Config that Switches was called on
}

// Switches lists every collector's switch in c, in the registry's order: the binary
// declares its --[no-]collector.<name> flags from them.
func (c *Config) Switches() []Switch {
	out := make([]Switch, len(registry))
	for i, r := range registry {
		out[i] = Switch{Name: r.name, Help: r.help, On: r.on, Enabled: r.settings(c).enabled()}
	}
	return out
}

// deps is what every collector is built from.
type deps struct {
	cfg    *Config       // validated
	pool   *pgxpool.Pool // nil only when no database collector is enabled
	agent  AgentSource   // nil without an agent
	logger *slog.Logger  // the exporter's, with the collector's name
}
