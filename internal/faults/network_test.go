package faults

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/pgtest"
)

// netEnv is an env whose server also listens on the host end of a veth pair, and the DSN
// an agent inside the namespace uses to reach it.
func netEnv(t *testing.T) (*env, *netns, string) {
	t.Helper()
	ns := newNetns(t)
	e := newEnv(t, pgtest.WithSetting("listen_addresses", "127.0.0.1,"+ns.HostIP))
	if err := e.srv.AllowHost(ns.CIDR); err != nil {
		t.Fatalf("pg_hba: %v", err)
	}
	nsDSN := strings.Replace(e.dsn, "host=127.0.0.1", "host="+ns.HostIP, 1)
	if nsDSN == e.dsn {
		t.Fatalf("cannot point the DSN at %s", ns.HostIP)
	}
	return e, ns, nsDSN
}

// TestHalfOpenPartition cuts an agent off inside its network namespace without closing
// its sockets, and measures when the server frees its alive lock, when the agent stops
// trusting its lock and its lease, and when another process takes the lease.
func TestHalfOpenPartition(t *testing.T) {
	// Mostly waiting on timers: run beside the other waiting scenarios, so that
	// make faults stays short.
	t.Parallel()
	sc := newScenario(t, 3, "Half-open partition (the agent's link down, sockets open)",
		fmt.Sprintf("default agent flags; job lease ttl %s; the link comes back after the lock is freed", jobLeaseTTL))
	e, ns, nsDSN := netEnv(t)
	obs := startObserver(t, e.dsn)
	s := startSampler(t, e.dsn, defaultDuration(t, "agent.stale-threshold"), obs)
	const window = 90 * time.Second
	for trial := range trials() {
		lease := fmt.Sprintf("job-%d", trial)
		victim := startAgent(t, e, agentOpts{service: fmt.Sprintf("partition-victim-%d", trial), netns: ns.Name, dsn: nsDSN, lease: lease, leaseTTL: jobLeaseTTL})
		s.Watch(victim)
		waitFor(t, 30*time.Second, "the victim holding "+lease, func() bool { return len(victim.Events("acquired", time.Time{})) > 0 })
		heir := startAgent(t, e, agentOpts{service: fmt.Sprintf("partition-heir-%d", trial), lease: lease, leaseTTL: jobLeaseTTL})
		s.Watch(heir)
		waitHealthy(t, s, victim, true)
		waitHealthy(t, s, heir, true)

		id := victim.ids[0]
		t0 := time.Now()
		if err := ns.Cut(); err != nil {
			t.Fatal(err)
		}
		var (
			freed, leaseDistrust, lockDistrust, takeover time.Duration
			okFreed, okLease, okLock, okTake             bool
		)
		firstEvent := func(p *proc, ev string, match func(event) bool) (time.Duration, bool) {
			for _, e := range p.Events(ev, t0) {
				if match(e) {
					return e.At.Sub(t0), true
				}
			}
			return 0, false
		}
		waitSeen(window,
			func() bool {
				freed, okFreed = s.firstSQL(t0, func(smp sqlSample) bool { return !smp.Inst[id].Locked })
				return okFreed
			},
			func() bool {
				leaseDistrust, okLease = firstEvent(victim.proc, "lost", func(event) bool { return true })
				return okLease
			},
			func() bool {
				lockDistrust, okLock = firstEvent(victim.proc, "lock", func(e event) bool { return !e.Held })
				return okLock
			},
			func() bool {
				takeover, okTake = firstEvent(heir.proc, "acquired", func(event) bool { return true })
				return okTake
			},
		)
		sc.observe("server frees the alive lock", window, freed, okFreed)
		sc.observe("agent stops trusting its lease", window, leaseDistrust, okLease)
		sc.observe("agent stops trusting its alive lock", window, lockDistrust, okLock)
		sc.observe("lease held by another process", window, takeover, okTake)

		tHeal := time.Now()
		if err := ns.Heal(); err != nil {
			t.Fatal(err)
		}
		var relock time.Duration
		ok := poll(window, func() bool {
			var ok bool
			relock, ok = s.firstSQL(tHeal, func(smp sqlSample) bool { return smp.Inst[id].Locked && smp.Inst[id].Alive })
			return ok
		})
		sc.observe("after healing: lock held again", window, relock, ok)
		n, first := s.falseDead(t0, time.Now(), []*agent{heir})
		sc.addFalseDead(n, first)
		sc.fence(e.dsn, lease)
		victim.Stop()
		heir.Stop()
	}
	sc.bound("server frees the alive lock", 0, halfOpenBound)
	sc.bound("agent stops trusting its lease", 0, halfOpenBound)
	sc.bound("agent stops trusting its alive lock", 0, halfOpenBound)
	sc.s.Trials = trials()
	sc.note("The partitioned agent cannot reach the database, so verdicts on it are not false-dead; the count covers the process on the host.")
}

// TestNetworkBlip drops the agent's packets for 5 s and restores them: nothing may call
// it dead, and it must keep the lease it held, whose ttl did not run out.
func TestNetworkBlip(t *testing.T) {
	// Mostly waiting on timers: run beside the other waiting scenarios, so that
	// make faults stays short.
	t.Parallel()
	const blip = 5 * time.Second
	sc := newScenario(t, 4, "Network blip (packets dropped for 5 s)",
		fmt.Sprintf("default agent flags; job lease ttl %s", jobLeaseTTL))
	e, ns, nsDSN := netEnv(t)
	obs := startObserver(t, e.dsn)
	s := startSampler(t, e.dsn, defaultDuration(t, "agent.stale-threshold"), obs)
	victim := startAgent(t, e, agentOpts{service: "blip", netns: ns.Name, dsn: nsDSN, lease: "job", leaseTTL: jobLeaseTTL})
	s.Watch(victim)
	waitFor(t, 30*time.Second, "the victim holding the lease", func() bool { return len(victim.Events("acquired", time.Time{})) > 0 })
	lost := 0
	for range trials() {
		waitHealthy(t, s, victim, true)
		t0 := time.Now()
		if err := ns.Cut(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(blip)
		if err := ns.Heal(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(jobLeaseTTL + 5*time.Second)
		n, first := s.falseDead(t0, time.Now(), []*agent{victim})
		sc.addFalseDead(n, first)
		lost += len(victim.Events("lost", t0))
	}
	sc.note("Leases lost by the reachable-again agent: %d.", lost)
	if lost > 0 {
		t.Errorf("the agent lost its lease %d times over a %s blip with a %s ttl", lost, blip, jobLeaseTTL)
	}
	sc.fence(e.dsn, "job")
	sc.s.Trials = trials()
	sc.note("Verdicts are watched from the cut until the ttl plus 5 s after the link is back.")
}
