package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/cli"
	"github.com/pg-liveness/pg_liveness_exporter/internal/server"
)

// Every field of the source (what the collectors, the status page and the readers read)
// that a flag sets is refused, when wrong, with one line that starts with that flag,
// whichever collectors run. The status page once reported every error of its reader as
// the definitive-dead cutoff's.
func TestSourceFieldErrorsNameTheirFlag(t *testing.T) {
	whizbang := func(arg string) []string { return []string{"--no-agent", "--source=whizbang", arg} }
	cases := []badValue{
		{"SourceConfig.Kind", []string{"--source=other"}, "--source"},
		{"SourceConfig.Schema", []string{"--no-agent", "--db.schema=pg_liveness"}, "--db.schema"},
		{"SourceConfig.Schema", []string{"--no-agent", "--db.schema="}, "--db.schema"},
		{"SourceConfig.Fallback.StaleThreshold", []string{"--no-agent", "--agent.stale-threshold=-5s"}, "--agent.stale-threshold"},
		{"SourceConfig.Fallback.StaleThreshold", []string{"--no-agent", "--agent.stale-threshold=0s"}, "--agent.stale-threshold"},
		{"SourceConfig.Fallback.DefinitiveDeadCutoff", []string{"--no-agent", "--agent.definitive-dead-cutoff=1m"}, "--agent.definitive-dead-cutoff"},
		{"SourceConfig.Whizbang.Schema", whizbang("--source.whizbang.schema=pg_catalog"), "--source.whizbang.schema"},
		{"SourceConfig.Whizbang.Prefix", whizbang("--source.whizbang.prefix=" + strings.Repeat("p", 50)), "--source.whizbang.prefix"},
		{"SourceConfig.Whizbang.LockKeyPrefix", whizbang("--source.whizbang.lock-key-prefix=wh\xff"), "--source.whizbang.lock-key-prefix"},
		{"SourceConfig.Whizbang.Timing.HeartbeatInterval", whizbang("--source.whizbang.heartbeat-interval=-1s"), "--source.whizbang.heartbeat-interval"},
		{"SourceConfig.Whizbang.Timing.HeartbeatInterval", whizbang("--source.whizbang.heartbeat-interval=0s"), "--source.whizbang.heartbeat-interval"},
		{"SourceConfig.Whizbang.Timing.HeartbeatSlowInterval", whizbang("--source.whizbang.heartbeat-slow-interval=10s"), "--source.whizbang.heartbeat-slow-interval"},
		{"SourceConfig.Whizbang.Timing.StaleThreshold", whizbang("--source.whizbang.stale-threshold=45s"), "--source.whizbang.stale-threshold"},
		{"SourceConfig.Whizbang.Timing.DefinitiveDeadCutoff", whizbang("--source.whizbang.definitive-dead-cutoff=1m"), "--source.whizbang.definitive-dead-cutoff"},
	}
	for _, c := range cases {
		for _, collectors := range [][]string{nil, {"--no-collector.instances", "--no-collector.advisory_locks"}} {
			args := append(append([]string{"--db.dsn=host=127.0.0.1 port=1"}, c.args...), collectors...)
			c.refused(t, args)
		}
	}
	// Every source field that a flag sets has its case. NoPrefix has none: its flag sets it
	// with Prefix, so no value of the flag makes the two disagree.
	everyFieldHasACase(t, cases, func(field string) bool {
		return strings.HasPrefix(field, "SourceConfig.") && field != "SourceConfig.Whizbang.NoPrefix"
	})
}

// badValue is a flag's value that must be refused.
type badValue struct {
	field string // of the configuration the flag sets
	args  []string
	flag  string // the flag the line must start with
}

// refused runs the binary with args (and a free listen address) and checks that it exits
// with exitConfig and one line that starts with c.flag and names no library field.
func (c badValue) refused(t *testing.T, args []string) {
	t.Helper()
	args = append([]string{"--web.listen-address=127.0.0.1:0"}, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a case that is not refused serves until then
	var out bytes.Buffer
	code := run(ctx, args, "", &out)
	cancel()
	line := strings.TrimSpace(out.String())
	rest, _ := strings.CutPrefix(line, server.Name+": error: "+c.flag)
	if code != exitConfig || strings.Contains(line, "\n") || rest == line || rest == "" || !strings.ContainsAny(rest[:1], " :") {
		t.Errorf("%s %v: exit %d, want %d and one line that starts with %s:\n%s", c.field, args[1:], code, exitConfig, c.flag, line)
	}
	if strings.Contains(line, "Config.") || strings.Contains(line, "Options.") {
		t.Errorf("%s %v: the line names a library field, not a flag:\n%s", c.field, args[1:], line)
	}
}

// everyFieldHasACase checks that every field a flag sets, of those checked, has a case.
func everyFieldHasACase(t *testing.T, cases []badValue, checked func(field string) bool) {
	t.Helper()
	for field, flag := range cli.FieldFlags() {
		if checked(field) && !slices.ContainsFunc(cases, func(c badValue) bool { return c.field == field }) {
			t.Errorf("no case for %s (%s)", field, flag)
		}
	}
}

// Every field of the collectors' configuration and of the targets' pools that a flag
// sets and the package checks is refused, when wrong, with one line that starts with that
// flag: the packages name their fields, and package cli turns them into flags.
func TestCollectorAndProbeFieldErrorsNameTheirFlag(t *testing.T) {
	dir := t.TempDir()
	targetsFile := writeFile(t, dir, "targets.yml", "targets:\n  a: {dsn_file: "+writeFile(t, dir, "dsn", "host=127.0.0.1 port=1\n")+"}\n")
	probe := func(args ...string) []string {
		return append([]string{"--no-agent", "--config.file=" + targetsFile}, args...)
	}
	main := func(args ...string) []string { return append([]string{"--db.dsn=host=127.0.0.1 port=1"}, args...) }
	cases := []badValue{
		{"Config.ScrapeTimeoutOffset", main("--scrape.timeout-offset=-1s"), "--scrape.timeout-offset"},
		{"Config.ScrapeDefaultTimeout", main("--scrape.default-timeout=0s"), "--scrape.default-timeout"},
		{"Config.Instances.MaxSeries", main("--collector.instances.max-series=-1"), "--collector.instances.max-series"},
		{"Config.Instances.MaxServices", main("--collector.instances.max-services=-1"), "--collector.instances.max-services"},
		{"Config.Leases.Table", main("--collector.leases.table=a.b.c"), "--collector.leases.table"},
		{"Config.Leases.MaxSeries", main("--collector.leases.max-series=-1"), "--collector.leases.max-series"},
		{"Config.AdvisoryLocks.MaxApplications", main("--collector.advisory_locks.max-applications=0"), "--collector.advisory_locks.max-applications"},
		{"Config.Statements.Patterns", main("--collector.statements.pattern=bad=("), "--collector.statements.pattern"},
		{"Config.Statements.CacheSize", main("--collector.statements.cache-size=0"), "--collector.statements.cache-size"},
		{"Config.History.LeaderlessObjective", main("--collector.history.leaderless-objective=0s"), "--collector.history.leaderless-objective"},
		{"Config.History.Objectives", main("--collector.history.lease-objective=cleanup"), "--collector.history.lease-objective"},
		// The same checks on an exporter of --config.file only: its targets' collectors.
		{"Config.Leases.MaxSeries", probe("--collector.leases.max-series=-1"), "--collector.leases.max-series"},
		{"Options.MaxConns", probe("--probe.max-conns=1", "--probe.max-conns-per-target=2"), "--probe.max-conns"},
		{"Options.MaxConnsPerTarget", probe("--probe.max-conns-per-target=0"), "--probe.max-conns-per-target"},
		{"Options.IdleTimeout", probe("--probe.idle-timeout=0s"), "--probe.idle-timeout"},
		{"Options.ConnectTimeout", probe("--db.connect-timeout=0s"), "--db.connect-timeout"},
	}
	for _, c := range cases {
		c.refused(t, c.args)
	}
	// Every such field that a flag sets has its case; a switch (a collector's, the
	// OpenMetrics _created samples') has no check.
	everyFieldHasACase(t, cases, func(field string) bool {
		return strings.HasPrefix(field, "Config.") && !strings.HasSuffix(field, ".Enabled") && field != "Config.OpenMetricsCreated" ||
			strings.HasPrefix(field, "Options.")
	})
}
