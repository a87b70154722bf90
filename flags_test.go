package main

import (
	"bytes"
	"context"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/collector"
)

// configFields parses args and returns every field of the configuration types that flags
// set, by its name as fieldFlags writes it ("AgentConfig.Timing.StaleThreshold").
// Pointers, interfaces, maps and funcs are left out: wire sets them (the pool, the
// loggers), or no flag does (Metadata).
func configFields(args ...string) (map[string]any, error) {
	c, err := parseFlags(args, io.Discard)
	if err != nil {
		return nil, err
	}
	fields := map[string]any{}
	var walk func(path string, v reflect.Value)
	walk = func(path string, v reflect.Value) {
		for i := range v.NumField() {
			f, sf := v.Field(i), v.Type().Field(i)
			switch {
			case !sf.IsExported():
			case f.Kind() == reflect.Struct:
				walk(path+"."+sf.Name, f)
			case slices.Contains([]reflect.Kind{reflect.Pointer, reflect.Interface, reflect.Map, reflect.Func}, f.Kind()):
			default:
				fields[path+"."+sf.Name] = f.Interface()
			}
		}
	}
	walk("AgentConfig", reflect.ValueOf(c.agent))
	walk("SourceConfig", reflect.ValueOf(c.source))
	walk("PoolConfig", reflect.ValueOf(c.pool))
	walk("Config", reflect.ValueOf(c.collectors))
	walk("Options", reflect.ValueOf(c.probe))
	return fields, nil
}

// kingpinFlags are the flags kingpin adds to every application.
var kingpinFlags = []string{"help", "help-long", "help-man", "version", "completion-bash", "completion-script-bash", "completion-script-zsh"}

// fieldFlags is the table of what the flags really set: each flag is given values of
// every kind a flag takes (for a bool, both; else the empty string, a duration, a number,
// a uuid, an enum's other value), and the fields that change are the ones it sets. So a
// flag bound to a field the table does not list, a row whose flag sets another field or
// nothing, and a row whose flag does not exist all fail.
func TestFieldFlagsAreTheFlags(t *testing.T) {
	defaults, err := configFields()
	if err != nil {
		t.Fatal(err)
	}
	app, _ := newApp(io.Discard)
	setBy := map[string]string{} // field → the flag that changed it
	for _, f := range app.Model().Flags {
		if slices.Contains(kingpinFlags, f.Name) {
			continue // they print and exit
		}
		args := []string{"--no-" + f.Name, "--" + f.Name}
		if !f.IsBoolFlag() {
			args = nil
			for _, v := range []string{"", "7s", "7", "5d0c3a8e-6f1b-4e8a-9d55-0b7c2f4e1a99", "heartbeat-table-only", "whizbang"} {
				args = append(args, "--"+f.Name+"="+v)
			}
		}
		for _, arg := range args {
			fields, err := configFields(arg)
			if err != nil {
				continue // not a value this flag takes
			}
			for field, v := range fields {
				if reflect.DeepEqual(v, defaults[field]) {
					continue
				}
				if other, ok := setBy[field]; ok && other != "--"+f.Name {
					t.Errorf("%s is set by %s and by --%s", field, other, f.Name)
				}
				setBy[field] = "--" + f.Name
			}
		}
	}
	for field, flag := range setBy {
		if fieldFlags[field] != flag {
			t.Errorf("%s sets %s, but fieldFlags says %q", flag, field, fieldFlags[field])
		}
	}
	for field, flag := range fieldFlags {
		if setBy[field] == "" {
			t.Errorf("fieldFlags maps %s to %s, but no flag sets that field", field, flag)
		}
	}
	if len(setBy) < 50 {
		t.Fatalf("only %d fields found set by a flag: the probe cannot tell", len(setBy))
	}
}

// Every field of the source (what the collectors, the status page and the readers read)
// that a flag sets is refused, when wrong, with one line that starts with that flag,
// whichever collectors run. The status page once reported every error of its reader as
// the definitive-dead cutoff's.
func TestSourceFieldErrorsNameTheirFlag(t *testing.T) {
	whizbang := func(arg string) []string { return []string{"--no-agent", "--source=whizbang", arg} }
	type badValue struct {
		field string // of the source configuration
		args  []string
		flag  string // the flag the line must start with
	}
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
			args := append(append([]string{"--db.dsn=host=127.0.0.1 port=1", "--web.listen-address=127.0.0.1:0"}, c.args...), collectors...)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a case that is not refused serves until then
			var out bytes.Buffer
			code := run(ctx, args, "", &out)
			cancel()
			line := strings.TrimSpace(out.String())
			rest, _ := strings.CutPrefix(line, exporterName+": error: "+c.flag)
			if code != exitConfig || strings.Contains(line, "\n") || rest == line || rest == "" || !strings.ContainsAny(rest[:1], " :") {
				t.Errorf("%s %v: exit %d, want %d and one line that starts with %s:\n%s", c.field, args[2:], code, exitConfig, c.flag, line)
			}
			if strings.Contains(line, "Config.") {
				t.Errorf("%s %v: the line names a library field, not a flag:\n%s", c.field, args[2:], line)
			}
		}
	}
	// Every source field that a flag sets has its case. NoPrefix has none: its flag sets it
	// with Prefix, so no value of the flag makes the two disagree.
	for field := range fieldFlags {
		if strings.HasPrefix(field, "SourceConfig.") && field != "SourceConfig.Whizbang.NoPrefix" &&
			!slices.ContainsFunc(cases, func(c badValue) bool { return c.field == field }) {
			t.Errorf("no case for %s (%s)", field, fieldFlags[field])
		}
	}
}

// Every field of the collectors' configuration and of the targets' pools that a flag
// sets and the package checks is refused, when wrong, with one line that starts with that
// flag: the packages name their fields, and fieldFlags turns them into flags.
func TestCollectorAndProbeFieldErrorsNameTheirFlag(t *testing.T) {
	dir := t.TempDir()
	targetsFile := writeFile(t, dir, "targets.yml", "targets:\n  a: {dsn_file: "+writeFile(t, dir, "dsn", "host=127.0.0.1 port=1\n")+"}\n")
	probe := func(args ...string) []string {
		return append([]string{"--no-agent", "--config.file=" + targetsFile}, args...)
	}
	main := func(args ...string) []string { return append([]string{"--db.dsn=host=127.0.0.1 port=1"}, args...) }
	type badValue struct {
		field string // of collector.Config or targets.Options
		args  []string
		flag  string // the flag the line must start with
	}
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
		// The same checks on an exporter of --config.file only: its targets' collectors.
		{"Config.Leases.MaxSeries", probe("--collector.leases.max-series=-1"), "--collector.leases.max-series"},
		{"Options.MaxConns", probe("--probe.max-conns=1", "--probe.max-conns-per-target=2"), "--probe.max-conns"},
		{"Options.MaxConnsPerTarget", probe("--probe.max-conns-per-target=0"), "--probe.max-conns-per-target"},
		{"Options.IdleTimeout", probe("--probe.idle-timeout=0s"), "--probe.idle-timeout"},
		{"Options.ConnectTimeout", probe("--db.connect-timeout=0s"), "--db.connect-timeout"},
	}
	for _, c := range cases {
		args := append([]string{"--web.listen-address=127.0.0.1:0"}, c.args...)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a case that is not refused serves until then
		var out bytes.Buffer
		code := run(ctx, args, "", &out)
		cancel()
		line := strings.TrimSpace(out.String())
		rest, _ := strings.CutPrefix(line, exporterName+": error: "+c.flag)
		if code != exitConfig || strings.Contains(line, "\n") || rest == line || rest == "" || !strings.ContainsAny(rest[:1], " :") {
			t.Errorf("%s %v: exit %d, want %d and one line that starts with %s:\n%s", c.field, args[1:], code, exitConfig, c.flag, line)
		}
		if strings.Contains(line, "Config.") || strings.Contains(line, "Options.") {
			t.Errorf("%s %v: the line names a field, not a flag:\n%s", c.field, args[1:], line)
		}
	}
	// Every such field that a flag sets has its case; a collector's switch has no check.
	for field := range fieldFlags {
		if (strings.HasPrefix(field, "Config.") && !strings.HasSuffix(field, ".Enabled") || strings.HasPrefix(field, "Options.")) &&
			!slices.ContainsFunc(cases, func(c badValue) bool { return c.field == field }) {
			t.Errorf("no case for %s (%s)", field, fieldFlags[field])
		}
	}
}

// The collector flags set the collectors' configuration, and left alone give
// collector.DefaultConfig.
func TestCollectorFlags(t *testing.T) {
	c, err := parseFlags([]string{
		"--no-collector.leases", "--no-collector.agent",
		"--collector.instances.max-series=7",
		"--collector.leases.table=blog.leases",
		"--collector.advisory_locks.max-applications=3",
		"--collector.statements.pattern=heartbeat=my_heartbeat",
		"--collector.statements.pattern=cleanup=",
		"--collector.statements.cache-size=99",
		"--scrape.timeout-offset=250ms", "--scrape.default-timeout=4s",
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.collectors
	if cfg.Leases.Enabled || cfg.Agent.Enabled || !cfg.Instances.Enabled || !cfg.Statements.Enabled || !cfg.AdvisoryLocks.Enabled || !cfg.NodeAgent.Enabled {
		t.Errorf("enabled collectors wrong: %+v", cfg)
	}
	if cfg.Instances.MaxSeries != 7 || cfg.Leases.Table != "blog.leases" || cfg.AdvisoryLocks.MaxApplications != 3 ||
		!slices.Equal(cfg.Statements.Patterns, []string{"heartbeat=my_heartbeat", "cleanup="}) ||
		cfg.Statements.CacheSize != 99 || cfg.ScrapeTimeoutOffset != 250*time.Millisecond || cfg.ScrapeDefaultTimeout != 4*time.Second {
		t.Errorf("options not parsed: %+v", cfg)
	}
	d, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(d.collectors, collector.DefaultConfig()) {
		t.Errorf("flag defaults %+v differ from DefaultConfig %+v", d.collectors, collector.DefaultConfig())
	}
}

// Every flag but kingpin's own can come from its environment variable, named by one
// rule (docs/configuration.md: Environment variables): PG_LIVENESS_EXPORTER_ and the
// flag's name upper-cased, "." and "-" as "_".
func TestEveryFlagHasAnEnvironmentVariable(t *testing.T) {
	app, _ := newApp(io.Discard)
	nameRE := regexp.MustCompile(`^PG_LIVENESS_EXPORTER_[A-Z0-9_]+$`)
	seen := map[string]string{}
	n := 0
	for _, f := range app.Model().Flags {
		if slices.Contains(kingpinFlags, f.Name) {
			if f.Envar != "" {
				t.Errorf("--%s has the variable %s: setting it would print help or the version", f.Name, f.Envar)
			}
			continue
		}
		n++
		want := "PG_LIVENESS_EXPORTER_" + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(f.Name))
		if f.Envar != want || !nameRE.MatchString(f.Envar) {
			t.Errorf("--%s: environment variable %q, want %q", f.Name, f.Envar, want)
		}
		if other, dup := seen[f.Envar]; dup {
			t.Errorf("--%s and --%s share the variable %s", f.Name, other, f.Envar)
		}
		seen[f.Envar] = f.Name
	}
	if n < 50 {
		t.Fatalf("only %d flags checked", n)
	}
}

// A variable sets its flag (a duration, a negated bool, a repeatable flag one value a
// line), and the command line wins over it.
func TestFlagsFromEnvironment(t *testing.T) {
	t.Setenv("PG_LIVENESS_EXPORTER_AGENT_HEARTBEAT_INTERVAL", "7s")
	t.Setenv("PG_LIVENESS_EXPORTER_AGENT", "false")
	t.Setenv("PG_LIVENESS_EXPORTER_WEB_LISTEN_ADDRESS", "127.0.0.1:1\n127.0.0.1:2")
	t.Setenv("PG_LIVENESS_EXPORTER_DB_SCHEMA", "from_env")
	c, err := parseFlags([]string{"--db.schema=from_flag"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.agent.Timing.HeartbeatInterval != 7*time.Second || c.agentOn || !slices.Equal(*c.web.WebListenAddresses, []string{"127.0.0.1:1", "127.0.0.1:2"}) {
		t.Errorf("from the environment: heartbeat %s, agent %v, listen %v", c.agent.Timing.HeartbeatInterval, c.agentOn, *c.web.WebListenAddresses)
	}
	if c.agent.Schema != "from_flag" {
		t.Errorf("--db.schema=from_flag and PG_LIVENESS_EXPORTER_DB_SCHEMA=from_env give %q; the command line must win", c.agent.Schema)
	}
}
