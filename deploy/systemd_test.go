package deploy

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/exporter-toolkit/web/kingpinflag"

	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

const (
	unitDir        = "systemd"
	serviceUnit    = "pg_liveness_exporter.service"
	socketUnit     = "pg_liveness_exporter.socket"
	nodeAgentUnit  = "pg_liveness_node_agent.service"
	nodeAgentUsers = "pg_liveness_node_agent.sysusers"
)

// unitSettings reads KEY=VALUE lines of a unit file, by key, in order.
func unitSettings(t *testing.T, path string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q is not KEY=VALUE", path, line)
		}
		out[k] = append(out[k], v)
	}
	return out
}

func systemdAnalyze(t *testing.T) string {
	t.Helper()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatal("systemd-analyze is not installed: apt-get install systemd")
	}
	return analyze
}

// unitCopies copies the named units into a temporary directory, verbatim but for the
// services' ExecStart, whose binary is not installed here: it runs a stand-in
// executable. It returns the copies' paths.
func unitCopies(t *testing.T, names ...string) []string {
	t.Helper()
	dir := t.TempDir()
	stand := filepath.Join(dir, "pg_liveness_exporter")
	if err := os.WriteFile(stand, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join(unitDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(name, ".service") {
			if !bytes.Contains(b, []byte("ExecStart=/usr/local/bin/pg_liveness_exporter ")) {
				t.Fatalf("%s: ExecStart does not run /usr/local/bin/pg_liveness_exporter", name)
			}
			b = bytes.Replace(b, []byte("ExecStart=/usr/local/bin/pg_liveness_exporter "), []byte("ExecStart="+stand+" "), 1)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// systemd-analyze verify loads the units as systemd would and reports unknown keys,
// unparsable values and missing executables.
func TestSystemdUnitsVerify(t *testing.T) {
	analyze := systemdAnalyze(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, analyze, append([]string{"verify", "--man=no"}, unitCopies(t, serviceUnit, socketUnit, nodeAgentUnit)...)...)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

func TestSystemdServiceSandboxAndSecrets(t *testing.T) {
	s := unitSettings(t, filepath.Join(unitDir, serviceUnit))
	want := map[string]string{
		"DynamicUser":              "yes",
		"NoNewPrivileges":          "yes",
		"ProtectSystem":            "strict",
		"ProtectHome":              "yes",
		"PrivateTmp":               "yes",
		"PrivateDevices":           "yes",
		"CapabilityBoundingSet":    "",
		"LoadCredential":           "dsn:/etc/pg_liveness_exporter/dsn",
		"RestartPreventExitStatus": "2",
	}
	for k, v := range want {
		if got := s[k]; len(got) != 1 || got[0] != v {
			t.Errorf("%s=%q, want %q", k, got, v)
		}
	}
	execStart := strings.Join(s["ExecStart"], " ")
	if !strings.Contains(execStart, " --db.dsn-file=%d/dsn") {
		t.Errorf("ExecStart must read the DSN from the credential: %s", execStart)
	}
	for _, k := range []string{"Environment", "ExecStart"} {
		for _, v := range s[k] {
			if strings.Contains(v, "DATA_SOURCE_NAME") || strings.Contains(v, "--db.dsn=") {
				t.Errorf("%s=%s puts a DSN where other users can read it", k, v)
			}
		}
	}
	// SIGTERM's clean-up with the binary's defaults (zero values: the library's, which
	// the flags default to) must end before systemd's SIGKILL, and the unit quotes it.
	cfg := liveness.AgentConfig{Reaper: true}
	checkQuotedBudget(t, filepath.Join(unitDir, serviceUnit), `at most (\d+) s with the default timings`, cfg.ShutdownBudget())
	budget := cfg.ShutdownBudget() + serverShutdown
	stop, err := time.ParseDuration(strings.Join(s["TimeoutStopSec"], ""))
	if err != nil || stop <= budget {
		t.Errorf("TimeoutStopSec=%q must exceed the shutdown budget %s", s["TimeoutStopSec"], budget)
	}
}

// Socket activation: the socket unit listens, and the flag it needs exists.
func TestSystemdSocketActivation(t *testing.T) {
	s := unitSettings(t, filepath.Join(unitDir, socketUnit))
	if len(s["ListenStream"]) != 1 || s["ListenStream"][0] != "9816" {
		t.Errorf("ListenStream=%q, want 9816", s["ListenStream"])
	}
	app := kingpin.New("x", "")
	kingpinflag.AddFlags(app, ":9816")
	if app.GetFlag("web.systemd-socket") == nil {
		t.Fatal("exporter-toolkit has no --web.systemd-socket flag")
	}
	b, err := os.ReadFile(filepath.Join(unitDir, "pg_liveness_exporter.default"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^#?PG_LIVENESS_EXPORTER_ARGS=".*--web\.systemd-socket.*"$`).Match(b) {
		t.Error("the defaults file does not show --web.systemd-socket")
	}
	if bytes.Contains(b, []byte("password=")) || regexp.MustCompile(`(?m)^[^#]*--db\.dsn=`).Match(b) {
		t.Error("the defaults file carries a DSN")
	}
}

// The node agent's unit: its socket in the runtime directory systemd creates, reachable
// by the group of the sysusers file and nobody else, the DSN as a credential, the
// shut-down inside TimeoutStopSec, and every sandbox setting of pg_liveness_exporter.service.
func TestSystemdNodeAgent(t *testing.T) {
	s := unitSettings(t, filepath.Join(unitDir, nodeAgentUnit))
	one := func(k string) string {
		t.Helper()
		if len(s[k]) != 1 {
			t.Errorf("%s=%q, want one value", k, s[k])
			return ""
		}
		return s[k][0]
	}
	execStart := one("ExecStart")
	runtimeDir := one("RuntimeDirectory")
	socket := regexp.MustCompile(`(?:^| )--node-agent\.socket=(\S+)`).FindStringSubmatch(execStart)
	if socket == nil || socket[1] != "%t/"+runtimeDir+"/agent.sock" || runtimeDir == "" {
		t.Errorf("ExecStart=%s: want --node-agent.socket=%%t/<RuntimeDirectory>/agent.sock (RuntimeDirectory=%s)", execStart, runtimeDir)
	}
	if !strings.Contains(execStart, " --db.dsn-file=%d/dsn") || !strings.HasPrefix(one("LoadCredential"), "dsn:/etc/pg_liveness_exporter/") {
		t.Errorf("the DSN must come from a credential: LoadCredential=%q, ExecStart=%s", s["LoadCredential"], execStart)
	}
	// The socket and its directory: the group may connect and enter, other users not.
	modes := map[string]string{"RuntimeDirectoryMode": one("RuntimeDirectoryMode")}
	if m := regexp.MustCompile(`--node-agent\.socket-mode=([0-7]+)`).FindStringSubmatch(execStart); m != nil {
		modes["--node-agent.socket-mode"] = m[1]
	} else {
		t.Errorf("ExecStart=%s does not set --node-agent.socket-mode", execStart)
	}
	for what, mode := range modes {
		m, err := strconv.ParseUint(mode, 8, 32)
		if err != nil || m&0o007 != 0 || m&0o050 == 0 {
			t.Errorf("%s=%s: want the group to reach the socket and other users not", what, mode)
		}
	}
	// A dynamic user of its own and the static group that the attaching services share:
	// systemd refuses a dynamic user named like an existing group, so the names differ.
	group := one("Group")
	if one("DynamicUser") != "yes" || one("User") == "" || one("User") == group {
		t.Errorf("DynamicUser=%q User=%q Group=%q: want a dynamic user and a static group of another name", s["DynamicUser"], s["User"], group)
	}
	b, err := os.ReadFile(filepath.Join(unitDir, nodeAgentUsers))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^g ` + regexp.QuoteMeta(group) + ` `).Match(b) {
		t.Errorf("%s does not create the group %s", nodeAgentUsers, group)
	}
	if !bytes.Contains(b, []byte("SupplementaryGroups="+group)) {
		t.Errorf("%s does not say how a service joins the group (SupplementaryGroups=%s)", nodeAgentUsers, group)
	}

	// The defaults file sets the variable ExecStart expands, and no DSN; the observer
	// exports the fleet.
	d, err := os.ReadFile(filepath.Join(unitDir, "pg_liveness_node_agent.default"))
	if err != nil {
		t.Fatal(err)
	}
	args := regexp.MustCompile(`(?m)^([A-Z_]+)="(.*)"$`).FindSubmatch(d)
	if args == nil || !strings.HasSuffix(execStart, " $"+string(args[1])) || one("EnvironmentFile") != "-/etc/default/pg_liveness_node_agent" {
		t.Errorf("ExecStart=%s, EnvironmentFile=%q: want the flags of pg_liveness_node_agent.default, installed as /etc/default/pg_liveness_node_agent", execStart, s["EnvironmentFile"])
	} else {
		for _, coll := range []string{"instances", "leases", "advisory_locks", "statements"} {
			if !strings.Contains(string(args[2]), "--no-collector."+coll) {
				t.Errorf("pg_liveness_node_agent.default: the node agent must not export the fleet (add --no-collector.%s)", coll)
			}
		}
	}
	if bytes.Contains(d, []byte("password=")) || regexp.MustCompile(`(?m)^[^#]*--db\.(direct-)?dsn=`).Match(d) {
		t.Error("pg_liveness_node_agent.default carries a DSN")
	}

	cfg := liveness.AgentConfig{Reaper: true}
	checkQuotedBudget(t, filepath.Join(unitDir, nodeAgentUnit), `at most (\d+) s with the default timings`, cfg.ShutdownBudget())
	stop, err := time.ParseDuration(one("TimeoutStopSec"))
	if budget := cfg.ShutdownBudget() + serverShutdown; err != nil || stop <= budget {
		t.Errorf("TimeoutStopSec=%q must exceed the shutdown budget %s", s["TimeoutStopSec"], budget)
	}

	// The existing unit's sandbox, setting by setting.
	exporter := unitSettings(t, filepath.Join(unitDir, serviceUnit))
	for _, k := range []string{"UMask", "NoNewPrivileges", "CapabilityBoundingSet", "AmbientCapabilities", "ProtectSystem", "ProtectHome",
		"PrivateTmp", "PrivateDevices", "PrivateUsers", "ProtectHostname", "ProtectClock", "ProtectKernelTunables", "ProtectKernelModules",
		"ProtectKernelLogs", "ProtectControlGroups", "ProtectProc", "RestrictAddressFamilies", "RestrictNamespaces", "RestrictRealtime",
		"RestrictSUIDSGID", "LockPersonality", "MemoryDenyWriteExecute", "RemoveIPC", "SystemCallArchitectures", "SystemCallFilter",
		"SystemCallErrorNumber", "RestartPreventExitStatus"} {
		if len(exporter[k]) == 0 {
			t.Errorf("%s has no %s: the list of sandbox settings is stale", serviceUnit, k)
		}
		if !slices.Equal(s[k], exporter[k]) {
			t.Errorf("%s=%q; %s has %q", k, s[k], serviceUnit, exporter[k])
		}
	}
	if !strings.Contains(strings.Join(s["RestrictAddressFamilies"], " "), "AF_UNIX") {
		t.Error("RestrictAddressFamilies must allow AF_UNIX, the node agent's socket")
	}
}

// systemd-analyze security rates the node agent's unit no more exposed than
// pg_liveness_exporter.service.
func TestSystemdNodeAgentExposure(t *testing.T) {
	analyze := systemdAnalyze(t)
	units := unitCopies(t, serviceUnit, nodeAgentUnit)
	exposure := func(unit string) float64 {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, analyze, "security", "--offline=yes", "--no-pager", unit).CombinedOutput()
		if err != nil {
			t.Fatalf("systemd-analyze security %s: %v\n%s", filepath.Base(unit), err, out)
		}
		m := regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("systemd-analyze security %s gives no exposure level:\n%s", filepath.Base(unit), out)
		}
		v, err := strconv.ParseFloat(string(m[1]), 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if e, n := exposure(units[0]), exposure(units[1]); n > e {
		t.Errorf("%s's exposure is %.1f, %s's %.1f", nodeAgentUnit, n, serviceUnit, e)
	}
}

// systemd-sysusers creates the socket's group from the file as shipped.
func TestSystemdNodeAgentGroup(t *testing.T) {
	sysusers, err := exec.LookPath("systemd-sysusers")
	if err != nil {
		t.Fatal("systemd-sysusers is not installed: apt-get install systemd")
	}
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := filepath.Abs(filepath.Join(unitDir, nodeAgentUsers))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, sysusers, "--root="+root, src).CombinedOutput(); err != nil {
		t.Fatalf("systemd-sysusers: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(root, "etc", "group"))
	if err != nil {
		t.Fatal(err)
	}
	group := unitSettings(t, filepath.Join(unitDir, nodeAgentUnit))["Group"]
	if len(group) != 1 || !regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(group[0])+`:x:\d+:`).Match(b) {
		t.Errorf("systemd-sysusers did not create the unit's group %q:\n%s", group, b)
	}
}
