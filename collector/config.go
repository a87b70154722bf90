package collector

import (
	"fmt"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// Config is everything the collectors need. Start from DefaultConfig: the binary binds
// its flags to a DefaultConfig's fields, with their values as the flags' defaults.
// Errors name the fields ("Config.Leases.MaxSeries"); the binary names its flags.
type Config struct {
	ScrapeTimeoutOffset  time.Duration // subtracted from X-Prometheus-Scrape-Timeout-Seconds
	ScrapeDefaultTimeout time.Duration // the budget when that header is absent
	// OpenMetricsCreated adds a counter's _created sample, where its start is known, to
	// the OpenMetrics answer. Off, as client_golang's promhttp has it: every _created is
	// one more series, which only a Prometheus that ingests created timestamps uses.
	OpenMetricsCreated bool

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
	History       HistoryConfig
	AdvisoryLocks AdvisoryLocksConfig
	Statements    StatementsConfig
	Agent         AgentConfig
	NodeAgent     NodeAgentConfig
}

const (
	defaultScrapeTimeoutOffset  = 500 * time.Millisecond
	defaultScrapeDefaultTimeout = 10 * time.Second
)

// DefaultConfig returns each collector enabled as the registry says, with its options'
// defaults.
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
	if !c.Source.HasLeases() {
		c.History.Enabled = false // nor a history
	}
	for _, r := range registry {
		if s := r.settings(c); *s.enabled() {
			if err := s.check(c); err != nil {
				return err
			}
		}
	}
	if c.ScrapeTimeoutOffset < 0 {
		return fmt.Errorf("Config.ScrapeTimeoutOffset must not be negative, got %s", c.ScrapeTimeoutOffset)
	}
	if c.ScrapeDefaultTimeout <= 0 {
		return fmt.Errorf("Config.ScrapeDefaultTimeout must be positive, got %s", c.ScrapeDefaultTimeout)
	}
	return nil
}
