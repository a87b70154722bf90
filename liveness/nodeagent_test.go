package liveness_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/nodeagenttest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// sessionsNamed counts the database's sessions whose application_name ends with suffix.
func sessionsNamed(t *testing.T, db *pgtest.DB, suffix string) int {
	t.Helper()
	return db.QueryInt(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE '%' || $1`, suffix)
}

// The node agent holds the alive locks of every process attached to it on one session:
// three agents, one liveness backend and no session of their own; their locks count by
// the verdict (the row records the node agent's backend), they lead through it (proofs
// are the node agent's verifications), and a process whose connection closes without a
// word (what kill -9 leaves) is dead about a lock grace later.
func TestNodeAgentHoldsItsProcessesLocksOnOneSession(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 8)
	ctx := testutil.Context(t, time.Minute)
	socket := filepath.Join(t.TempDir(), "agent.sock")
	node, _ := nodeagenttest.Start(t, db, socket)

	var agents []*liveness.Agent
	for i := range 3 {
		cfg := liveness.AgentConfig{Pool: pool, NodeAgentSocket: socket, InstanceID: uuid.New(), ServiceName: "attached"}
		if i == 0 {
			cfg.Reaper = true
		}
		a := newAgent(t, cfg)
		runAgent(t, a)
		agents = append(agents, a)
	}
	if n := sessionsNamed(t, db, ":alive-lock"); n != 0 {
		t.Errorf("%d alive-lock sessions of their own; want none", n)
	}
	if n := sessionsNamed(t, db, ":node-agent"); n != 1 {
		t.Errorf("%d node agent sessions; want 1", n)
	}
	r, err := liveness.NewReader(liveness.ReaderConfig{DB: pool})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		id := a.Snapshot().InstanceID
		testutil.Eventually(t, 10*time.Second, "an attached instance alive by its lock", func() bool {
			st, err := r.Instance(ctx, id)
			return err == nil && st.State == liveness.StateAlive && st.LockHeld
		})
	}
	if s := node.Snapshot(); s.Attached != 3 || s.LocksHeld != 3 {
		t.Errorf("node agent snapshot %+v; want 3 attached, 3 locks held", s)
	}

	// Leading through it: a lease is trusted only after a proof sent after the
	// acquisition, which the node agent's verification gives.
	led := make(chan *liveness.Lease, 1)
	campaign, stopCampaign := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopCampaign()
	wg.Go(func() {
		_ = agents[1].Elect(campaign, liveness.ElectorConfig{Lease: "node-job", OnStartedLeading: func(ctx context.Context, self *liveness.Lease) {
			led <- self
			<-ctx.Done()
		}})
	})
	select {
	case self := <-led:
		if _, err := self.Exec(ctx, pool, `SELECT 1`); err != nil {
			t.Fatalf("a fenced statement of a leader through the node agent: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the attached agent did not lead within 15 s")
	}
	proofsBefore := node.Snapshot().ProveAsked
	time.Sleep(time.Second)
	if got := node.Snapshot().ProveAsked - proofsBefore; got < 2 {
		t.Errorf("a leader through the node agent asked %d proofs in a second; want about four", got)
	}

	// A process that vanishes: its connection closes without a word.
	victim := uuid.New()
	conn := nodeagenttest.RawAttach(t, socket, victim, db.Name)
	testutil.Eventually(t, 10*time.Second, "the raw process's lock held", func() bool { return node.Snapshot().LocksHeld == 4 })
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock, lock_grace, stale_threshold,
	            definitive_dead_cutoff, lock_pid) VALUES ($1, 'raw', true, '1 s', '90 s', '5 min', $2)`, victim, node.Snapshot().BackendPID)
	deaths := db.ConnAs(t, "test:listener")
	if _, err := deaths.Exec(ctx, `SELECT liveness.members_listen()`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * defaults.WatchInterval)
	killed := time.Now()
	_ = conn.Close()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		n, err := deaths.WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("no dead:%s within 10 s of its connection's end: %v", victim, err)
		}
		if n.Payload == "dead:"+victim.String() {
			break
		}
	}
	took := time.Since(killed)
	t.Logf("a vanished process was notified dead %s after its connection closed", took.Round(time.Millisecond))
	if took > 3*time.Second {
		t.Errorf("dead %s after its connection closed; want within a few seconds", took)
	}
	for _, a := range agents {
		if st, err := r.Instance(ctx, a.Snapshot().InstanceID); err != nil || !st.State.Alive() {
			t.Errorf("an attached agent is %v (%v) after another process vanished", st.State, err)
		}
	}
}

// When the node agent dies, its processes notice at once (their connections close) and
// prove life by their heartbeats: none is ever called dead. They attach again, and hold
// their locks again, when a node agent is back on the socket.
func TestNodeAgentDeathKillsNoneOfItsProcesses(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 8)
	ctx := testutil.Context(t, time.Minute)
	socket := filepath.Join(t.TempDir(), "agent.sock")
	_, stopNode := nodeagenttest.Start(t, db, socket)
	var ids []uuid.UUID
	var agents []*liveness.Agent
	for range 3 {
		a := newAgent(t, liveness.AgentConfig{Pool: pool, NodeAgentSocket: socket, InstanceID: uuid.New(), ServiceName: "attached"})
		runAgent(t, a)
		agents = append(agents, a)
		ids = append(ids, a.Snapshot().InstanceID)
	}
	// An agent outside the node, as another node's would run: it stands in for the
	// watchers, which may have been attached, and judges the attached processes.
	runAgent(t, newAgent(t, defaultAgentConfig(db, db.Pool(t, 4), "other-node")))
	time.Sleep(2 * defaults.WatchInterval)

	falseDead := func() (dead []uuid.UUID) {
		for _, id := range ids {
			var alive bool
			if err := pool.QueryRow(ctx, `SELECT liveness.is_instance_alive($1)`, id).Scan(&alive); err != nil {
				t.Fatal(err)
			}
			if !alive {
				dead = append(dead, id)
			}
		}
		return dead
	}
	// Each process has beaten its claim: a claim's beat still in flight when the node
	// agent stops can land after the hand-over (the process's next beat, sent at once,
	// corrects it), which the check below would count.
	testutil.Eventually(t, 10*time.Second, "every attached process's row claiming its lock", func() bool {
		return db.QueryInt(t, `SELECT count(*) FROM liveness.instances WHERE instance_id = ANY($1) AND holds_alive_lock`, ids) == len(ids)
	})
	stopNode()
	// A graceful stop (SIGTERM, a rolling update) hands over: the locks went only once
	// every process's row had stopped claiming its lock, so no observer ever saw a lock
	// vanish from under a row that claimed it.
	if n := db.QueryInt(t, `SELECT count(*) FROM liveness.instances WHERE instance_id = ANY($1) AND holds_alive_lock`, ids); n != 0 {
		t.Errorf("%d rows still claimed their locks when the stopped node agent's session had ended", n)
	}
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if dead := falseDead(); len(dead) > 0 {
			t.Fatalf("attached processes called dead after the node agent died: %v", dead)
		}
	}
	for _, a := range agents {
		if a.Snapshot().AliveLock.Held {
			t.Fatalf("an attached agent still believes it holds its lock with the node agent gone")
		}
	}
	node, _ := nodeagenttest.Start(t, db, socket)
	testutil.Eventually(t, 30*time.Second, "every process attached again, its lock held", func() bool {
		for _, a := range agents {
			if !a.Snapshot().AliveLock.Held {
				return false
			}
		}
		return node.Snapshot().LocksHeld == 3
	})
	if dead := falseDead(); len(dead) > 0 {
		t.Fatalf("attached processes dead after the node agent came back: %v", dead)
	}
}

// TestNodeAgentLeadersStepDownWhileItIsAwayAndAttachAgainAtOnce: a process leading through
// its node agent leads nothing while the node agent is away (its trust runs out three
// quarters of the grace after its last proof, Reason "not_alive"), and attaches again, its lock
// held, within half a second of the node agent's return, whether it was away one second
// or five. Five trials.
func TestNodeAgentLeadersStepDownWhileItIsAwayAndAttachAgainAtOnce(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	socket := filepath.Join(t.TempDir(), "agent.sock")
	_, stop := nodeagenttest.Start(t, db, socket)
	start := func(listening *time.Time) func() {
		_, stop := nodeagenttest.StartAt(t, db, socket, listening)
		return stop
	}
	leadersStepDownAndAttachAgain(t, liveness.AgentConfig{Pool: pool, NodeAgentSocket: socket, InstanceID: uuid.New(),
		ServiceName: "attached"}, stop, start, []time.Duration{time.Second, 5 * time.Second, time.Second, 2 * time.Second, 3 * time.Second})
}

// leadersStepDownAndAttachAgain runs an agent of cfg, attached to a node agent that runs
// (stop stops it), and leading; for each of aways, it stops the node agent, checks that
// the agent stops leading, Reason "not_alive", within 2 s, and starts the node agent again
// (start, which notes when it listens) after that long away; then that the lock is held
// again within half a second of the node agent's return.
func leadersStepDownAndAttachAgain(t *testing.T, cfg liveness.AgentConfig, stop func(), start func(*time.Time) func(),
	aways []time.Duration) {
	t.Helper()
	ctx := testutil.Context(t, 3*time.Minute)
	agent := newAgent(t, cfg)
	runAgent(t, agent)
	type stint struct {
		began, ended time.Time
		reason       error
	}
	stints := make(chan stint, 16)
	electCtx, stopElect := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopElect()
	var current stint
	wg.Go(func() {
		_ = agent.Elect(electCtx, liveness.ElectorConfig{Lease: "job",
			OnStartedLeading: func(ctx context.Context, _ *liveness.Lease) {
				current = stint{began: time.Now()}
				<-ctx.Done()
				current.ended = time.Now()
			},
			OnStoppedLeading: func(reason error) {
				current.reason = reason
				stints <- current
			}})
	})
	leading := func() {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, "the process leading", func() bool {
			for _, l := range agent.Snapshot().Leases {
				if l.Name == "job" && l.Held {
					return true
				}
			}
			return false
		})
	}
	var worst time.Duration
	for trial, away := range aways {
		leading()
		gone := time.Now()
		stop()
		var s stint
		select {
		case s = <-stints:
		case <-time.After(10 * time.Second):
			t.Fatalf("trial %d: the process still leads 10 s after its node agent went away", trial)
		}
		var lost *liveness.LeaseLostError
		if !errors.As(s.reason, &lost) || lost.Reason != "not_alive" {
			t.Fatalf("trial %d: stopped leading because %v; want %s", trial, s.reason, "not_alive")
		}
		if took := s.ended.Sub(gone); took > 2*time.Second {
			t.Errorf("trial %d: the job ended %s after the node agent went away; want within its trust (0.75 s of its last proof)",
				trial, took)
		}
		time.Sleep(time.Until(gone.Add(away)))
		var back time.Time
		stop = start(&back)
		testutil.Eventually(t, 10*time.Second, "the lock held through the node agent again", func() bool {
			return agent.Snapshot().AliveLock.Held
		})
		took := time.Since(back)
		worst = max(worst, took)
		t.Logf("trial %d: away %s; the lock held again %s after the node agent listened", trial, away, took.Round(time.Millisecond))
	}
	if worst > 500*time.Millisecond {
		t.Errorf("the lock held again up to %s after the node agent was back; want within 0.5 s", worst)
	}
}
