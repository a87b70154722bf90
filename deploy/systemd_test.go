package deploy

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/exporter-toolkit/web/kingpinflag"

	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

const (
	unitDir     = "systemd"
	serviceUnit = "pg_liveness_exporter.service"
	socketUnit  = "pg_liveness_exporter.socket"
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

// systemd-analyze verify loads the units as systemd would and reports unknown keys,
// unparsable values and missing executables. ExecStart's binary is not installed here, so
// the copy under test points it at a stand-in executable; everything else is verbatim.
func TestSystemdUnitsVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatal("systemd-analyze is not installed: apt-get install systemd")
	}
	dir := t.TempDir()
	stand := filepath.Join(dir, "pg_liveness_exporter")
	if err := os.WriteFile(stand, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{serviceUnit, socketUnit} {
		b, err := os.ReadFile(filepath.Join(unitDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if name == serviceUnit {
			if !bytes.Contains(b, []byte("ExecStart=/usr/local/bin/pg_liveness_exporter ")) {
				t.Fatalf("%s: ExecStart does not run /usr/local/bin/pg_liveness_exporter", name)
			}
			b = bytes.Replace(b, []byte("ExecStart=/usr/local/bin/pg_liveness_exporter "), []byte("ExecStart="+stand+" "), 1)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, analyze, "verify", "--man=no",
		filepath.Join(dir, serviceUnit), filepath.Join(dir, socketUnit))
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
