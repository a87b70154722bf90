package faults

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// startExporterAgent runs the exporter binary as an agent with instance id and service
// name of its own, and returns it as an agent the sampler can watch, and its metrics URL.
func startExporterAgent(t *testing.T, e *env, service string, flags ...string) (*agent, string) {
	t.Helper()
	id := uuid.New()
	addr := testutil.FreeAddr(t)
	args := append([]string{"--web.listen-address=" + addr, "--db.dsn=" + e.dsn, "--db.schema=" + schema,
		"--agent.instance-id=" + id.String(), "--agent.service-name=" + service}, flags...)
	p := startProc(t, "exporter agent "+service, procOpts{}, bins.Exporter, args...)
	url := "http://" + addr + "/metrics"
	testutil.Eventually(t, 30*time.Second, "the exporter agent answering", func() bool { _, err := scrapeValues(url); return err == nil })
	return &agent{proc: p, ids: []uuid.UUID{id}, services: []string{service}}, url
}

// scrapeValues returns every unlabelled sample of one scrape, and labelled ones under
// their full series text.
func scrapeValues(url string) (map[string]float64, error) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

// TestPgBouncerDirectDSN points the exporter agent's direct DSN at PgBouncer in
// transaction mode: it must detect it, claim no lock anywhere, beat at the fast cadence,
// and never be called dead.
func TestPgBouncerDirectDSN(t *testing.T) {
	const watch = 10 * time.Second
	sc := newScenario(t, 9, "PgBouncer in transaction mode as the direct DSN",
		"default agent flags; the exporter binary as the agent; PgBouncer ignores the keepalive start-up parameters")
	e := newEnv(t)
	bouncer := pgtest.NewPgBouncer(t, e.dsn, pgtest.WithIgnoreStartupParameters("tcp_keepalives_idle",
		"tcp_keepalives_interval", "tcp_keepalives_count", "tcp_user_timeout", "idle_session_timeout"))
	obs := startObserver(t, e.dsn)
	s := startSampler(t, e.dsn, defaultDuration(t, "agent.stale-threshold"), obs)
	fast := defaultDuration(t, "agent.heartbeat-interval")
	for trial := range trials() {
		t0 := time.Now()
		a, url := startExporterAgent(t, e, fmt.Sprintf("pgbouncer-%d", trial), "--db.direct-dsn="+bouncer.DSN(e.db.Name))
		s.Watch(a)
		ok := testutil.Poll(30*time.Second, func() bool { return a.Logged("transaction pooling") })
		sc.observe("pooler detected (log line)", 30*time.Second, time.Since(t0), ok)
		if !ok {
			t.Errorf("no log line naming transaction pooling")
		}
		// The window opens once the agent has joined (its row written, and the observer
		// lists its service): before that, every consumer rightly reads it as not alive,
		// as any process not yet started.
		var joined, listed time.Duration
		if !testutil.Poll(30*time.Second, func() bool {
			var rowOK, listedOK bool
			joined, rowOK = s.firstSQL(t0, func(smp sqlSample) bool { return smp.Inst[a.ids[0]].Row })
			listed, listedOK = s.firstExp(t0, func(smp expSample) bool { return smp.States[a.services[0]] != "" })
			return rowOK && listedOK
		}) {
			t.Fatalf("the agent's row was never written through the pool, or the observer never listed it")
		}
		tw := t0.Add(max(joined, listed))
		testutil.Never(t, watch, "the alive lock granted through PgBouncer", func() bool {
			_, granted := s.firstSQL(t0, func(smp sqlSample) bool { return smp.Inst[a.ids[0]].Locked })
			return granted
		})
		m, err := scrapeValues(url)
		if err != nil {
			t.Fatal(err)
		}
		if v := m["pg_liveness_agent_alive_lock_held"]; v != 0 {
			t.Errorf("pg_liveness_agent_alive_lock_held = %v, want 0", v)
		}
		if v := m["pg_liveness_agent_heartbeat_interval_seconds"]; v != fast.Seconds() {
			t.Errorf("pg_liveness_agent_heartbeat_interval_seconds = %v, want the fast %v", v, fast.Seconds())
		}
		sc.addFalseDead(s.falseDead(tw, time.Now(), []*agent{a}))
		a.Stop()
	}
	sc.s.Trials = trials()
	sc.note("Each trial also checks: no alive lock granted in pg_locks, pg_liveness_agent_alive_lock_held 0, heartbeat at the fast interval.")
}

// TestReadOnlyDatabase makes every new transaction read-only: the exporter keeps serving,
// the agent counts heartbeat failures without crashing, and beats again once writes
// return.
func TestReadOnlyDatabase(t *testing.T) {
	timing := []string{"--agent.heartbeat-interval=1s", "--agent.heartbeat-slow-interval=2s",
		"--agent.stale-threshold=4s", "--agent.definitive-dead-cutoff=8s"}
	// Shorter than the definitive-dead cutoff (8 s) minus a slow interval: a live agent
	// that cannot write for that long is still alive by its lock. (Past the cutoff it would
	// look exactly like a hung process, and be called a zombie.)
	const readOnlyFor, window = 4 * time.Second, 30 * time.Second
	sc := newScenario(t, 10, "Read-only database (default_transaction_read_only)",
		fmt.Sprintf("the exporter binary as the agent, %v; read-only for %s", timing, readOnlyFor))
	e := newEnv(t)
	obs := startObserver(t, e.dsn, "--agent.stale-threshold=4s", "--agent.definitive-dead-cutoff=8s")
	s := startSampler(t, e.dsn, 4*time.Second, obs)
	a, url := startExporterAgent(t, e, "readonly", timing...)
	s.Watch(a)
	metric := func(name string) float64 {
		m, err := scrapeValues(url)
		if err != nil {
			t.Fatalf("the exporter stopped serving: %v", err)
		}
		if m["pg_liveness_up"] != 1 {
			t.Errorf("pg_liveness_up = %v while the database is read-only", m["pg_liveness_up"])
		}
		return m[name]
	}
	for range trials() {
		waitHealthy(t, s, a, true)
		failures := metric("pg_liveness_agent_heartbeat_failures_total")
		t0 := time.Now()
		execSQL(t, e.dsn, "ALTER SYSTEM SET default_transaction_read_only = on")
		execSQL(t, e.dsn, "SELECT pg_reload_conf()")
		var seen time.Duration
		ok := testutil.Poll(window, func() bool {
			seen = time.Since(t0)
			return metric("pg_liveness_agent_heartbeat_failures_total") > failures
		})
		sc.observe("agent reports heartbeat failures", window, seen, ok)
		if !testutil.Never(t, readOnlyFor-min(readOnlyFor, time.Since(t0)), "the exporter agent exited while the database was read-only",
			func() bool { return !a.Running() }) {
			t.FailNow()
		}
		beats := metric("pg_liveness_agent_heartbeats_total")
		tw := time.Now()
		// A session of its own may still write; pgx sends unknown DSN keys as parameters.
		execSQL(t, e.dsn+" default_transaction_read_only=off", "ALTER SYSTEM RESET default_transaction_read_only")
		execSQL(t, e.dsn, "SELECT pg_reload_conf()")
		ok = testutil.Poll(window, func() bool { seen = time.Since(tw); return metric("pg_liveness_agent_heartbeats_total") > beats })
		sc.observe("heartbeat succeeds again after writes return", window, seen, ok)
		n, first := s.falseDead(t0, time.Now(), []*agent{a})
		sc.addFalseDead(n, first)
	}
	sc.note("The database stays read-only for %s, less than the definitive-dead cutoff (8 s) minus a slow interval; a longer read-only period makes the live agent a zombie (lock held, no heartbeat), as a hung process is.", readOnlyFor)
	sc.bound("heartbeat succeeds again after writes return", 0, 10*time.Second)
	sc.s.Trials = trials()
}
