package faults

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// jobLeaseTTL is the ttl of the job lease the victims of the network scenarios hold: 10 s,
// the order of client-go's and River's defaults.
const jobLeaseTTL = 10 * time.Second

// trialWindow bounds how long one trial waits for an event before it counts as missed.
const trialWindow = 150 * time.Second

// moment is when something was first seen after a fault, and whether it was.
type moment struct {
	d  time.Duration
	ok bool
}

// finder says when something was first seen after a fault, and whether it was yet.
type finder func() (time.Duration, bool)

// waitSeen polls until every moment has been found or the window ends; finds says what
// finds each.
func waitSeen(window time.Duration, finds map[*moment]finder) {
	testutil.Poll(window, func() bool {
		all := true
		for m, find := range finds {
			if !m.ok {
				m.d, m.ok = find()
			}
			all = all && m.ok
		}
		return all
	})
}

// eventAfter finds a's first event ev after t0 that match accepts (nil: any).
func eventAfter(a *proc, ev string, t0 time.Time, match func(event) bool) finder {
	return func() (time.Duration, bool) {
		for _, e := range a.Events(ev, t0) {
			if match == nil || match(e) {
				return e.At.Sub(t0), true
			}
		}
		return 0, false
	}
}

// sqlAfter finds the first SQL sample after t0 that meets cond.
func (s *verdictLog) sqlAfter(t0 time.Time, cond func(sqlSample) bool) finder {
	return func() (time.Duration, bool) { return s.firstSQL(t0, cond) }
}

// deadAfter finds when a's first instance was called dead after t0 by is_instance_alive
// (sql) and by the exporter (exp); observeDead records the later of the two.
func (s *verdictLog) deadAfter(t0 time.Time, a *agent) (sql, exp finder) {
	id, svc := a.ids[0], a.services[0]
	return s.sqlAfter(t0, instDead(id)), func() (time.Duration, bool) { return s.firstExp(t0, expDead(svc)) }
}

// startPair starts a victim alone, so that it takes lease (and, with withReaper, the
// reaper's), then its heir, which competes for lease; both are watched by s, and healthy
// for every consumer when it returns. o is the agents' options but their service names.
// The victim's reaper campaign starts after a jittered delay, so the heir waits for it:
// started at once, the heir could win the reaper's lease first.
func startPair(t *testing.T, e *env, s *verdictLog, o agentOpts, withReaper bool, victimName, heirName string) (victim, heir *agent) {
	t.Helper()
	o.service = victimName
	victim = startAgent(t, e, o)
	s.Watch(victim)
	testutil.Eventually(t, 30*time.Second, "the victim holding "+o.lease, func() bool { return len(victim.Events("acquired", time.Time{})) > 0 })
	if withReaper {
		testutil.Eventually(t, 30*time.Second, "the victim holding the reaper's lease", func() bool {
			return s.holdsLease(reaperLease, victim.ids[0])
		})
	}
	o.service = heirName
	heir = startAgent(t, e, o)
	s.Watch(heir)
	waitHealthy(t, s, victim, true)
	waitHealthy(t, s, heir, true)
	return victim, heir
}

// startCrashPair is startPair at the default settings, returning once the victim also
// holds the reaper's lease, 0–1 s later: a kill comes anywhere in the agents' cycles.
func startCrashPair(t *testing.T, e *env, s *verdictLog, lease, victimName, heirName string) (victim, heir *agent) {
	t.Helper()
	victim, heir = startPair(t, e, s, agentOpts{lease: lease}, true, victimName, heirName)
	time.Sleep(time.Duration(rand.Int64N(int64(time.Second)))) // a random moment, not a wait for an event
	return victim, heir
}

// waitHealthy waits until the sampler sees every instance of a holding its lock, alive by
// is_instance_alive, and (with an observer) alive in the exporter.
func waitHealthy(t *testing.T, s *verdictLog, a *agent, observed bool) {
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

// reaperLease is the library's reaper lease name, as the agents hold it.
const reaperLease = "pg_liveness.reaper"

// holdsLease reports whether the last SQL sample shows the lease held by instance id.
func (s *verdictLog) holdsLease(name string, id uuid.UUID) bool {
	smps := s.sqlSamples()
	return len(smps) > 0 && leaseHeldBy(name, id)(smps[len(smps)-1])
}

// TestCrash kills (SIGKILL) an agent that holds its alive lock, a job lease and the
// reaper's lease, and measures when the lock is gone from pg_locks, when
// is_instance_alive and the exporter call it dead, when another process holds each
// lease, and when the row is reaped. Every setting is the default: the heir's campaign
// retries every second, and is woken when the surviving watcher notifies the death.
func TestCrash(t *testing.T) {
	sc := newScenario(t, 1, "Crash (kill -9) of a lock, lease and reaper holder",
		"default agent flags and campaign settings (lease ttl, retry period); the victim is killed 0–1 s after it is seen healthy, "+
			"holding the job lease and the reaper's")
	e := newEnv(t)
	stale := defaultDuration(t, "agent.stale-threshold")
	obs := startObserver(t, e.dsn)
	s := startSampler(t, e.dsn, stale, obs)

	for trial := range trials() {
		lease := fmt.Sprintf("job-%d", trial)
		victim, heir := startCrashPair(t, e, s, lease, fmt.Sprintf("crash-victim-%d", trial), fmt.Sprintf("crash-heir-%d", trial))
		id := victim.ids[0]
		t0 := time.Now()
		victim.Kill()
		var lockGone, sqlDead, expDeadT, reaped, takeover, reaper moment
		deadSQL, deadExp := s.deadAfter(t0, victim)
		waitSeen(trialWindow, map[*moment]finder{
			&lockGone: s.sqlAfter(t0, func(smp sqlSample) bool { return !smp.Inst[id].Locked }),
			&sqlDead:  deadSQL,
			&expDeadT: deadExp,
			&takeover: eventAfter(heir.proc, "acquired", t0, nil),
			&reaper:   s.sqlAfter(t0, leaseHeldBy(reaperLease, heir.ids[0])),
			&reaped:   s.sqlAfter(t0, rowGone(id)),
		})
		sc.observe("lock gone from pg_locks", trialWindow, lockGone.d, lockGone.ok)
		sc.observe("is_instance_alive false", trialWindow, sqlDead.d, sqlDead.ok)
		sc.observe("exporter: not alive", trialWindow, expDeadT.d, expDeadT.ok)
		sc.observeDead("dead for every consumer", trialWindow, sqlDead, expDeadT)
		sc.observe("lease held by another process", trialWindow, takeover.d, takeover.ok)
		sc.observe("reaper's lease held by another process", trialWindow, reaper.d, reaper.ok)
		sc.observe("row reaped", trialWindow, reaped.d, reaped.ok)
		n, first := s.falseDead(t0, time.Now(), []*agent{heir})
		sc.addFalseDead(n, first)
		sc.fence(e.dsn, lease)
		sc.checkHistoryOfCrash(e.dsn, s, obs.url, lease, victim.services[0], id, heir.ids[0], t0)
		heir.Stop()
	}
	sc.bound("dead for every consumer", crashDeadMedian, crashDeadWorst)
	sc.bound("lease held by another process", takeoverMedian, takeoverBound)
	sc.bound("reaper's lease held by another process", takeoverMedian, takeoverBound)
	sc.s.Trials = trials()
	sc.note("The row is reaped by the heir's reaper (every --agent.reaper-interval) once it holds the reaper's lease; its time is reported, not bounded.")
	sc.note("A dead holder's lease is free before its ttl (holder dead by the one verdict). The heir's watcher stamps the vanished lock "+
		"within a tick (%s) and, once the lock grace has passed, notifies the death and the victim's leases as free: the heir's "+
		"followers try at once instead of at their next retry (every second for the job, every 5 s for the reaper).", defaults.WatchInterval)
}

// TestCrashNotificationsLost is TestCrash with the heir's listening session (its alive
// lock's) terminated at the kill and every 100 ms after it for lostFor, each new session
// as soon as it shows: the notifications of the death reach nobody in the heir, which
// loses its own lock again and again and proves life through its pool. The heir must not
// be called dead, the victim must be dead as fast as without the loss (the watcher is
// the heir's, and stamps through the pool), and the leases must move as fast as without
// the loss: the heir's watcher tells the heir's followers itself when their session does
// not listen, and the session's many returns (each a resync) must not hold them back.
func TestCrashNotificationsLost(t *testing.T) {
	sc := newScenario(t, 1, "Crash (kill -9) with the heir's notifications lost",
		"default agent flags and campaign settings; at the kill, the heir's alive-lock (listening) session is ended by pg_terminate_backend")
	e := newEnv(t)
	obs := startObserver(t, e.dsn)
	s := startSampler(t, e.dsn, defaultDuration(t, "agent.stale-threshold"), obs)
	for trial := range trials() {
		lease := fmt.Sprintf("lost-job-%d", trial)
		victim, heir := startCrashPair(t, e, s, lease, fmt.Sprintf("lost-victim-%d", trial), fmt.Sprintf("lost-heir-%d", trial))
		const lostFor = 3 * time.Second
		t0 := time.Now()
		victim.Kill()
		terminateFor(t, e.dsn, heir.services[0]+":alive-lock", lostFor)
		var sqlDead, expDeadT, takeover, reaper moment
		deadSQL, deadExp := s.deadAfter(t0, victim)
		waitSeen(trialWindow, map[*moment]finder{
			&sqlDead:  deadSQL,
			&expDeadT: deadExp,
			&takeover: eventAfter(heir.proc, "acquired", t0, nil),
			&reaper:   s.sqlAfter(t0, leaseHeldBy(reaperLease, heir.ids[0])),
		})
		sc.observeDead("dead for every consumer", trialWindow, sqlDead, expDeadT)
		sc.observe("lease held by another process", trialWindow, takeover.d, takeover.ok)
		sc.observe("reaper's lease held by another process", trialWindow, reaper.d, reaper.ok)
		sc.watchFalseDead(s, t0, falseDeadWatch, heir)
		losses := 0
		for _, ev := range heir.Events("lock", t0) {
			if !ev.Held {
				losses++
			}
		}
		if losses == 0 {
			t.Errorf("trial %d: the heir never lost its lock: its listening session was not terminated", trial+1)
		}
		sc.note("Trial %d: the heir's listening session was ended %d times.", trial+1, losses)
		sc.fence(e.dsn, lease)
		heir.Stop()
	}
	sc.bound("dead for every consumer", crashDeadMedian, crashDeadWorst)
	sc.bound("lease held by another process", takeoverMedian, takeoverBound)
	sc.s.Trials = trials()
	sc.note("The heir's watcher, having notified the death that its own session cannot hear, wakes the heir's followers itself, " +
		"and each return of the listening session only makes them read again. A follower in a process without the watcher, its " +
		"session down, has only its poll (every second while it does not listen): about a second more, not measured here.")
}

// terminateFor ends every session named app at once and every 100 ms for d.
func terminateFor(t *testing.T, dsn, app string, d time.Duration) {
	t.Helper()
	ctx := testutil.Context(t, d+10*time.Second)
	conn := connect(t, ctx, dsn)
	defer conn.Close(context.Background())
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app); err != nil {
			t.Fatal(err)
		}
	}
}

// silences are the silence variants: nobody looks for that long after the crash, then
// one look.
var silences = []time.Duration{3 * time.Second, 10 * time.Second, 30 * time.Second}

// TestCrashSilence kills lock holders (SIGKILL) while nobody looks at the verdict (no
// observer, no sampler), and looks once per victim after a silence of 3, 10 or 30 s:
// is_instance_alive(id), is_instance_alive(id, 90) and instance_states() must all say
// dead at that first look. Only the agents' own parts run meanwhile (a bystander's
// watcher, its reaper every --agent.reaper-interval). When the database called the
// victim dead is read from the dead:<id> notification on the schema's events channel (a
// listener reads no verdict); a first look that says alive counts the time until a look
// says dead instead, which is past the silence and fails the bound.
func TestCrashSilence(t *testing.T) {
	// Mostly silence: run beside the other waiting scenarios, so that make faults and
	// make test stay short.
	t.Parallel()
	sc := newScenario(t, 1, "Crash (kill -9), then silence: the first look",
		fmt.Sprintf("default agent flags; nobody looks for %v after the kill, then one look per victim; a bystander agent runs beside them", silences))
	e := newEnv(t)
	// Each trial waits out the longest silence: the deadline grows with the trials.
	ctx := testutil.Context(t, time.Minute+time.Duration(trials())*(silences[len(silences)-1]+15*time.Second))
	deadAt := listenDeaths(t, ctx, e.dsn)
	firstLook := looker(t, ctx, e.dsn)

	bystander := startAgent(t, e, agentOpts{service: "silence-bystander"})
	defer bystander.Stop()
	for trial := range trials() {
		victims := make([]*agent, len(silences))
		for i, d := range silences {
			victims[i] = startAgent(t, e, agentOpts{service: fmt.Sprintf("silence-%s-%d", d, trial)})
		}
		// Healthy by the one look this scenario allows itself before the kill.
		testutil.Eventually(t, 30*time.Second, "the victims alive", func() bool {
			for _, v := range victims {
				if !firstLook(v.ids[0]) {
					return false
				}
			}
			return true
		})
		time.Sleep(time.Duration(rand.Int64N(int64(time.Second))))
		t0 := time.Now()
		for _, v := range victims {
			v.Kill()
		}
		falseDead, first := 0, ""
		for i, d := range silences {
			time.Sleep(time.Until(t0.Add(d)))
			// The bystander, alive throughout, must be alive at every look.
			if !firstLook(bystander.ids[0]) {
				falseDead++
				if first == "" {
					first = fmt.Sprintf("the bystander %s at the look %s after the kill", bystander.ids[0], d)
				}
			}
			id := victims[i].ids[0]
			name := fmt.Sprintf("crash to dead, first look after %s of silence", d)
			if !firstLook(id) { // dead at the first look, as it must be
				at, ok := deadAt(id)
				if !ok {
					// Dead at the look, but no watcher said so: count the look's time,
					// which misses the bound and shows that nothing recorded the death.
					at = t0.Add(d)
				}
				sc.observe(name, d, at.Sub(t0), true)
				continue
			}
			t.Logf("%s: alive at the first look after %s of silence", id, d)
			var until time.Duration
			ok := testutil.Poll(30*time.Second, func() bool { until = time.Since(t0); return !firstLook(id) })
			sc.observe(name, d+30*time.Second, until, ok)
		}
		sc.addFalseDead(falseDead, first)
	}
	for _, d := range silences {
		name := fmt.Sprintf("crash to dead, first look after %s of silence", d)
		sc.bound(name, crashDeadMedian, crashDeadWorst)
	}
	sc.s.Trials = trials()
	sc.note("The time is when the database called the victim dead (its dead:<id> notification), the look being the first after the " +
		"silence; a look that said alive would count until a look says dead, past the silence, and miss the bound.")
}

// listenDeaths listens to the members channel for dead:<id> until the test ends, and
// returns when each instance was first notified dead (a listener reads no verdict).
func listenDeaths(t *testing.T, ctx context.Context, dsn string) func(uuid.UUID) (time.Time, bool) {
	t.Helper()
	listener := connect(t, ctx, dsn)
	if _, err := listener.Exec(ctx, `SELECT liveness.members_listen()`); err != nil { // dead:<id> (migration 0010 on; a private channel from 0012)
		t.Fatal(err)
	}
	var mu sync.Mutex
	deadAt := map[string]time.Time{}
	listenCtx, stopListening := context.WithCancel(ctx)
	var listening sync.WaitGroup
	listening.Go(func() {
		for {
			n, err := listener.WaitForNotification(listenCtx)
			if err != nil {
				return
			}
			if id, ok := strings.CutPrefix(n.Payload, "dead:"); ok {
				mu.Lock()
				if _, seen := deadAt[id]; !seen {
					deadAt[id] = time.Now()
				}
				mu.Unlock()
			}
		}
	})
	t.Cleanup(func() {
		stopListening()
		listening.Wait()
		_ = listener.Close(context.Background())
	})
	return func(id uuid.UUID) (time.Time, bool) {
		mu.Lock()
		defer mu.Unlock()
		at, ok := deadAt[id.String()]
		return at, ok
	}
}

// looker returns a look at an instance by every verdict a consumer reads:
// is_instance_alive(id), is_instance_alive(id, 90) and instance_states(); alive when any
// says so.
func looker(t *testing.T, ctx context.Context, dsn string) func(uuid.UUID) (alive bool) {
	t.Helper()
	look := connect(t, ctx, dsn)
	t.Cleanup(func() { _ = look.Close(context.Background()) })
	return func(id uuid.UUID) bool {
		var a, a90 bool
		var state *string
		if err := look.QueryRow(ctx, `SELECT liveness.is_instance_alive($1), liveness.is_instance_alive($1, 90),
		        (SELECT s.state FROM liveness.instance_states() s WHERE s.instance_id = $1)`, id).Scan(&a, &a90, &state); err != nil {
			t.Fatal(err)
		}
		return a || a90 || (state != nil && stateAlive[*state])
	}
}

// TestCrashBothWatchers kills (SIGKILL) the two processes that lead the watcher leases,
// at once, while a bystander leads the reaper: nobody is left to notice either death, to
// stamp their vanished locks or to notify their leases free, and the watcher leases'
// followers poll every 30 s. The reaper's leader asks every tick whether a watcher ticks,
// and ticks in their place when none does: both victims must be dead at the first look,
// 3 s after the kill, and the bystander must lead a watcher soon after. The victims run
// no reaper (--agent.reaper=false), so that the bystander is sure to lead it.
func TestCrashBothWatchers(t *testing.T) {
	t.Parallel()
	const lookAfter = 3 * time.Second
	sc := newScenario(t, 1, "Crash (kill -9) of both watchers at once",
		fmt.Sprintf("default agent flags; the two victims lead the watcher leases (and run no reaper); a bystander leads the reaper; nobody looks for %s after the kill", lookAfter))
	e := newEnv(t)
	ctx := testutil.Context(t, time.Minute+time.Duration(trials())*time.Minute)
	deadAt := listenDeaths(t, ctx, e.dsn)
	firstLook := looker(t, ctx, e.dsn)
	admin := connect(t, ctx, e.dsn)
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	holder := func(lease string) uuid.UUID {
		var id *uuid.UUID
		err := admin.QueryRow(ctx, `SELECT holder_instance_id FROM liveness.leases WHERE name = $1 AND expires_at > now()`, lease).Scan(&id)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if id == nil {
			return uuid.Nil
		}
		return *id
	}
	watchers := []string{"pg_liveness.watcher.a", "pg_liveness.watcher.b"}
	for trial := range trials() {
		victims := []*agent{
			startAgent(t, e, agentOpts{service: fmt.Sprintf("watcher-a-%d", trial), timing: []string{"--agent.reaper=false"}}),
			startAgent(t, e, agentOpts{service: fmt.Sprintf("watcher-b-%d", trial), timing: []string{"--agent.reaper=false"}}),
		}
		isVictim := func(id uuid.UUID) bool { return id == victims[0].ids[0] || id == victims[1].ids[0] }
		// One watcher lease each: an agent leads at most one.
		testutil.Eventually(t, 45*time.Second, "the victims leading both watcher leases", func() bool {
			return isVictim(holder(watchers[0])) && isVictim(holder(watchers[1]))
		})
		bystander := startAgent(t, e, agentOpts{service: fmt.Sprintf("watchers-bystander-%d", trial)})
		testutil.Eventually(t, 30*time.Second, "the bystander leading the reaper", func() bool {
			return holder(reaperLease) == bystander.ids[0]
		})
		time.Sleep(time.Duration(rand.Int64N(int64(time.Second))))
		t0 := time.Now()
		for _, v := range victims {
			v.Kill()
		}
		time.Sleep(time.Until(t0.Add(lookAfter)))
		falseDead, first := 0, ""
		if !firstLook(bystander.ids[0]) {
			falseDead, first = 1, fmt.Sprintf("the bystander %s at the look %s after the kill", bystander.ids[0], lookAfter)
		}
		for _, v := range victims {
			id := v.ids[0]
			if firstLook(id) {
				t.Logf("%s: alive at the first look %s after the kill", id, lookAfter)
				var until time.Duration
				ok := testutil.Poll(30*time.Second, func() bool { until = time.Since(t0); return !firstLook(id) })
				sc.observe("crash to dead, both watchers", lookAfter+30*time.Second, until, ok)
				continue
			}
			at, ok := deadAt(id)
			if !ok {
				at = t0.Add(lookAfter) // dead at the look, but nobody said so: misses the bound
			}
			sc.observe("crash to dead, both watchers", lookAfter, at.Sub(t0), true)
		}
		sc.addFalseDead(falseDead, first)
		var took time.Duration
		ok := testutil.Poll(30*time.Second, func() bool {
			took = time.Since(t0)
			return holder(watchers[0]) == bystander.ids[0] || holder(watchers[1]) == bystander.ids[0]
		})
		sc.observe("a watcher again (the bystander leads one)", 30*time.Second, took, ok)
		bystander.Stop()
	}
	// No watcher ticks a second after the kill (the reaper's leader sees it within a tick
	// of that), then the lock grace passes: about a second more than a crash with a
	// watcher left.
	sc.bound("crash to dead, both watchers", crashDeadMedian+time.Second, crashDeadWorst+time.Second)
	sc.bound("a watcher again (the bystander leads one)", takeoverBound, takeoverBound+time.Second)
	sc.s.Trials = trials()
	sc.note("Without the reaper's leader ticking in the watchers' place, the victims were dead only when a watcher follower's 30 s poll " +
		"came (15 s on average), and the bystander led a watcher only then.")
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
		// two samples (of the observer, every 200 ms) on top.
		hangDeadBound = cutoff + time.Second
	)
	sc := newScenario(t, 2, "Hang (SIGSTOP past the definitive-dead cutoff, then SIGCONT)",
		fmt.Sprintf("short timing for every agent and the observer: %v; job lease ttl %s; stopped for %s", timing, leaseTTL, stopFor))
	e := newEnv(t)
	obs := startObserver(t, e.dsn, "--agent.stale-threshold=4s", "--agent.definitive-dead-cutoff=8s")
	s := startSampler(t, e.dsn, stale, obs)

	for trial := range trials() {
		lease := fmt.Sprintf("job-%d", trial)
		victim, heir := startPair(t, e, s, agentOpts{lease: lease, leaseTTL: leaseTTL, timing: timing}, false,
			fmt.Sprintf("hang-victim-%d", trial), fmt.Sprintf("hang-heir-%d", trial))
		id, svc := victim.ids[0], victim.services[0]
		t0 := time.Now()
		victim.Signal(syscall.SIGSTOP)
		time.Sleep(stopFor) // the hang itself
		tCont := time.Now()
		victim.Signal(syscall.SIGCONT)
		var reRegistered, lost, said moment
		waitSeen(30*time.Second, map[*moment]finder{
			// The resumed process must say that it was written off.
			&said:         func() (time.Duration, bool) { return time.Since(tCont), victim.Logged("instance row was gone") },
			&reRegistered: s.sqlAfter(tCont, func(smp sqlSample) bool { return smp.Inst[id].Row }),
			&lost: func() (time.Duration, bool) {
				if ev := victim.Events("lost", tCont.Add(-stopFor)); len(ev) > 0 {
					return ev[0].At.Sub(tCont), true
				}
				return 0, false
			},
		})
		lockOnly, okLO := s.firstExp(t0, expState(svc, "lock_only"))
		zombie, okZ := s.firstExp(t0, expState(svc, "zombie"))
		expDeadT, okExp := s.firstExp(t0, expDead(svc))
		sqlDead, okSQL := s.firstSQL(t0, instDead(id))
		reaped, okReap := s.firstSQL(t0, rowGone(id))
		takeover, okTake := eventAfter(heir.proc, "acquired", t0, nil)()
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
		sc.observe("after SIGCONT: lease context cancelled", 30*time.Second, lost.d, lost.ok)
		sc.observe("after SIGCONT: row registered again", 30*time.Second, reRegistered.d, reRegistered.ok)
		sc.observe("after SIGCONT: logs that it was written off", 30*time.Second, said.d, said.ok)
		rejected := len(victim.Events("rejected", tCont))
		sc.note("Trial %d: %d fenced writes of the resumed victim were refused by the fence (lease_is_held and the fence deadline; attempted after the takeover, before its lease context ended).", trial+1, rejected)
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
