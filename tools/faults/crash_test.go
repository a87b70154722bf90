package faults

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// jobLeaseTTL is the ttl of the job lease the victims hold: 10 s, the order of
// client-go's and River's defaults.
const jobLeaseTTL = 10 * time.Second

// trialWindow bounds how long one trial waits for an event before it counts as missed.
const trialWindow = 150 * time.Second

// waitSeen polls until every named check holds or the window ends.
func waitSeen(window time.Duration, checks ...func() bool) {
	testutil.Poll(window, func() bool {
		for _, c := range checks {
			if !c() {
				return false
			}
		}
		return true
	})
}

// waitHealthy waits until the sampler sees every instance of a holding its lock, alive by
// is_instance_alive, and (with an observer) alive in the exporter.
func waitHealthy(t *testing.T, s *sampler, a *agent, observed bool) {
	t.Helper()
	since := time.Now()
	testutil.Eventually(t, 60*time.Second, a.Name()+" locked and alive for every consumer", func() bool {
		_, sqlOK := s.firstSQL(since, func(smp sqlSample) bool {
			for _, id := range a.ids {
				if v := smp.Inst[id]; !v.Locked || !v.Alive || !v.Row {
					return false
				}
			}
			return true
		})
		if !sqlOK || !observed {
			return sqlOK
		}
		_, expOK := s.firstExp(since, func(smp expSample) bool {
			for _, svc := range a.services {
				if !stateAlive[smp.States[svc]] {
					return false
				}
			}
			return true
		})
		return expOK
	})
}

// TestCrash kills (SIGKILL) an agent that holds its alive lock and a job lease, and
// measures when the lock is gone from pg_locks, when is_instance_alive and the exporter
// call it dead, when another process holds the lease, and when the row is reaped.
func TestCrash(t *testing.T) {
	sc := newScenario(t, 1, "Crash (kill -9) of a lock and lease holder",
		fmt.Sprintf("default agent flags; job lease ttl %s, retried every 150 ms; the victim is killed 0–1 s after it is seen healthy", jobLeaseTTL))
	e := newEnv(t)
	stale := defaultDuration(t, "agent.stale-threshold")
	obs := startObserver(t, e.dsn)
	s := startSampler(t, e.dsn, stale, obs)

	for trial := range trials() {
		lease := fmt.Sprintf("job-%d", trial)
		victim := startAgent(t, e, agentOpts{service: fmt.Sprintf("crash-victim-%d", trial), lease: lease, leaseTTL: jobLeaseTTL})
		s.Watch(victim)
		testutil.Eventually(t, 30*time.Second, "the victim holding "+lease, func() bool { return len(victim.Events("acquired", time.Time{})) > 0 })
		heir := startAgent(t, e, agentOpts{service: fmt.Sprintf("crash-heir-%d", trial), lease: lease, leaseTTL: jobLeaseTTL})
		s.Watch(heir)
		waitHealthy(t, s, victim, true)
		waitHealthy(t, s, heir, true)
		time.Sleep(time.Duration(rand.Int64N(int64(time.Second))))

		id, svc := victim.ids[0], victim.services[0]
		t0 := time.Now()
		victim.Kill()
		var (
			lockGone, sqlDead, expDeadT, reaped, takeover time.Duration
			okLock, okSQL, okExp, okReap, okTake          bool
		)
		waitSeen(trialWindow,
			func() bool {
				lockGone, okLock = s.firstSQL(t0, func(smp sqlSample) bool { return !smp.Inst[id].Locked })
				return okLock
			},
			func() bool { sqlDead, okSQL = s.firstSQL(t0, instDead(id)); return okSQL },
			func() bool { expDeadT, okExp = s.firstExp(t0, expDead(svc)); return okExp },
			func() bool {
				okTake = false
				if ev := heir.Events("acquired", t0); len(ev) > 0 {
					takeover, okTake = ev[0].At.Sub(t0), true
				}
				return okTake
			},
			func() bool {
				reaped, okReap = s.firstSQL(t0, func(smp sqlSample) bool { v, ok := smp.Inst[id]; return ok && !v.Row })
				return okReap
			},
		)
		sc.observe("lock gone from pg_locks", trialWindow, lockGone, okLock)
		sc.observe("is_instance_alive false", trialWindow, sqlDead, okSQL)
		sc.observe("exporter: not alive", trialWindow, expDeadT, okExp)
		sc.observe("dead for every consumer", trialWindow, max(sqlDead, expDeadT), okSQL && okExp)
		sc.observe("lease held by another process", trialWindow, takeover, okTake)
		sc.observe("row reaped", trialWindow, reaped, okReap)
		n, first := s.falseDead(t0, time.Now(), []*agent{heir})
		sc.addFalseDead(n, first)
		sc.fence(e.dsn, lease)
		heir.Stop()
	}
	sc.bound("dead for every consumer", crashDeadMedian, crashDeadWorst)
	sc.bound("lease held by another process", takeoverMedian, takeoverBound)
	sc.s.Trials = trials()
	sc.note("The row is reaped by the surviving agent's reaper (every --agent.reaper-interval); its time is reported, not bounded.")
	sc.note("A dead holder's lease is free before its ttl (holder dead by the one verdict); the heir retries every 150 ms.")
}

// TestHang stops an agent (SIGSTOP) that holds its lock and a lease past the
// definitive-dead cutoff, then lets it go on (SIGCONT). A hung process keeps its
// session, so its lock stays granted: it must still be dead for is_instance_alive and
// the exporter once its heartbeat is past the cutoff. After SIGCONT it must write nothing
// under its stale epoch and register its row again.
func TestHang(t *testing.T) {
	// Mostly waiting on timers: run beside the other waiting scenarios, so that
	// make faults stays short.
	t.Parallel()
	timing := []string{"--agent.heartbeat-interval=1s", "--agent.heartbeat-slow-interval=2s",
		"--agent.stale-threshold=4s", "--agent.definitive-dead-cutoff=8s", "--agent.reaper-interval=1s"}
	const (
		stale, cutoff = 4 * time.Second, 8 * time.Second
		leaseTTL      = 5 * time.Second
		stopFor       = cutoff + 6*time.Second
		// The heartbeat is at most one slow interval old when the process stops; allow
		// two 200 ms samples on top.
		hangDeadBound = cutoff + time.Second
	)
	sc := newScenario(t, 2, "Hang (SIGSTOP past the definitive-dead cutoff, then SIGCONT)",
		fmt.Sprintf("short timing for every agent and the observer: %v; job lease ttl %s; stopped for %s", timing, leaseTTL, stopFor))
	e := newEnv(t)
	obs := startObserver(t, e.dsn, "--agent.stale-threshold=4s", "--agent.definitive-dead-cutoff=8s")
	s := startSampler(t, e.dsn, stale, obs)

	for trial := range trials() {
		lease := fmt.Sprintf("job-%d", trial)
		victim := startAgent(t, e, agentOpts{service: fmt.Sprintf("hang-victim-%d", trial), lease: lease, leaseTTL: leaseTTL, timing: timing})
		s.Watch(victim)
		testutil.Eventually(t, 30*time.Second, "the victim holding "+lease, func() bool { return len(victim.Events("acquired", time.Time{})) > 0 })
		heir := startAgent(t, e, agentOpts{service: fmt.Sprintf("hang-heir-%d", trial), lease: lease, leaseTTL: leaseTTL, timing: timing})
		s.Watch(heir)
		waitHealthy(t, s, victim, true)
		waitHealthy(t, s, heir, true)

		id, svc := victim.ids[0], victim.services[0]
		t0 := time.Now()
		victim.Signal(syscall.SIGSTOP)
		time.Sleep(stopFor)
		tCont := time.Now()
		victim.Signal(syscall.SIGCONT)
		var (
			reRegistered, lost, said time.Duration
			okReg, okLost, okSaid    bool
		)
		waitSeen(30*time.Second,
			func() bool {
				// The resumed process must say that it was written off.
				if !okSaid && victim.Logged("instance row was gone") {
					said, okSaid = time.Since(tCont), true
				}
				return okSaid
			},
			func() bool {
				reRegistered, okReg = s.firstSQL(tCont, func(smp sqlSample) bool { return smp.Inst[id].Row })
				return okReg
			},
			func() bool {
				okLost = false
				if ev := victim.Events("lost", tCont.Add(-stopFor)); len(ev) > 0 {
					lost, okLost = ev[0].At.Sub(tCont), true
				}
				return okLost
			},
		)
		lockOnly, okLO := s.firstExp(t0, expState(svc, "lock_only"))
		zombie, okZ := s.firstExp(t0, expState(svc, "zombie"))
		expDeadT, okExp := s.firstExp(t0, expDead(svc))
		sqlDead, okSQL := s.firstSQL(t0, instDead(id))
		reaped, okReap := s.firstSQL(t0, func(smp sqlSample) bool { v, ok := smp.Inst[id]; return ok && !v.Row })
		var takeover time.Duration
		okTake := false
		if ev := heir.Events("acquired", t0); len(ev) > 0 {
			takeover, okTake = ev[0].At.Sub(t0), true
		}
		within := func(d time.Duration, ok bool) (time.Duration, bool) { return d, ok && d < stopFor }
		sc.observe("exporter: lock_only", stopFor, lockOnly, okLO && lockOnly < stopFor)
		sc.observe("exporter: zombie", stopFor, zombie, okZ && zombie < stopFor)
		d, ok := within(expDeadT, okExp)
		sc.observe("exporter: not alive", stopFor, d, ok)
		d, ok = within(sqlDead, okSQL)
		sc.observe("is_instance_alive false", stopFor, d, ok)
		d, ok = within(reaped, okReap)
		sc.observe("row reaped", stopFor, d, ok)
		d, ok = within(takeover, okTake)
		sc.observe("lease held by another process", stopFor, d, ok)
		sc.observe("after SIGCONT: lease context cancelled", 30*time.Second, lost, okLost)
		sc.observe("after SIGCONT: row registered again", 30*time.Second, reRegistered, okReg)
		sc.observe("after SIGCONT: logs that it was written off", 30*time.Second, said, okSaid)
		rejected := len(victim.Events("rejected", tCont))
		sc.note("Trial %d: %d fenced writes of the resumed victim were refused by lease_is_held (attempted after the takeover, before its lease context ended).", trial+1, rejected)
		n, first := s.falseDead(t0, time.Now(), []*agent{heir})
		sc.addFalseDead(n, first)
		sc.fence(e.dsn, lease)
		victim.Stop()
		heir.Stop()
	}
	sc.bound("is_instance_alive false", 0, hangDeadBound)
	sc.bound("exporter: not alive", 0, hangDeadBound)
	sc.bound("after SIGCONT: row registered again", 0, 10*time.Second)
	sc.bound("after SIGCONT: logs that it was written off", 0, 10*time.Second)
	sc.s.Trials = trials()
	sc.note("Times before SIGCONT are from SIGSTOP; a time not seen while the process was stopped (%s) is a miss.", stopFor)
	sc.note("Dead is bounded at the definitive-dead cutoff plus one second (%s) after SIGSTOP, for is_instance_alive and the exporter alike.", hangDeadBound)
}
