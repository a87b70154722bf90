package cli

import (
	"io"
	"os"
	"path/filepath"
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
// Pointers, interfaces, maps and funcs are left out: package main sets them (the pool, the
// loggers), or no flag does (Metadata).
func configFields(args ...string) (map[string]any, error) {
	c, err := Parse(args, io.Discard)
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
	walk("AgentConfig", reflect.ValueOf(c.Agent))
	walk("SourceConfig", reflect.ValueOf(c.Source))
	walk("PoolConfig", reflect.ValueOf(c.Pool))
	walk("Config", reflect.ValueOf(c.Collectors))
	walk("Options", reflect.ValueOf(c.Probe))
	walk("nodeagent.Config", reflect.ValueOf(c.NodeAgent))
	return fields, nil
}

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
	app, _ := NewApp(io.Discard)
	setBy := map[string]string{} // field → the flag that changed it
	for _, f := range app.Model().Flags {
		if slices.Contains(KingpinFlags, f.Name) {
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

// The collector flags set the collectors' configuration, and left alone give
// collector.DefaultConfig.
func TestCollectorFlags(t *testing.T) {
	c, err := Parse([]string{
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
	cfg := c.Collectors
	if cfg.Leases.Enabled || cfg.Agent.Enabled || !cfg.Instances.Enabled || !cfg.Statements.Enabled || !cfg.AdvisoryLocks.Enabled || !cfg.NodeAgent.Enabled {
		t.Errorf("enabled collectors wrong: %+v", cfg)
	}
	if cfg.Instances.MaxSeries != 7 || cfg.Leases.Table != "blog.leases" || cfg.AdvisoryLocks.MaxApplications != 3 ||
		!slices.Equal(cfg.Statements.Patterns, []string{"heartbeat=my_heartbeat", "cleanup="}) ||
		cfg.Statements.CacheSize != 99 || cfg.ScrapeTimeoutOffset != 250*time.Millisecond || cfg.ScrapeDefaultTimeout != 4*time.Second {
		t.Errorf("options not parsed: %+v", cfg)
	}
	d, err := Parse(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(d.Collectors, collector.DefaultConfig()) {
		t.Errorf("flag defaults %+v differ from DefaultConfig %+v", d.Collectors, collector.DefaultConfig())
	}
}

// Every flag but kingpin's own can come from its environment variable, named by one
// rule (docs/configuration.md: Environment variables): PG_LIVENESS_EXPORTER_ and the
// flag's name upper-cased, "." and "-" as "_".
func TestEveryFlagHasAnEnvironmentVariable(t *testing.T) {
	app, _ := NewApp(io.Discard)
	nameRE := regexp.MustCompile(`^PG_LIVENESS_EXPORTER_[A-Z0-9_]+$`)
	seen := map[string]string{}
	n := 0
	for _, f := range app.Model().Flags {
		if slices.Contains(KingpinFlags, f.Name) {
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
	c, err := Parse([]string{"--db.schema=from_flag"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Agent.Timing.HeartbeatInterval != 7*time.Second || c.AgentOn || !slices.Equal(*c.Web.WebListenAddresses, []string{"127.0.0.1:1", "127.0.0.1:2"}) {
		t.Errorf("from the environment: heartbeat %s, agent %v, listen %v", c.Agent.Timing.HeartbeatInterval, c.AgentOn, *c.Web.WebListenAddresses)
	}
	if c.Agent.Schema != "from_flag" {
		t.Errorf("--db.schema=from_flag and PG_LIVENESS_EXPORTER_DB_SCHEMA=from_env give %q; the command line must win", c.Agent.Schema)
	}
}

// postgres_exporter's PG_EXPORTER_* variables: the two that mean a flag of ours set it
// (the command line still wins), and every other one is refused by name with what to use
// instead; none is silently ignored.
func TestPostgresExporterVariables(t *testing.T) {
	t.Run("honoured", func(t *testing.T) {
		t.Setenv("PG_EXPORTER_WEB_LISTEN_ADDRESS", "127.0.0.1:9187")
		t.Setenv("PG_EXPORTER_WEB_TELEMETRY_PATH", "/pg-metrics")
		c, err := Parse(nil, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(*c.Web.WebListenAddresses, []string{"127.0.0.1:9187"}) || c.TelemetryPath != "/pg-metrics" {
			t.Errorf("listen %v, telemetry path %q; want postgres_exporter's variables' values", *c.Web.WebListenAddresses, c.TelemetryPath)
		}
		c, err = Parse([]string{"--web.telemetry-path=/flag"}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if c.TelemetryPath != "/flag" {
			t.Errorf("--web.telemetry-path=/flag and PG_EXPORTER_WEB_TELEMETRY_PATH give %q; the command line must win", c.TelemetryPath)
		}
	})
	for _, c := range []struct{ name, value, want string }{
		{"PG_EXPORTER_DISABLE_DEFAULT_METRICS", "true", "PG_EXPORTER_DISABLE_DEFAULT_METRICS (postgres_exporter's) has no counterpart here: postgres_exporter's default metrics are not this exporter's; choose this exporter's collectors with --[no-]collector.<name>; unset it"},
		{"PG_EXPORTER_DISABLE_SETTINGS_METRICS", "true", "PG_EXPORTER_DISABLE_SETTINGS_METRICS (postgres_exporter's) has no counterpart here"},
		{"PG_EXPORTER_AUTO_DISCOVER_DATABASES", "true", "PG_EXPORTER_AUTO_DISCOVER_DATABASES (postgres_exporter's) has no counterpart here: discover a server's databases with a discover entry in --config.file"},
		{"PG_EXPORTER_EXCLUDE_DATABASES", "template0", "discover entry in --config.file"},
		{"PG_EXPORTER_INCLUDE_DATABASES", "app", "discover entry in --config.file"},
		{"PG_EXPORTER_EXTEND_QUERY_PATH", "/q.yml", "runs no custom queries"},
		{"PG_EXPORTER_CONSTANT_LABELS", "env=prod", "relabel_configs"},
		{"PG_EXPORTER_METRIC_PREFIX", "pg", "named pg_liveness_*"},
		{"PG_EXPORTER_WEB_SOMETHING_NEW", "x", "PG_EXPORTER_WEB_SOMETHING_NEW is postgres_exporter's variable, not this exporter's: set the flags' own variables (PG_LIVENESS_EXPORTER_*), or unset it"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(c.name, c.value)
			_, err := Parse(nil, io.Discard)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s=%s: %v; want an error saying %q", c.name, c.value, err, c.want)
			}
		})
	}
	t.Run("both", func(t *testing.T) {
		t.Setenv("PG_EXPORTER_WEB_TELEMETRY_PATH", "/a")
		t.Setenv("PG_LIVENESS_EXPORTER_WEB_TELEMETRY_PATH", "/b")
		_, err := Parse(nil, io.Discard)
		if want := "PG_LIVENESS_EXPORTER_WEB_TELEMETRY_PATH and PG_EXPORTER_WEB_TELEMETRY_PATH (postgres_exporter's, for --web.telemetry-path) are both set; use one"; err == nil || err.Error() != want {
			t.Errorf("both variables: %v; want %q", err, want)
		}
	})
}

// The alive lock's DSN comes from its own file when one is given, and is the main DSN
// otherwise; the pool keeps the main DSN either way.
func TestDirectDSNFromItsFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "direct")
	if err := os.WriteFile(file, []byte("# the lock's own path, past the pooler\nhost=db-direct dbname=app\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, directFile, wantDirect string
	}{
		{"from its file", file, "host=db-direct dbname=app"},
		{"the main DSN", "", "host=pooler dbname=app"},
	} {
		c := &Config{DSN: "host=pooler dbname=app", DirectDSNFile: tc.directFile}
		if err := c.ResolveDSNs(""); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if c.Agent.DirectDSN != tc.wantDirect || c.Pool.DSN != "host=pooler dbname=app" {
			t.Errorf("%s: direct %q, pool %q; want direct %q, pool the main DSN", tc.name, c.Agent.DirectDSN, c.Pool.DSN, tc.wantDirect)
		}
	}
}
