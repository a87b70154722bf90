package collector

import (
	"fmt"
	"strconv"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// Config is everything the collectors need. AddFlags fills one from the command line;
// tests start from DefaultConfig.
type Config struct {
	ScrapeTimeoutOffset  time.Duration // subtracted from X-Prometheus-Scrape-Timeout-Seconds
	ScrapeDefaultTimeout time.Duration // the budget when that header is absent

	// Source is where instances are read from, as store.NewSource checked it: this
	// project's schema (nil is the default schema, with the default timing for rows that
	// record none) or a Whizbang database. Not a flag of the collectors: the binary
	// parses the source once and gives the same one to every reader.
	Source *store.Source

	// Status, when set, adds the schema metrics and tells the agent collector whether
	// the agent was started. Not a flag: the binary sets it.
	Status store.StatusSource

	// Locks, when set, gives the database's part of its server's advisory locks, read
	// once per scrape for every database the exporter watches on that server: the
	// instances and advisory_locks collectors then do not read pg_locks themselves
	// (but when it fails, or the schema predates migration 0008). Not a flag: discovery
	// within a server sets it for each database it found.
	Locks LocksSource

	// Each collector's settings, defined in its file and listed in the registry.
	Instances     InstancesConfig
	Leases        LeasesConfig
	AdvisoryLocks AdvisoryLocksConfig
	Statements    StatementsConfig
	Agent         AgentConfig
	NodeAgent     NodeAgentConfig
}

const (
	defaultScrapeTimeoutOffset  = 500 * time.Millisecond
	defaultScrapeDefaultTimeout = 10 * time.Second
)

// DefaultConfig returns the defaults AddFlags uses: each collector enabled as the registry
// says, with its options' defaults.
func DefaultConfig() Config {
	c := Config{
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

// AddFlags registers the collector and scrape flags on app. The returned Config is
// filled when app parses; the caller then sets Source and Status.
func AddFlags(app *kingpin.Application) *Config {
	cfg := DefaultConfig()
	c := &cfg
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
// source. Each enabled collector checks its own options.
func (c *Config) validate() error {
	if c.Source == nil {
		var err error
		if c.Source, err = store.NewSource(store.SourceConfig{}); err != nil {
			return err // not expected: the defaults pass every check
		}
	}
	if !c.Source.HasLeases() && c.Leases.Table == "" {
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
