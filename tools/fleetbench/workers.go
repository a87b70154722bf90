package fleetbench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A process of agents (Config.Processes) is the benchmark's own binary started again with
// agentsEnv set to its share, as JSON; its TestMain calls Serve first.
const agentsEnv = "PG_LIVENESS_FLEETBENCH_AGENTS"

// share is what one process of agents runs: the run's configuration (its DSNs, jobs and
// pool size), the node agents and agents it runs by index, and where the node agents'
// sockets are.
type share struct {
	PoolDSN      string   `json:"pool_dsn"`
	DirectDSN    string   `json:"direct_dsn"`
	Jobs         []string `json:"jobs"`
	PoolMaxConns int32    `json:"pool_max_conns"`
	StartRate    int      `json:"start_rate"`
	Nodes        int      `json:"nodes"` // the run's node agents, all processes'
	SocketDir    string   `json:"socket_dir"`
	Nice         int      `json:"nice"` // this process's niceness, when above 0 (Config.FleetNice)
	RunNodes     []int    `json:"run_nodes"`
	RunAgents    []int    `json:"run_agents"`
}

// Serve makes this process one of Run's helpers when Run started it as one (the
// application's lookup, or a process of agents), and never returns then; otherwise it
// returns at once. A test binary that calls Run calls Serve first in its TestMain.
func Serve() {
	if dsn := os.Getenv(lookupDSNEnv); dsn != "" {
		exit(serveLookup(dsn, os.Getenv(lookupRateEnv), os.Getenv(lookupSessionsEnv), os.Stdin, os.Stdout))
	}
	if spec := os.Getenv(agentsEnv); spec != "" {
		exit(serveAgents(spec, os.Stdin, os.Stdout))
	}
}

func exit(err error) {
	if err != nil {
		fmt.Fprintln(os.Stdout, "error:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// serveAgents runs a process's share of the fleet. It starts its node agents and agents,
// answers "ready", then reads commands on stdin: "follow" makes every agent campaign for
// victimLease too. Each start of an agent's job for victimLease is written as "led <Unix
// nanoseconds>". It stops its agents and returns when stdin closes (its parent ended).
func serveAgents(spec string, in io.Reader, out io.Writer) error {
	var s share
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		return fmt.Errorf("%s: %w", agentsEnv, err)
	}
	if s.Nice > 0 {
		if err := lowerPriority(s.Nice); err != nil {
			return err
		}
	}
	cfg := Config{PoolDSN: s.PoolDSN, DirectDSN: s.DirectDSN, Jobs: s.Jobs, PoolMaxConns: s.PoolMaxConns, Nodes: s.Nodes,
		// Only what stops an agent: a process's warnings, thousands of agents', would bury the test's output.
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))}
	f, err := newFleet(cfg, s.SocketDir)
	if err != nil {
		return err
	}
	defer f.stop()
	var mu sync.Mutex
	f.onStart = func(at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		_, _ = fmt.Fprintf(out, "led %d\n", at.UnixNano())
	}
	// Starting thousands of agents takes minutes: stdin is read from the start, so that a
	// parent that ends meanwhile (its end of stdin closes) ends the start too.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	commands := make(chan string)
	var readErr error
	go func() {
		defer cancel()
		defer close(commands)
		lines := bufio.NewScanner(in)
		for lines.Scan() {
			commands <- lines.Text()
		}
		readErr = lines.Err()
	}()
	if err := f.startShare(ctx, s.RunNodes, s.RunAgents, max(s.StartRate, 1)); err != nil {
		return err
	}
	mu.Lock()
	_, err = fmt.Fprintln(out, "ready")
	mu.Unlock()
	if err != nil {
		return err
	}
	for c := range commands {
		switch c {
		case "follow":
			for _, ag := range f.list() {
				ag.campaign(f, victimLease)
			}
		default:
			return fmt.Errorf("unknown command %q", c)
		}
	}
	return readErr
}

// workers is Run's end of the processes of agents.
type workers struct {
	procs []*worker
}

type worker struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	ready chan struct{} // closed at its "ready"
	done  chan struct{} // closed when its output ends
	mu    sync.Mutex
	last  error // what it reported, or why its output ended early
}

// startWorkers starts Config.Processes processes, each with its share of f's node agents
// and agents, and waits until every one has started its agents. Their starts of
// victimLease's job count in f as its own agents' do.
func startWorkers(ctx context.Context, f *fleet) (*workers, error) {
	cfg := f.cfg
	shares := make([]share, cfg.Processes)
	for p := range shares {
		shares[p] = share{PoolDSN: cfg.PoolDSN, DirectDSN: cfg.DirectDSN, Jobs: cfg.Jobs, PoolMaxConns: cfg.PoolMaxConns,
			StartRate: max(cfg.StartRate/cfg.Processes, 1), Nodes: cfg.Nodes, SocketDir: f.dir, Nice: cfg.FleetNice}
	}
	// An agent lives in the process of the node agent it attaches to.
	for n := range cfg.Nodes {
		shares[n%cfg.Processes].RunNodes = append(shares[n%cfg.Processes].RunNodes, n)
	}
	for i := range cfg.Agents {
		p := i % cfg.Processes
		if cfg.Nodes > 0 {
			p = (i % cfg.Nodes) % cfg.Processes
		}
		shares[p].RunAgents = append(shares[p].RunAgents, i)
	}
	w := &workers{}
	for _, s := range shares {
		spec, err := json.Marshal(s)
		if err != nil {
			w.stop()
			return nil, err
		}
		p, err := w.start(string(spec), f)
		if err != nil {
			w.stop()
			return nil, err
		}
		w.procs = append(w.procs, p)
	}
	// Each starts its share at its rate, all at once; give them twice that, and a minute.
	most := 0
	for _, s := range shares {
		most = max(most, len(s.RunAgents)/s.StartRate)
	}
	deadline := time.After(time.Duration(2*most)*time.Second + time.Minute)
	for i, p := range w.procs {
		select {
		case <-p.ready:
		case <-p.done:
			w.stop()
			return nil, fmt.Errorf("fleetbench: process of agents %d ended before it was ready: %v", i, p.err())
		case <-deadline:
			w.stop()
			return nil, fmt.Errorf("fleetbench: process of agents %d was not ready in time", i)
		case <-ctx.Done():
			w.stop()
			return nil, ctx.Err()
		}
	}
	return w, nil
}

func (w *workers) start(spec string, f *fleet) (*worker, error) {
	// -test.run=^$: a test binary whose TestMain does not call Serve runs no test and
	// exits, instead of running the suite again; the missing "ready" says why.
	cmd, stdin, stdout, err := startHelper(agentsEnv + "=" + spec)
	if err != nil {
		return nil, fmt.Errorf("fleetbench: a process of agents: %w", err)
	}
	p := &worker{cmd: cmd, stdin: stdin, ready: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		lines := bufio.NewScanner(stdout)
		ready := false
		for lines.Scan() {
			line := lines.Text()
			switch {
			case line == "ready":
				ready = true
				close(p.ready)
			case strings.HasPrefix(line, "led "):
				ns, err := strconv.ParseInt(strings.TrimPrefix(line, "led "), 10, 64)
				if err == nil {
					f.starts.Add(1)
					f.othersLed.Store(max(f.othersLed.Load(), ns))
				}
			case strings.HasPrefix(line, "error: "):
				p.setErr(errors.New(strings.TrimPrefix(line, "error: ")))
			}
		}
		if !ready {
			p.setErr(errors.New("it ended before it was ready (does the test binary's TestMain call fleetbench.Serve?)"))
		}
		p.setErr(errors.New("it ended"))
		_, _ = io.Copy(io.Discard, stdout)
	}()
	return p, nil
}

// lowerPriority sets every thread of this process to niceness nice. Linux keeps a
// niceness per thread and a new thread takes its creator's, so once every thread has it
// the threads the runtime starts later have it too; a pass that finds none left to
// change ends it (a thread started while the last pass ran is seen by the next).
func lowerPriority(nice int) error {
	for range 10 {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("fleetbench: this process's threads: %w", err)
		}
		changed := 0
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			// getpriority(2)'s raw syscall answers 20 - nice.
			if prio, err := syscall.Getpriority(syscall.PRIO_PROCESS, tid); err == nil && 20-prio == nice {
				continue
			}
			if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, nice); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("fleetbench: niceness %d for thread %d: %w", nice, tid, err)
			}
			changed++
		}
		if changed == 0 {
			return nil
		}
	}
	return fmt.Errorf("fleetbench: niceness %d: threads kept starting at the old one", nice)
}

// startHelper starts this test binary again as one of Run's helpers, with env added to
// its environment, and returns its stdin and stdout.
func startHelper(env ...string) (*exec.Cmd, io.WriteCloser, io.ReadCloser, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, nil, err
	}
	// -test.run=^$: a test binary whose TestMain does not call Serve runs no test and
	// exits, instead of running the suite again; the missing "ready" says why.
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, err
	}
	return cmd, stdin, stdout, nil
}

func (p *worker) setErr(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last == nil {
		p.last = err
	}
}

func (p *worker) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// follow makes every process's agents campaign for victimLease.
func (w *workers) follow() error {
	for i, p := range w.procs {
		if _, err := io.WriteString(p.stdin, "follow\n"); err != nil {
			return fmt.Errorf("fleetbench: process of agents %d: %w", i, err)
		}
	}
	return nil
}

// err is why a process of agents ended, while Run still needs it; nil while all run.
func (w *workers) err() error {
	for i, p := range w.procs {
		select {
		case <-p.done:
			return fmt.Errorf("fleetbench: process of agents %d: %v", i, p.err())
		default:
		}
	}
	return nil
}

// stop ends every process: closing its stdin stops its agents, which end their sessions;
// one that has not ended a minute later is killed.
func (w *workers) stop() {
	for _, p := range w.procs {
		_ = p.stdin.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range w.procs {
		exited := make(chan struct{})
		go func() { <-p.done; _ = p.cmd.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-ctx.Done():
			_ = p.cmd.Process.Kill()
			<-exited
		}
	}
}
