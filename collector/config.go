package collector

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// Collector names, as used in --[no-]collector.<name> and in the collector label.
const (
	NameInstances     = "instances"
	NameLeases        = "leases"
	NameAdvisoryLocks = "advisory_locks"
	NameStatements    = "statements"
	NameAgent         = "agent"
)

// Config is everything the collectors need. AddFlags fills one from the command line;
// tests start from DefaultConfig. Schema, StaleThreshold and DefinitiveDeadCutoff are
// not collector flags: the caller copies them from --db.schema and the agent's flags.
type Config struct {
	Schema               string        // where the liveness objects live; "" means liveness.DefaultSchema
	StaleThreshold       time.Duration // --agent.stale-threshold
	DefinitiveDeadCutoff time.Duration // --agent.definitive-dead-cutoff

	ScrapeTimeoutOffset  time.Duration // subtracted from X-Prometheus-Scrape-Timeout-Seconds
	ScrapeDefaultTimeout time.Duration // the budget when that header is absent

	// Source is where instances are read from: our schema, or a Whizbang database.
	Source SourceConfig

	// Status, when set, adds the schema metrics and tells the agent collector whether
	// the agent was started. Not a flag: the binary sets it.
	Status StatusSource

	Instances     InstancesConfig
	Leases        LeasesConfig
	AdvisoryLocks AdvisoryLocksConfig
	Statements    StatementsConfig
	Agent         AgentConfig
}

// InstancesConfig configures the instances collector.
type InstancesConfig struct {
	Enabled bool
	// MaxSeries caps pg_liveness_instance_heartbeat_age_seconds; the oldest heartbeats
	// are kept. 0 exports none.
	MaxSeries int
	// MaxServices caps the services exported one by one, those with dead instances first,
	// then the largest; the rest are summed into service="other". 0 folds every service.
	MaxServices int
}

// LeasesConfig configures the leases collector.
type LeasesConfig struct {
	Enabled bool
	// Table is "table" or "schema.table"; "" means <Schema>.leases.
	Table string
	// MaxSeries caps the leases exported one by one, the most urgent (expired, or
	// soonest to expire) first; the rest are exported together as lease="other".
	MaxSeries int
}

// AdvisoryLocksConfig configures the advisory_locks collector.
type AdvisoryLocksConfig struct {
	Enabled bool
	// MaxApplications keeps the application names with the most backends; the rest are
	// folded into application_name="other".
	MaxApplications int
}

// StatementsConfig configures the statements collector.
type StatementsConfig struct {
	Enabled bool
	// Patterns are "name=regex" pairs, merged over DefaultStatementPatterns by name; an
	// empty regex removes a default. The first pattern that matches a query text wins.
	Patterns []string
	// CacheSize bounds the queryid classification cache.
	CacheSize int
}

// AgentConfig configures the agent collector. It only runs when New gets an agent.
type AgentConfig struct {
	Enabled bool
}

// DefaultStatementPatterns match the tag comments the liveness package puts in front of
// every statement it sends: /* pg_liveness:<name> */.
var DefaultStatementPatterns = []string{
	`heartbeat=pg_liveness:heartbeat\b`,
	`heartbeat_delete=pg_liveness:heartbeat_delete\b`,
	`lease_acquire=pg_liveness:lease_acquire\b`,
	`lease_renew=pg_liveness:lease_renew\b`,
	`lease_release=pg_liveness:lease_release\b`,
	`cleanup=pg_liveness:cleanup\b`,
	`alive_lock_claim=pg_liveness:alive_lock_claim\b`,
	`alive_lock_verify=pg_liveness:alive_lock_verify\b`,
}

const (
	defaultScrapeTimeoutOffset  = 500 * time.Millisecond
	defaultScrapeDefaultTimeout = 10 * time.Second
	defaultMaxSeries            = 500
	defaultMaxServices          = 500
	defaultMaxApplications      = 50
	defaultMaxLeases            = 500
	defaultStatementsCacheSize  = 10000
)

// DefaultConfig returns the defaults AddFlags uses, with every collector enabled.
func DefaultConfig() Config {
	return Config{
		Schema:               liveness.DefaultSchema,
		Source:               SourceConfig{Kind: SourceLiveness},
		StaleThreshold:       90 * time.Second,
		DefinitiveDeadCutoff: 5 * time.Minute,
		ScrapeTimeoutOffset:  defaultScrapeTimeoutOffset,
		ScrapeDefaultTimeout: defaultScrapeDefaultTimeout,
		Instances:            InstancesConfig{Enabled: true, MaxSeries: defaultMaxSeries, MaxServices: defaultMaxServices},
		Leases:               LeasesConfig{Enabled: true, MaxSeries: defaultMaxLeases},
		AdvisoryLocks:        AdvisoryLocksConfig{Enabled: true, MaxApplications: defaultMaxApplications},
		Statements:           StatementsConfig{Enabled: true, CacheSize: defaultStatementsCacheSize},
		Agent:                AgentConfig{Enabled: true},
	}
}

// AddFlags registers the collector and scrape flags on app. The returned Config is filled
// when app parses; the caller then sets Schema, StaleThreshold and DefinitiveDeadCutoff.
func AddFlags(app *kingpin.Application) *Config {
	cfg := DefaultConfig()
	c := &cfg
	enable := func(name, help string, target *bool) {
		app.Flag("collector."+name, help+" (--no-collector."+name+" disables it).").
			Default("true").BoolVar(target)
	}
	addSourceFlags(app, &c.Source)
	enable(NameInstances, "Export instance counts by state and heartbeat ages", &c.Instances.Enabled)
	enable(NameLeases, "Export leases", &c.Leases.Enabled)
	enable(NameAdvisoryLocks, "Export advisory locks and the backends that hold or await them", &c.AdvisoryLocks.Enabled)
	enable(NameStatements, "Export call counts of the liveness statements from pg_stat_statements", &c.Statements.Enabled)
	enable(NameAgent, "Export the local agent's state", &c.Agent.Enabled)

	app.Flag("collector.instances.max-series",
		"Most pg_liveness_instance_heartbeat_age_seconds series to export; the oldest heartbeats are kept.").
		Default(strconv.Itoa(defaultMaxSeries)).IntVar(&c.Instances.MaxSeries)
	app.Flag("collector.instances.max-services",
		`Most services whose instance counts are exported one by one, those with dead instances first; the rest are summed into service="other".`).
		Default(strconv.Itoa(defaultMaxServices)).IntVar(&c.Instances.MaxServices)
	app.Flag("collector.leases.table",
		`Leases table, as "table" or "schema.table" (default: <db.schema>.leases; with --source=whizbang, none unless given). A plain table without an epoch column works too.`).
		PlaceHolder("TABLE").StringVar(&c.Leases.Table)
	app.Flag("collector.leases.max-series",
		`Most leases exported one by one, the most urgent first; the rest are exported together as lease="other".`).
		Default(strconv.Itoa(defaultMaxLeases)).IntVar(&c.Leases.MaxSeries)
	app.Flag("collector.advisory_locks.max-applications",
		`Most application_name label values to export; the rest are folded into "other".`).
		Default(strconv.Itoa(defaultMaxApplications)).IntVar(&c.AdvisoryLocks.MaxApplications)
	app.Flag("collector.statements.pattern",
		`Classify pg_stat_statements entries whose query text matches regex as statement="name", as name=regex. Repeatable; merged over the defaults by name (an empty regex removes one). Defaults: `+
			strings.Join(DefaultStatementPatterns, ", ")).
		PlaceHolder("NAME=REGEX").StringsVar(&c.Statements.Patterns)
	app.Flag("collector.statements.cache-size",
		"Most pg_stat_statements queryids whose classification is remembered.").
		Default(strconv.Itoa(defaultStatementsCacheSize)).IntVar(&c.Statements.CacheSize)

	app.Flag("scrape.timeout-offset",
		"Subtracted from the scraper's X-Prometheus-Scrape-Timeout-Seconds to leave time to send the answer.").
		Default(defaultScrapeTimeoutOffset.String()).DurationVar(&c.ScrapeTimeoutOffset)
	app.Flag("scrape.default-timeout",
		"Time allowed to collect when the scraper sends no X-Prometheus-Scrape-Timeout-Seconds.").
		Default(defaultScrapeDefaultTimeout.String()).DurationVar(&c.ScrapeDefaultTimeout)
	return c
}

// statementPattern is one parsed --collector.statements.pattern.
type statementPattern struct {
	name string
	re   *regexp.Regexp
}

// validate checks the configuration and renders what is rendered once: the schema and
// the leases table as quoted identifiers, and the statement patterns.
func (c *Config) validate() (schema, leasesTable string, patterns []statementPattern, err error) {
	if c.Schema == "" {
		c.Schema = liveness.DefaultSchema
	}
	schema = pgx.Identifier{c.Schema}.Sanitize()
	if err := c.Source.validate(); err != nil {
		return "", "", nil, err
	}
	if c.Source.Kind == SourceWhizbang && c.Leases.Table == "" {
		c.Leases.Enabled = false // a Whizbang database has no leases table of ours
	}
	if c.Instances.Enabled {
		// A Whizbang source brings its own timing, checked above.
		whizbang := c.Source.Kind == SourceWhizbang
		if !whizbang && c.StaleThreshold <= 0 {
			return "", "", nil, fmt.Errorf("--agent.stale-threshold must be positive, got %s", c.StaleThreshold)
		}
		if !whizbang && c.DefinitiveDeadCutoff <= c.StaleThreshold {
			return "", "", nil, fmt.Errorf("--agent.definitive-dead-cutoff (%s) must be above --agent.stale-threshold (%s)",
				c.DefinitiveDeadCutoff, c.StaleThreshold)
		}
		if c.Instances.MaxSeries < 0 {
			return "", "", nil, fmt.Errorf("--collector.instances.max-series must be 0 or more, got %d", c.Instances.MaxSeries)
		}
		if c.Instances.MaxServices < 0 {
			return "", "", nil, fmt.Errorf("--collector.instances.max-services must be 0 or more, got %d", c.Instances.MaxServices)
		}
	}
	if c.Leases.Enabled {
		if leasesTable, err = parseTable(c.Leases.Table, c.Schema); err != nil {
			return "", "", nil, fmt.Errorf("--collector.leases.table: %w", err)
		}
		if c.Leases.MaxSeries < 0 {
			return "", "", nil, fmt.Errorf("--collector.leases.max-series must be 0 or more, got %d", c.Leases.MaxSeries)
		}
	}
	if c.AdvisoryLocks.Enabled && c.AdvisoryLocks.MaxApplications < 1 {
		return "", "", nil, fmt.Errorf("--collector.advisory_locks.max-applications must be at least 1, got %d",
			c.AdvisoryLocks.MaxApplications)
	}
	if c.Statements.Enabled {
		if c.Statements.CacheSize < 1 {
			return "", "", nil, fmt.Errorf("--collector.statements.cache-size must be at least 1, got %d", c.Statements.CacheSize)
		}
		if patterns, err = parsePatterns(c.Statements.Patterns); err != nil {
			return "", "", nil, fmt.Errorf("--collector.statements.pattern: %w", err)
		}
	}
	if c.ScrapeTimeoutOffset < 0 {
		return "", "", nil, fmt.Errorf("--scrape.timeout-offset must not be negative, got %s", c.ScrapeTimeoutOffset)
	}
	if c.ScrapeDefaultTimeout <= 0 {
		return "", "", nil, fmt.Errorf("--scrape.default-timeout must be positive, got %s", c.ScrapeDefaultTimeout)
	}
	return schema, leasesTable, patterns, nil
}

// parseTable renders "table" or "schema.table" as a quoted identifier.
func parseTable(s, schema string) (string, error) {
	if s == "" {
		return pgx.Identifier{schema, "leases"}.Sanitize(), nil
	}
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf(`%q: want "table" or "schema.table"`, s)
	}
	for _, p := range parts {
		if p == "" {
			return "", fmt.Errorf(`%q: want "table" or "schema.table"`, s)
		}
	}
	return pgx.Identifier(parts).Sanitize(), nil
}

// parsePatterns merges the given name=regex pairs over the defaults.
func parsePatterns(given []string) ([]statementPattern, error) {
	var out []statementPattern
	index := map[string]int{}
	for _, s := range append(append([]string(nil), DefaultStatementPatterns...), given...) {
		name, expr, ok := strings.Cut(s, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return nil, fmt.Errorf("%q: want name=regex", s)
		}
		var re *regexp.Regexp // nil removes the name
		if expr != "" {
			var err error
			if re, err = regexp.Compile(expr); err != nil {
				return nil, fmt.Errorf("%q: %w", s, err)
			}
		}
		if j, seen := index[name]; seen {
			out[j].re = re
			continue
		}
		index[name] = len(out)
		out = append(out, statementPattern{name: name, re: re})
	}
	kept := out[:0]
	for _, p := range out {
		if p.re != nil {
			kept = append(kept, p)
		}
	}
	return kept, nil
}
