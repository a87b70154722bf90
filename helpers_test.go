package main

// What the binary's tests share: the binary, built once with the race detector, run
// against real databases and read through its logs, /metrics and exit code.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/proctest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// binary is the exporter built with -race for the tests.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pg_liveness_exporter_bin_")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "pg_liveness_exporter")
	if out, err := exec.Command("go", "build", "-race", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := pgtest.Run(m)
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// buildForBenchmark builds the exporter as it ships, without the race detector.
func buildForBenchmark(b *testing.B) string {
	bin := filepath.Join(b.TempDir(), "pg_liveness_exporter")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// exporterProc is the real binary running against a real database, started by
// proctest. Its whole output is kept here (proctest keeps only the last lines), so that a
// test may count a line or check that a password was never printed.
type exporterProc struct {
	*proctest.Process
	addr string
	logs logbuf.Buffer
}

func startExporter(t testing.TB, env []string, args ...string) *exporterProc {
	t.Helper()
	return startBinary(t, binary, env, args...)
}

func startBinary(t testing.TB, binary string, env []string, args ...string) *exporterProc {
	t.Helper()
	p := &exporterProc{addr: testutil.FreeAddr(t)}
	p.Process = proctest.Start(t, "exporter", proctest.Options{Env: env, LogsOwnOutput: true, OnLine: func(line string) {
		_, _ = p.logs.Write([]byte(line + "\n"))
	}}, binary, append([]string{"--web.listen-address=" + p.addr, "--log.level=debug"}, args...)...)
	t.Cleanup(func() { // before proctest's, whose Stop is then a no-op
		p.Stop(10 * time.Second)
		if t.Failed() { // once: failure messages point here rather than repeat the logs
			t.Logf("exporter logs:\n%s", p.Logs())
		}
	})
	return p
}

// Logs is the exporter's whole output so far.
func (p *exporterProc) Logs() string { return p.logs.String() }

// signal sends sig to the exporter.
func (p *exporterProc) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	failed := t.Failed()
	if p.Signal(t, sig); !failed && t.Failed() {
		t.FailNow()
	}
}

// code is the exporter's exit code once it has exited (-1 if a signal ended it).
func (p *exporterProc) code() int {
	var exit *exec.ExitError
	if err := p.Err(); errors.As(err, &exit) {
		return exit.ExitCode()
	} else if err != nil {
		return -1
	}
	return 0
}

// exitCode waits for the exporter to exit and returns its code, failing the test if it
// is still running after within (why says what it was told to exit by).
func (p *exporterProc) exitCode(t testing.TB, within time.Duration, why string) int {
	t.Helper()
	select {
	case <-p.Exited():
		return p.code()
	case <-time.After(within):
		t.Fatalf("the exporter did not exit within %s of %s", within, why)
		return 0
	}
}

// exited reports whether the exporter has exited.
func (p *exporterProc) exited() bool { return !p.Running() }

// checkRunning fails the test if the exporter has exited.
func (p *exporterProc) checkRunning(t testing.TB, waitingFor string) {
	t.Helper()
	if p.exited() {
		t.Fatalf("the exporter exited with %d while waiting for %s", p.code(), waitingFor)
	}
}

func (p *exporterProc) scrape(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+"/metrics", nil)
	req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", "5")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s\n%s", resp.Status, b)
	}
	return string(b)
}

// statusPage decodes /status.json into page.
func (p *exporterProc) statusPage(t testing.TB, page any) {
	t.Helper()
	resp, err := http.Get("http://" + p.addr + "/status.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(page); err != nil {
		t.Fatalf("/status.json: %s: %v", resp.Status, err)
	}
}

// waitFor scrapes until the exposition matches re, or fails after timeout.
func (p *exporterProc) waitFor(t testing.TB, re string, timeout time.Duration) string {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		p.checkRunning(t, re)
		if last = p.scrape(t); rx.MatchString(last) {
			return last
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("no %s within %s; last scrape:\n%s", re, timeout, last)
	return ""
}

func waitLog(t *testing.T, p *exporterProc, want string) {
	t.Helper()
	waitLogCount(t, p, want, 1)
}

// waitLogCount waits until n lines (or more) of the logs hold want.
func waitLogCount(t *testing.T, p *exporterProc, want string, n int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for strings.Count(p.Logs(), want) < n {
		p.checkRunning(t, fmt.Sprintf("%q", want))
		if time.Now().After(deadline) {
			t.Fatalf("no log line %q (the exporter logs follow)", want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// lastLogLine is the last line of the logs that holds s ("" if none does).
func lastLogLine(p *exporterProc, s string) string {
	var line string
	for l := range strings.Lines(p.Logs()) {
		if strings.Contains(l, s) {
			line = l
		}
	}
	return line
}

// runToExit runs the binary with args until it exits, and returns its exit code and
// output.
func runToExit(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(os.Environ(), env...)
	out, _ := cmd.CombinedOutput()
	return cmd.ProcessState.ExitCode(), string(out)
}

// checkOneLine fails the test unless out is one line that holds each of want.
func checkOneLine(t *testing.T, out string, want ...string) {
	t.Helper()
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 1 {
		t.Errorf("want one line, got %d:\n%s", len(lines), out)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output does not say %q:\n%s", w, out)
		}
	}
}

// writeFile writes content into dir/name and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// replaceFile replaces path's contents in one step (a rename), as editors and Kubernetes
// do, so that a reader never sees a half-written file.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path+".new", []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

// ownServer starts a server of the test's own, for what is server-wide (roles, a stop and
// a start, a major), and returns it with a fresh database on it.
func ownServer(t *testing.T, opts ...pgtest.ServerOption) (*pgtest.Server, *pgtest.DB) {
	t.Helper()
	srv := pgtest.NewServer(t, opts...)
	return srv, pgtest.NewDBOn(t, srv)
}

// newRole creates a login role with password pw on srv, with the attributes given
// ("SUPERUSER"), and returns the DSN that logs into db as it.
func newRole(t *testing.T, srv *pgtest.Server, db *pgtest.DB, role, pw string, attributes ...string) string {
	t.Helper()
	db.Exec(t, fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD '%s' %s`, role, pw, strings.Join(attributes, " ")))
	return roleDSN(srv, db, role, pw)
}

// roleDSN is the DSN that logs into db on srv as role with password pw.
func roleDSN(srv *pgtest.Server, db *pgtest.DB, role, pw string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable", srv.Port, role, pw, db.Name)
}

// checkCollectors fails the test unless every collector named succeeded in the scrape.
func checkCollectors(t *testing.T, who, body string, names ...string) {
	t.Helper()
	for _, c := range names {
		if !strings.Contains(body, `pg_liveness_scrape_collector_success{collector="`+c+`"} 1`) {
			t.Errorf("%s: collector %s failed", who, c)
		}
	}
}
