package scripts_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// processesUnder lists the pids whose command line mentions dir.
func processesUnder(dir string) map[int]string {
	out := map[int]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cmd, dir) {
			out[pid] = cmd
		}
	}
	return out
}

// The demo script (make run) starts PostgreSQL, the exporter and the fleet; the exporter
// sees alive and heartbeat-only instances; Ctrl-C (SIGINT to the process group, as a
// terminal sends it) stops everything it started; a second run reuses the data.
func TestRunScriptStartsAndStopsCleanly(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatal("the go command is not on PATH; the script builds the binaries with it")
	}
	dir := t.TempDir()
	// As root the script runs PostgreSQL as the postgres user, which must reach the folder.
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	listen := testutil.FreeAddr(t)
	pgPort, err := testutil.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(),
		"PG_LIVENESS_RUN_DIR="+dir,
		"PG_LIVENESS_PG_PORT="+strconv.Itoa(pgPort),
		"PG_LIVENESS_LISTEN="+listen,
		"PG_LIVENESS_PROMETHEUS=off",
	)
	alive := regexp.MustCompile(`(?m)^pg_liveness_instances\{service="checkout",state="alive"\} [1-9]`)
	heartbeatOnly := regexp.MustCompile(`(?m)^pg_liveness_instances\{service="checkout",state="heartbeat_only"\} [1-9]`)

	for run := 1; run <= 2; run++ {
		var out bytes.Buffer
		cmd := exec.Command("bash", "run.sh")
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		// Whatever happens, nothing this test started may outlive it.
		t.Cleanup(func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			for pid := range processesUnder(dir) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		})

		deadline := time.Now().Add(90 * time.Second)
		for {
			body := scrape(listen)
			if alive.MatchString(body) && heartbeatOnly.MatchString(body) {
				break
			}
			select {
			case err := <-exited:
				t.Fatalf("run %d: the script exited early (%v):\n%s", run, err, out.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("run %d: no alive and heartbeat_only checkout instances within 90s:\n%s\nlast scrape:\n%s", run, out.String(), body)
			}
			time.Sleep(250 * time.Millisecond)
		}
		started := processesUnder(dir)
		for _, want := range []string{"postgres", "pg_liveness_exporter", "fleetsim"} {
			found := false
			for _, c := range started {
				found = found || strings.Contains(c, want)
			}
			if !found {
				t.Fatalf("run %d: no %s process under the run folder: %v", run, want, started)
			}
		}

		if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			t.Fatalf("run %d: the script did not stop within 60s of SIGINT:\n%s", run, out.String())
		}
		testutil.Eventually(t, 5*time.Second, "no process left", func() bool {
			for pid := range started {
				if syscall.Kill(pid, 0) == nil && processesUnder(dir)[pid] != "" {
					return false
				}
			}
			return len(processesUnder(dir)) == 0
		})
		if _, err := os.Stat(filepath.Join(dir, "pgdata", "postmaster.pid")); !os.IsNotExist(err) {
			t.Fatalf("run %d: postmaster.pid left behind (err %v)", run, err)
		}
		if run == 2 && strings.Contains(out.String(), "initdb") {
			t.Fatalf("the second run ran initdb again instead of reusing the data:\n%s", out.String())
		}
	}
}

func scrape(addr string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// make run shows the alerts page on a fresh machine only if its profile of
// install-deps.sh installs Prometheus, as it installs PostgreSQL.
func TestInstallDepsRunProfileInstallsPrometheus(t *testing.T) {
	b, err := os.ReadFile("install-deps.sh")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"postgresql": false, "prometheus": false}
	for _, m := range regexp.MustCompile(`(?m)^want (\S+) (\S+) `).FindAllStringSubmatch(string(b), -1) {
		if _, ok := want[m[1]]; ok {
			want[m[1]] = strings.Contains(","+m[2]+",", ",run,")
		}
	}
	for pkg, inRun := range want {
		if !inRun {
			t.Errorf("install-deps.sh run does not install %s, which make run needs", pkg)
		}
	}
}
