package faults

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// startNodeAgent runs the exporter as the node's agent on socket, its own agent attached
// to it, as a DaemonSet or a systemd unit would.
func startNodeAgent(t *testing.T, e *env, socket string) *proc {
	t.Helper()
	p := startProc(t, "node agent", procOpts{}, bins.Exporter, "--web.listen-address="+testutil.FreeAddr(t),
		"--db.dsn="+e.dsn, "--db.schema="+schema, "--log.level=warn", "--node-agent.socket="+socket)
	testutil.Eventually(t, 30*time.Second, "the node agent's socket", func() bool {
		return e.db.QueryInt(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE '%:node-agent'`) == 1
	})
	return p
}

// lockHeldSince reports whether a's last lock event after t says held.
func lockHeldSince(a *agent, t time.Time) bool {
	ev := a.Events("lock", t)
	return len(ev) > 0 && ev[len(ev)-1].Held
}

// TestNodeAgent runs three processes attached to a node agent (the exporter binary with
// --node-agent.socket) and one outside the node: one liveness backend serves the node.
// A killed attached process (kill -9: its kernel closes its socket) is dead for every
// consumer and its lease taken over as fast as with a session of its own; a killed node
// agent calls none of its processes dead (they prove life by their heartbeats), and they
// hold their locks again through a new node agent.
func TestNodeAgent(t *testing.T) {
	t.Parallel()
	sc := newScenario(t, 1, "Node agent: kill -9 of an attached process, then of the node agent",
		"default agent flags; three processes attached to a node agent (--node-agent.socket, the exporter binary), the victim "+
			"holding the job lease, the heir on its own session outside the node")
	e := newEnv(t)
	socket := filepath.Join(t.TempDir(), "agent.sock")
	node := startNodeAgent(t, e, socket)
	stale := defaultDuration(t, "agent.stale-threshold")
	obs := startObserver(t, e.dsn)
	s := startSampler(t, e.dsn, stale, obs)
	attached := func(name, lease string) *agent {
		a := startAgent(t, e, agentOpts{service: name, lease: lease, extra: []string{"--node-agent.socket=" + socket}})
		s.Watch(a)
		return a
	}
	for trial := range trials() {
		lease := fmt.Sprintf("node-job-%d", trial)
		victim := attached(fmt.Sprintf("node-victim-%d", trial), lease)
		testutil.Eventually(t, 30*time.Second, "the victim holding "+lease, func() bool { return len(victim.Events("acquired", time.Time{})) > 0 })
		peers := []*agent{attached(fmt.Sprintf("node-peer-a-%d", trial), ""), attached(fmt.Sprintf("node-peer-b-%d", trial), "")}
		heir := startAgent(t, e, agentOpts{service: fmt.Sprintf("node-heir-%d", trial), lease: lease})
		s.Watch(heir)
		for _, a := range append([]*agent{victim, heir}, peers...) {
			waitHealthy(t, s, a, true)
		}
		// On a loaded machine the victim may step down before the kill (it could not
		// prove its lock in time) and the heir take the lease: the kill would then
		// measure no takeover. The heir hands it back (a stop releases it) and a new
		// heir starts, until the victim leads when it is killed.
		for attempt := 1; !leads(victim); attempt++ {
			if attempt > 3 {
				t.Fatalf("the victim did not lead %s before its kill in 3 attempts", lease)
			}
			t.Logf("the victim stepped down before its kill and the heir took %s; the heir hands it back", lease)
			heir.Stop()
			testutil.Eventually(t, 30*time.Second, "the victim leading "+lease+" again", func() bool { return leads(victim) })
			heir = startAgent(t, e, agentOpts{service: fmt.Sprintf("node-heir-%d-%d", trial, attempt), lease: lease})
			s.Watch(heir)
			waitHealthy(t, s, heir, true)
		}
		// The node's four agents (its own and three processes) on one session; the heir on
		// its own.
		if n := e.db.QueryInt(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE '%:alive-lock'`); n != 1 {
			t.Errorf("%d alive-lock sessions; want the heir's only", n)
		}
		if n := e.db.QueryInt(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE '%:node-agent'`); n != 1 {
			t.Errorf("%d node agent sessions; want 1", n)
		}

		t0 := time.Now()
		victim.Kill()
		var sqlDead, expDeadT, takeover moment
		deadSQL, deadExp := s.deadAfter(t0, victim)
		waitSeen(trialWindow, map[*moment]finder{
			&sqlDead:  deadSQL,
			&expDeadT: deadExp,
			&takeover: eventAfter(heir.proc, "acquired", t0, nil),
		})
		sc.observeDead("attached process: dead for every consumer", trialWindow, sqlDead, expDeadT)
		sc.observe("attached process: lease held by another process", trialWindow, takeover.d, takeover.ok)
		n, first := s.falseDead(t0, time.Now(), append([]*agent{heir}, peers...))
		sc.addFalseDead(n, first)
		sc.fence(e.dsn, lease)

		// The node agent dies: its processes' connections close at once.
		t1 := time.Now()
		node.Kill()
		testutil.Eventually(t, 10*time.Second, "the peers seeing their locks gone", func() bool {
			return !lockHeldSince(peers[0], t1) && !lockHeldSince(peers[1], t1)
		})
		time.Sleep(5 * time.Second) // several lock graces: a peer that did not prove life would be dead by now
		node = startNodeAgent(t, e, socket)
		var again time.Duration
		ok := testutil.Poll(30*time.Second, func() bool {
			again = time.Since(t1)
			return lockHeldSince(peers[0], t1) && lockHeldSince(peers[1], t1)
		})
		sc.observe("node agent killed: attached processes hold their locks again (restart after 5 s)", 30*time.Second, again, ok)
		n, first = s.falseDead(t1, time.Now(), append([]*agent{heir}, peers...))
		sc.addFalseDead(n, first)
		for _, a := range append([]*agent{heir}, peers...) {
			a.Stop()
		}
	}
	sc.bound("attached process: dead for every consumer", crashDeadMedian, crashDeadWorst)
	sc.bound("attached process: lease held by another process", takeoverMedian, takeoverBound)
	sc.s.Trials = trials()
	sc.note("An attached process's lock is the node agent's connection to it: its kernel closes the socket at the kill, the node agent " +
		"lets the lock go, and the watcher sees it vanish as it would a session of the process's own. A killed node agent takes every " +
		"lock of its node with it: its processes see their connections close, beat at once through their pools (heartbeat_only) and " +
		"attach again to the next node agent; none is called dead.")
}

// leads reports whether a's last event of its lease is an acquisition.
func leads(a *agent) bool {
	acquired, lost := a.Events("acquired", time.Time{}), a.Events("lost", time.Time{})
	return len(acquired) > 0 && (len(lost) == 0 || lost[len(lost)-1].At.Before(acquired[len(acquired)-1].At))
}
