package faults

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/proctest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
	"github.com/pg-liveness/pg_liveness_exporter/tools/internal/binaries"
)

var (
	trialsFlag = flag.Int("faults.trials", 1, "trials per scenario")
	reportFlag = flag.String("faults.report", "", "write the failover report (Markdown) to this file after the run")
)

const schema = "liveness"

// The binaries TestMain builds: the exporter and the faultagent.
var bins binaries.Built

func TestMain(m *testing.M) {
	binaries.Main(m, "pg_liveness_faults_bin_", &bins, func(code int) int {
		if *reportFlag != "" {
			if err := writeReport(*reportFlag); err != nil {
				fmt.Fprintln(os.Stderr, "failover report:", err)
				return 1
			}
		}
		return code
	})
}

func trials() int { return max(1, *trialsFlag) }

// ---- results -------------------------------------------------------------------------

var results struct {
	sync.Mutex
	scenarios []Scenario
}

// record adds a scenario's measurements to the report. Called once per scenario test,
// also when its assertions fail, so that the report shows the measured numbers.
func record(s Scenario) {
	results.Lock()
	defer results.Unlock()
	results.scenarios = append(results.scenarios, s)
}

func writeReport(path string) error {
	results.Lock()
	sc := append([]Scenario(nil), results.scenarios...)
	results.Unlock()
	sort.SliceStable(sc, func(i, j int) bool {
		return sc[i].Number < sc[j].Number || sc[i].Number == sc[j].Number && sc[i].Name < sc[j].Name
	})
	r := Report{Generated: time.Now(), Machine: machine(), Scenarios: sc}
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		r.Revision = strings.TrimSpace(string(out))
		// The report itself does not count: the runs of the other majors rewrite it in turn.
		abs, _ := filepath.Abs(path)
		if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no", "--", ":/", ":(exclude)"+abs).Output(); err == nil && len(st) > 0 {
			r.Revision += " (with uncommitted changes)"
		}
	}
	defaults, err := exporterDefaults()
	if err != nil {
		return err
	}
	for _, name := range binaries.AgentFlags {
		r.Defaults = append(r.Defaults, Setting{name, defaults[name]})
	}
	// The sections of the other majors are kept; a run on one of them rewrites only its own.
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	sections := MajorSections(string(old))
	major, err := pgtest.Major()
	if err != nil {
		return err
	}
	var doc, section strings.Builder
	if major == 0 {
		err = r.WriteMarkdown(&doc)
	} else {
		doc.Write(old)
		err = r.WriteMajorSection(&section, major)
		sections[major] = section.String()
	}
	if err != nil {
		return err
	}
	return os.WriteFile(path, []byte(SpliceMajors(doc.String(), sections)), 0o644)
}

func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if dir, err := pgtest.FindBinDir(); err == nil {
		if out, err := exec.Command(filepath.Join(dir, "postgres"), "--version").Output(); err == nil {
			m.PostgreSQL = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(out)), "postgres (PostgreSQL) "))
		}
	}
	return m
}

var (
	defaultsOnce sync.Once
	defaultsMap  map[string]string
	defaultsErr  error
)

// exporterDefaults reads the agent flags' defaults from the exporter's own help, so the
// agents in this suite run with whatever the binary ships.
func exporterDefaults() (map[string]string, error) {
	defaultsOnce.Do(func() { defaultsMap, defaultsErr = bins.AgentDefaults() })
	return defaultsMap, defaultsErr
}

func defaultDuration(t testing.TB, name string) time.Duration {
	t.Helper()
	d, err := exporterDefaults()
	if err != nil {
		t.Fatal(err)
	}
	v, err := time.ParseDuration(d[name])
	if err != nil {
		t.Fatalf("default of --%s: %v", name, err)
	}
	return v
}

// ---- the database --------------------------------------------------------------------

// env is one scenario's database: a server of the scenario's own, a database with the
// migrations applied and a fencing log table.
type env struct {
	srv *pgtest.Server
	db  *pgtest.DB
	dsn string // for agents and observers
}

func newEnv(t *testing.T, opts ...pgtest.ServerOption) *env {
	t.Helper()
	// Commits must survive an immediate shutdown, as they do in production: the harness
	// default (synchronous_commit=off) would lose the last rows written before it.
	opts = append([]pgtest.ServerOption{pgtest.WithSetting("synchronous_commit", "on")}, opts...)
	srv := pgtest.NewServer(t, opts...)
	db := pgtest.NewDBOn(t, srv)
	prepare(t, db.DSN)
	return &env{srv: srv, db: db, dsn: db.DSN}
}

// prepare applies the migrations and creates the fencing log the lease holders write.
func prepare(t *testing.T, dsn string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn := connect(t, ctx, dsn)
	defer conn.Close(context.Background())
	if _, err := migrations.Apply(ctx, conn, schema); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE public.fence_log (
		id bigserial PRIMARY KEY, lease text NOT NULL, epoch bigint NOT NULL,
		writer text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatalf("fence_log: %v", err)
	}
}

// ---- processes -----------------------------------------------------------------------

// event is one JSON line of a faultagent.
type event struct {
	At    time.Time
	Ev    string
	Inst  string
	Lease string
	Epoch int64
	Held  bool
	Cause string
}

// proc is a child process (a faultagent, the exporter or Prometheus) and the events it
// printed.
type proc struct {
	*proctest.Process
	t testing.TB

	mu     sync.Mutex
	events []event
}

type procOpts struct {
	netns string // run inside this network namespace
}

func startProc(t testing.TB, name string, o procOpts, bin string, args ...string) *proc {
	t.Helper()
	argv := append([]string{bin}, args...)
	if o.netns != "" {
		argv = append([]string{"ip", "netns", "exec", o.netns}, argv...)
	}
	p := &proc{t: t}
	p.Process = proctest.Start(t, name, proctest.Options{OnLine: p.addEvent}, argv[0], argv[1:]...)
	return p
}

// addEvent keeps a line of a faultagent's output that is an event.
func (p *proc) addEvent(line string) {
	var raw struct {
		T     int64  `json:"t"`
		Ev    string `json:"ev"`
		Inst  string `json:"inst"`
		Lease string `json:"lease"`
		Epoch int64  `json:"epoch"`
		Held  bool   `json:"held"`
		Cause string `json:"cause"`
	}
	if json.Unmarshal([]byte(line), &raw) != nil || raw.Ev == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events = append(p.events, event{time.Unix(0, raw.T), raw.Ev, raw.Inst, raw.Lease, raw.Epoch, raw.Held, raw.Cause})
}

// Events returns the events named ev (all when ev is "") at or after since.
func (p *proc) Events(ev string, since time.Time) []event {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []event
	for _, e := range p.events {
		if (ev == "" || e.Ev == ev) && !e.At.Before(since) {
			out = append(out, e)
		}
	}
	return out
}

func (p *proc) Signal(sig syscall.Signal) { p.Process.Signal(p.t, sig) }

// Stop ends the process: SIGCONT (in case it is stopped) and SIGTERM, SIGKILL after 10 s.
func (p *proc) Stop() { p.Process.Stop(10 * time.Second) }

// Kill is kill -9, and waits until the process is gone.
func (p *proc) Kill() { p.Process.Kill(p.t) }

// agentOpts start a faultagent.
type agentOpts struct {
	service   string
	instances int
	lease     string
	leaseTTL  time.Duration
	hold      time.Duration
	noAgent   bool
	netns     string
	dsn       string // default: the env's
	directDSN string
	timing    []string // extra --agent.* flags, after the defaults
	extra     []string
}

// agent is a running faultagent and its instance ids (in order of readiness).
type agent struct {
	*proc
	ids      []uuid.UUID
	services []string
}

func startAgent(t *testing.T, e *env, o agentOpts) *agent {
	t.Helper()
	dsn := o.dsn
	if dsn == "" {
		dsn = e.dsn
	}
	args := []string{"--dsn=" + dsn, "--schema=" + schema, "--service=" + o.service}
	if o.directDSN != "" {
		args = append(args, "--direct-dsn="+o.directDSN)
	}
	if o.instances > 1 {
		args = append(args, fmt.Sprintf("--instances=%d", o.instances))
	}
	if o.noAgent {
		args = append(args, "--agent=false")
	}
	if o.lease != "" {
		args = append(args, "--lease="+o.lease)
		if o.leaseTTL > 0 {
			args = append(args, "--lease.ttl="+o.leaseTTL.String())
		}
		if o.hold > 0 {
			args = append(args, "--lease.hold="+o.hold.String())
		}
	}
	d, err := exporterDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range binaries.AgentFlags {
		args = append(args, "--"+name+"="+d[name])
	}
	args = append(args, o.timing...)
	args = append(args, o.extra...)
	a := &agent{proc: startProc(t, "faultagent "+o.service, procOpts{netns: o.netns}, bins.Agent, args...)}
	n := max(1, o.instances)
	testutil.Eventually(t, 60*time.Second, "faultagent "+o.service+" ready", func() bool {
		return len(a.Events("ready", time.Time{})) >= n || !a.Running()
	})
	if !a.Running() {
		t.Fatalf("faultagent %s exited at start", o.service)
	}
	for _, ev := range a.Events("ready", time.Time{}) {
		a.ids = append(a.ids, uuid.MustParse(ev.Inst))
	}
	for i := range a.ids {
		if n > 1 {
			a.services = append(a.services, fmt.Sprintf("%s-%d", o.service, i))
		} else {
			a.services = append(a.services, o.service)
		}
	}
	// Ready events come in instance order, so services match ids by position.
	return a
}

// observer is the exporter started with --no-agent, the way an operator watches a fleet.
type observer struct {
	*proc
	url string
}

func startObserver(t *testing.T, dsn string, flags ...string) *observer {
	t.Helper()
	addr := testutil.FreeAddr(t)
	args := append([]string{"--no-agent", "--web.listen-address=" + addr, "--db.dsn=" + dsn,
		"--db.schema=" + schema, "--log.level=warn"}, flags...)
	o := &observer{proc: startProc(t, "observer", procOpts{}, bins.Exporter, args...), url: "http://" + addr + "/metrics"}
	testutil.Eventually(t, 30*time.Second, "observer answering", func() bool {
		resp, err := http.Get(o.url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return o
}

// startWatchedAgent is the set-up of the scenarios measured at the defaults: an observer
// and a sampler at the default stale threshold on e.dsn, and the agent o describes,
// watched by the sampler.
func startWatchedAgent(t *testing.T, e *env, o agentOpts) (*verdictLog, *agent) {
	t.Helper()
	obs := startObserver(t, e.dsn)
	s := startSampler(t, e.dsn, defaultDuration(t, "agent.stale-threshold"), obs)
	a := startAgent(t, e, o)
	s.Watch(a)
	return s, a
}
