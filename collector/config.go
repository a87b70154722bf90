package collector

import (
	"fmt"
	"strconv"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/pg-liveness/pg_liveness_exporter/liveness"
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

	// Each collector's settings, defined in its file and listed in the registry.
	Instances     InstancesConfig
	Leases        LeasesConfig
	AdvisoryLocks AdvisoryLocksConfig
	Statements    StatementsConfig
	Agent         AgentConfig
}

const (
	defaultScrapeTimeoutOffset  = 500 * time.Millisecond
	defaultScrapeDefaultTimeout = 10 * time.Second
)

// DefaultConfig returns the defaults AddFlags uses: each collector enabled as the registry
// says, with its options' defaults.
func DefaultConfig() Config {
	c := Config{
		Schema:               liveness.DefaultSchema,
		Source:               SourceConfig{Kind: SourceLiveness},
		StaleThreshold:       90 * time.Second,
		DefinitiveDeadCutoff: 5 * time.Minute,
		ScrapeTimeoutOffset:  defaultScrapeTimeoutOffset,
		ScrapeDefaultTimeout: defaultScrapeDefaultTimeout,
	}
	for _, r := range registry {
		s := r.settings(&c)
		s.defaults()
		*s.enabled() = r.on
	}
	return c
}

// AddFlags registers the source, collector and scrape flags on app. The returned Config
// is filled when app parses; the caller then sets Schema, StaleThreshold and
// DefinitiveDeadCutoff.
func AddFlags(app *kingpin.Application) *Config {
	cfg := DefaultConfig()
	c := &cfg
	addSourceFlags(app, &c.Source)
	for _, r := range registry {
		help := r.help + "."
		if r.on {
			help = r.help + " (--no-collector." + r.name + " disables it)."
		}
		app.Flag("collector."+r.name, help).Default(strconv.FormatBool(r.on)).BoolVar(r.settings(c).enabled())
	}
	for _, r := range registry {
		r.settings(c).flags(app)
	}
	app.Flag("scrape.timeout-offset",
		"Subtracted from the scraper's X-Prometheus-Scrape-Timeout-Seconds to leave time to send the answer.").
		Default(defaultScrapeTimeoutOffset.String()).DurationVar(&c.ScrapeTimeoutOffset)
	app.Flag("scrape.default-timeout",
		"Time allowed to collect when the scraper sends no X-Prometheus-Scrape-Timeout-Seconds.").
		Default(defaultScrapeDefaultTimeout.String()).DurationVar(&c.ScrapeDefaultTimeout)
	return c
}

// validate checks the configuration and fills in what an empty value means: the default
// schema and source. Each enabled collector checks its own options.
func (c *Config) validate() error {
	if c.Schema == "" {
		c.Schema = liveness.DefaultSchema
	}
	if err := c.Source.validate(); err != nil {
		return err
	}
	if c.Source.Kind == SourceWhizbang && c.Leases.Table == "" {
		c.Leases.Enabled = false // a Whizbang database has no leases table of ours
	}
	for _, r := range registry {
		if s := r.settings(c); *s.enabled() {
			if err := s.check(c); err != nil {
				return err
			}
		}
	}
	if c.ScrapeTimeoutOffset < 0 {
		return fmt.Errorf("--scrape.timeout-offset must not be negative, got %s", c.ScrapeTimeoutOffset)
	}
	if c.ScrapeDefaultTimeout <= 0 {
		return fmt.Errorf("--scrape.default-timeout must be positive, got %s", c.ScrapeDefaultTimeout)
	}
	return nil
}
