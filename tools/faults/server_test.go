package faults

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// restartAgents is how many instances ride through a PostgreSQL restart.
const restartAgents = 20

// TestRestartFast and TestRestartImmediate restart PostgreSQL under 20 instances and
// measure when every one holds its lock again, bounded from the server answering; once
// the server answers, no sample may call any of them dead.
func TestRestartFast(t *testing.T) { testRestart(t, 5, "fast") }

func TestRestartImmediate(t *testing.T) { testRestart(t, 5, "immediate") }

func testRestart(t *testing.T, number int, mode string) {
	sc := newScenario(t, number, fmt.Sprintf("PostgreSQL restart (-m %s), %d instances", mode, restartAgents),
		fmt.Sprintf("default agent flags; %d instances in one process", restartAgents))
	e := newEnv(t)
	s, fleet := startWatchedAgent(t, e, agentOpts{service: "restart", instances: restartAgents})
	const window = 60 * time.Second
	for range trials() {
		waitHealthy(t, s, fleet, true)
		t0 := time.Now()
		if err := e.srv.StopMode(mode); err != nil {
			t.Fatal(err)
		}
		if err := e.srv.Start(); err != nil {
			t.Fatal(err)
		}
		up := time.Now()
		sc.observeRelock(s, fleet, "every lock held again", "the server answering", window, t0, up)
		sc.watchFalseDead(s, up, falseDeadWatch, fleet)
	}
	sc.bound("every lock held again, from the server answering", 0, relockBound)
	sc.s.Trials = trials()
	sc.note("False-dead verdicts are counted from the moment the restarted server answers until %s after every lock is held again.", falseDeadWatch)
	sc.note("The lock is bounded from the server answering at the alive lock's reconnect backoff ceiling (10 s) plus a second; the time from the stop adds the server's own restart.")
}

// TestTerminateBackend ends the alive lock's session with pg_terminate_backend: the agent
// must claim its lock again within the first reconnect's bound, and nothing may call it
// dead meanwhile.
func TestTerminateBackend(t *testing.T) {
	sc := newScenario(t, 6, "pg_terminate_backend of the alive-lock session", "default agent flags")
	e := newEnv(t)
	s, victim := startWatchedAgent(t, e, agentOpts{service: "terminate"})
	id := victim.ids[0]
	const window = 60 * time.Second
	for range trials() {
		waitHealthy(t, s, victim, true)
		pid := lastSQL(s).Inst[id].LockPID
		t0 := time.Now()
		execSQL(t, e.dsn, "SELECT pg_terminate_backend($1)", pid)
		var reclaim time.Duration
		ok := testutil.Poll(window, func() bool {
			var ok bool
			reclaim, ok = s.firstSQL(t0, func(smp sqlSample) bool { v := smp.Inst[id]; return v.Locked && v.LockPID != pid })
			return ok
		})
		sc.observe("lock claimed again", window, reclaim, ok)
		sc.watchFalseDead(s, t0, falseDeadWatch, victim)
	}
	sc.bound("lock claimed again", reclaimMedian, reclaimWorst)
	sc.s.Trials = trials()
	sc.note("The session that held the lock is reconnected at the first retry, within 250 ms of its end; the bound adds the connection, the claim and a sample.")
}

// TestPoolExhaustion holds every connection of the agent's pool in long transactions:
// the alive lock has its own connection, so the lock and the verdict must not change.
func TestPoolExhaustion(t *testing.T) {
	// Mostly waiting on timers: run beside the other waiting scenarios, so that
	// make faults stays short.
	t.Parallel()
	const busy = 10 * time.Second
	sc := newScenario(t, 7, "Pool exhaustion (every pool connection in a long transaction)",
		fmt.Sprintf("default agent flags, --db.max-conns=2; the pool is held busy for %s", busy))
	e := newEnv(t)
	s, victim := startWatchedAgent(t, e, agentOpts{service: "pool", extra: []string{"--max-conns=2", "--busy-for=" + busy.String()}})
	id := victim.ids[0]
	lockLost := 0
	for range trials() {
		waitHealthy(t, s, victim, true)
		t0 := time.Now()
		victim.Signal(syscall.SIGUSR1)
		testutil.Eventually(t, 10*time.Second, "the pool busy", func() bool { return len(victim.Events("busy", t0)) > 0 })
		testutil.Eventually(t, busy+15*time.Second, "the pool idle again", func() bool { return len(victim.Events("idle", t0)) > 0 })
		for _, smp := range s.sqlSince(t0) {
			if !smp.Inst[id].Locked {
				lockLost++
			}
		}
		n, first := s.falseDead(t0, time.Now(), []*agent{victim})
		sc.addFalseDead(n, first)
		if errs := victim.Events("busy_error", t0); len(errs) > 0 {
			t.Errorf("the pool could not be held busy: %+v", errs[0])
		}
	}
	if lockLost > 0 {
		t.Errorf("%d samples found the alive lock not held while the pool was busy", lockLost)
	}
	sc.note("Samples with the alive lock not held while the pool was busy: %d.", lockLost)
	sc.s.Trials = trials()
}

// TestLeaseContention runs 32 processes competing for one lease, each holding it briefly
// and writing to the fencing log under lease_is_held: no two holders at once, no write
// under a stale epoch, and epochs strictly increasing from one holder to the next.
func TestLeaseContention(t *testing.T) {
	const (
		procs  = 32
		rounds = 30
		ttl    = 2 * time.Second
		hold   = 300 * time.Millisecond
	)
	sc := newScenario(t, 8, fmt.Sprintf("Lease contention (%d processes)", procs),
		fmt.Sprintf("lease ttl %s, each holder keeps it %s and writes every 50 ms; at least %d rounds per trial", ttl, hold, rounds))
	e := newEnv(t)
	const window = 120 * time.Second
	for trial := range trials() {
		lease := fmt.Sprintf("contended-%d", trial)
		var all []*agent
		for i := range procs {
			all = append(all, startAgent(t, e, agentOpts{service: fmt.Sprintf("contend-%d", i), noAgent: true,
				lease: lease, leaseTTL: ttl, hold: hold, extra: []string{"--max-conns=1", "--lease.retry=100ms"}}))
		}
		t0 := time.Now()
		acquisitions := func() []event {
			var evs []event
			for _, a := range all {
				evs = append(evs, a.Events("acquired", time.Time{})...)
			}
			return evs
		}
		ok := testutil.Poll(window, func() bool { return len(acquisitions()) >= rounds })
		sc.observe(fmt.Sprintf("%d rounds", rounds), window, time.Since(t0), ok)
		for _, a := range all {
			a.Stop()
		}
		evs := acquisitions()
		sortEvents(evs)
		for i := 1; i < len(evs); i++ {
			if evs[i].Epoch <= evs[i-1].Epoch {
				t.Errorf("epoch %d taken after epoch %d", evs[i].Epoch, evs[i-1].Epoch)
			}
		}
		holders := map[string]bool{}
		for _, ev := range evs {
			holders[ev.Inst] = true
		}
		sc.note("Trial %d: %d acquisitions by %d distinct processes.", trial+1, len(evs), len(holders))
		sc.fence(e.dsn, lease)
	}
	sc.s.Trials = trials()
}

func sortEvents(evs []event) {
	for i := 1; i < len(evs); i++ {
		for j := i; j > 0 && evs[j].At.Before(evs[j-1].At); j-- {
			evs[j], evs[j-1] = evs[j-1], evs[j]
		}
	}
}

func lastSQL(s *verdictLog) sqlSample {
	smp := s.sqlSamples()
	if len(smp) == 0 {
		return sqlSample{}
	}
	return smp[len(smp)-1]
}

// execSQL runs one statement and fails the test on error.
func execSQL(t *testing.T, dsn, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := connect(t, ctx, dsn)
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// connect opens a connection to dsn, failing the test when it cannot.
func connect(t *testing.T, ctx context.Context, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	return conn
}
