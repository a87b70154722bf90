// Package proctest starts the programs that tests run beside the code under test: the
// exporter's own binary, built from this module, and Debian's prometheus, promtool and
// prometheus-alertmanager. Each runs in a process group of its own, with its output kept
// in memory, and is stopped when the test ends (or killed with the test binary, whatever
// ends it); when the test failed, its last lines are logged. A program that is not
// installed fails the test with the package to install.
package proctest

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// NeedTool returns the path of a Debian-packaged program, or fails the test with the
// package to install.
func NeedTool(t testing.TB, name, pkg string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found: apt-get install %s", name, pkg)
	}
	return path
}

// BuildExporter builds the exporter binary from the module root into a temporary
// folder, with the go build flags given (such as -race), and returns its path.
func BuildExporter(t testing.TB, flags ...string) string {
	t.Helper()
	goTool := NeedTool(t, "go", "golang-go")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "pg_liveness_exporter")
	cmd := exec.CommandContext(ctx, goTool, append(append([]string{"build"}, flags...), "-o", bin, ".")...)
	cmd.Dir = testutil.ModuleRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// keptLines is how many of a process's last output lines are kept.
const keptLines = 2000

// Process is a program the test started.
type Process struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{} // closed once Wait returned; err is set before
	err    error

	mu    sync.Mutex
	lines []string
}

// Options are what a program is started with besides its arguments.
type Options struct {
	// Env is added to the test's environment (a DSN there stays off the process list).
	Env []string
	// OnLine, when set, sees every line of the program's output as it comes, from the
	// goroutine that reads it.
	OnLine func(line string)
	// LogsOwnOutput: the caller keeps the whole output (through OnLine) and logs it when
	// the test fails, so Start does not log the last lines as well.
	LogsOwnOutput bool
}

// Start starts path with args. name says which program it is in the test's log.
func Start(t testing.TB, name string, o Options, path string, args ...string) *Process {
	t.Helper()
	p := &Process{name: name, exited: make(chan struct{})}
	p.cmd = exec.Command(path, args...)
	p.cmd.Env = append(os.Environ(), o.Env...)
	// Its own group, so that stopping it stops what it started; killed if the test binary
	// dies first.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	pr, pw := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = pw, pw
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
		for sc.Scan() {
			p.addLine(sc.Text())
			if o.OnLine != nil {
				o.OnLine(sc.Text())
			}
		}
		_, _ = io.Copy(io.Discard, pr) // a line too long: keep draining, or the program blocks
	}()
	go func() {
		p.err = p.cmd.Wait()
		pw.Close()
		<-read
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.Stop(10 * time.Second)
		if t.Failed() && !o.LogsOwnOutput {
			t.Logf("%s output (last lines):\n%s", name, p.lastLines(40))
		}
	})
	return p
}

func (p *Process) addLine(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lines = append(p.lines, line)
	if len(p.lines) > keptLines {
		p.lines = p.lines[len(p.lines)-keptLines/2:]
	}
}

func (p *Process) lastLines(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines[max(0, len(p.lines)-n):], "\n")
}

// Pid is the process's id (its process group's too).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Name is the name the process was started with.
func (p *Process) Name() string { return p.name }

// Logged reports whether a kept line of the output contains s.
func (p *Process) Logged(s string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.lines {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// Running reports whether the process has not exited.
func (p *Process) Running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Err is how the process ended; nil while it runs.
func (p *Process) Err() error {
	if p.Running() {
		return nil
	}
	return p.err
}

// Signal sends sig to the process itself.
func (p *Process) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Errorf("signal %v to %s: %v", sig, p.name, err)
	}
}

// Stop sends SIGCONT (in case it is stopped) and SIGTERM to the process group, and
// SIGKILL when the process has not exited after grace.
func (p *Process) Stop(grace time.Duration) {
	if !p.Running() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGCONT)
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
}

// Kill is kill -9 of the process group; it returns once the process has exited.
func (p *Process) Kill(t testing.TB) {
	t.Helper()
	if !p.Running() {
		t.Fatalf("%s exited before it was killed: %v", p.name, p.err)
	}
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill %s: %v", p.name, err)
	}
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s survived SIGKILL for 10 s", p.name)
	}
}

// WaitReady polls url until it answers 200, failing the test if the process exits first
// or within has passed.
func (p *Process) WaitReady(t testing.TB, url string, within time.Duration) {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	testutil.Eventually(t, within, p.name+" answering "+url, func() bool {
		if !p.Running() {
			t.Fatalf("%s exited (%v) before answering %s", p.name, p.err, url)
		}
		resp, err := client.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// WriteJSON writes v as JSON into dir/name and returns the path. JSON is YAML, so this
// writes the configuration files of Prometheus and Alertmanager.
func WriteJSON(t testing.TB, dir, name string, v any) string {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Prometheus is a running Prometheus server.
type Prometheus struct {
	*Process
	Addr string // host:port of its HTTP API
}

// StartPrometheus starts Debian's Prometheus with config (written as its configuration
// file, with the data in a temporary folder) on a free 127.0.0.1 port, and returns once
// it is ready.
func StartPrometheus(t testing.TB, config map[string]any, flags ...string) *Prometheus {
	t.Helper()
	bin := NeedTool(t, "prometheus", "prometheus")
	dir := t.TempDir()
	p := &Prometheus{Addr: testutil.FreeAddr(t)}
	p.Process = Start(t, "prometheus", Options{}, bin, append([]string{
		"--config.file=" + WriteJSON(t, dir, "prometheus.yml", config),
		"--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + p.Addr}, flags...)...)
	p.WaitReady(t, "http://"+p.Addr+"/-/ready", 60*time.Second)
	return p
}
