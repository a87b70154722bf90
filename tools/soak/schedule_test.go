package soak

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// testFleet is a small fleet of every kind of process: two leases of three competitors,
// one in a namespace, one attached to the node agent, one behind a proxy.
var testFleet = Fleet{
	Procs:       []string{"a0", "a1", "a2", "b0", "b1", "b2", "x", "node"},
	Netns:       []string{"a0", "x"},
	Pools:       []string{"a0", "a1", "a2", "b0", "b1", "b2"},
	Competitors: map[string][]string{"A": {"a0", "a1", "a2"}, "B": {"b0", "b1", "b2"}},
	NodeAgent:   "node",
	Attached:    []string{"a2", "b2"},
	Proxied:     []string{"a1", "b0", "b1"},
	Failover:    true,
}

// The seed replays the schedule; another seed gives another one.
func TestScheduleReplaysFromSeed(t *testing.T) {
	a := NewSchedule(29, 10*time.Minute, testFleet)
	b := NewSchedule(29, 10*time.Minute, testFleet)
	if len(a) == 0 || !reflect.DeepEqual(a, b) {
		t.Fatalf("the same seed gave two schedules:\n%s\n---\n%s", Describe(a), Describe(b))
	}
	if c := NewSchedule(30, 10*time.Minute, testFleet); reflect.DeepEqual(a, c) {
		t.Fatalf("seeds 29 and 30 gave the same schedule:\n%s", Describe(a))
	}
}

// disturbed are the processes whose alive lock g may take away (for a while after it
// heals: settle), and whether it acts on the database or the sessions.
func disturbed(f Fleet, g Fault) (procs []string, settle time.Duration) {
	target := []string{g.Target}
	if lease, ok := strings.CutPrefix(g.Target, HolderPrefix); ok {
		target = f.Competitors[lease]
		if lease == AnyLease {
			target = f.Proxied
		}
	}
	switch g.Kind {
	case FaultKill:
		if g.Target == f.NodeAgent {
			target = append(target, f.Attached...)
		}
		return target, settleRestart
	case FaultNodeRestart:
		return append(target, f.Attached...), settleRestart
	case FaultStop:
		if g.Target == f.NodeAgent {
			target = append(target, f.Attached...)
		}
		return target, settleProcess
	case FaultPoolExhaustion:
		return target, settleProcess
	case FaultLinkDown:
		return target, settleLink
	case FaultBlip:
		return target, settleBlip
	case FaultLateClose:
		return target, settleLateClose
	case FaultTerminate:
		return f.Procs, settleTerminate
	case FaultReadOnly:
		return f.Procs, settleReadOnly
	}
	return f.Procs, settleDatabase
}

// Ten minutes of many seeds: one failover; everything within the fault window; one
// database fault at a time; one process fault and one link fault per process at a time;
// each kill's window (from the settling of every earlier fault that disturbs its victim,
// its heirs, the database or the sessions, to KillWindow after it) and each stop (while
// it lasts) free of other faults that could take their locks away (but terminations,
// which the nemesis keeps off a stopped process's lock), and of database faults.
func TestScheduleKeepsKillsAndStopsApart(t *testing.T) {
	const d = 10 * time.Minute
	link := func(k string) bool { return k == FaultLinkDown || k == FaultBlip }
	for seed := uint64(1); seed <= 50; seed++ {
		s := NewSchedule(seed, d, testFleet)
		if n := CountByKind(s)[FaultFailover]; n != 1 {
			t.Errorf("seed %d: %d failovers in ten minutes, want 1", seed, n)
		}
		for i, f := range s {
			if f.At < Warmup || f.At+f.For > d-Quiet() {
				t.Errorf("seed %d: %s outside the fault window", seed, f)
			}
			for _, g := range s[:i] {
				if g.At+g.For <= f.At {
					continue
				}
				if databaseFault[f.Kind] && databaseFault[g.Kind] {
					t.Errorf("seed %d: database faults overlap: %s, %s", seed, g, f)
				}
				if f.Target != "" && f.Target == g.Target && link(f.Kind) == link(g.Kind) {
					t.Errorf("seed %d: one target, two faults at once: %s, %s", seed, g, f)
				}
			}
		}
		for _, f := range s {
			var guarded []string
			until := f.At + f.For
			switch f.Kind {
			case FaultKill:
				victims, _ := disturbed(testFleet, Fault{Kind: FaultStop, Target: f.Target})
				if f.Target == testFleet.NodeAgent {
					victims = []string{f.Target}
				}
				guarded, until = testFleet.killReserved(victims), f.At+KillWindow
				if strings.HasPrefix(f.Target, HolderPrefix) {
					until += HolderWait
				}
			case FaultStop:
				guarded = []string{f.Target}
			default:
				continue
			}
			for _, g := range s {
				if g.ID == f.ID || g.At >= until {
					continue
				}
				procs, settle := disturbed(testFleet, g)
				end := g.At + g.For + settle
				if strings.HasPrefix(g.Target, HolderPrefix) {
					end += HolderWait
				}
				if end <= f.At {
					continue
				}
				if f.Kind == FaultKill && (g.Kind == FaultKill || g.Kind == FaultStop) && g.At > f.At {
					// Another kill or stop later in the window, of a process it does not guard.
					procs = procs[:0]
					if g.Kind == FaultStop || !strings.HasPrefix(g.Target, HolderPrefix) {
						procs = append(procs, g.Target)
					}
				}
				if g.Kind == FaultTerminate && f.Kind == FaultStop {
					continue // terminations spare the stopped processes' locks (the nemesis)
				}
				if databaseFault[g.Kind] || g.Kind == FaultTerminate ||
					slices.ContainsFunc(procs, func(p string) bool { return slices.Contains(guarded, p) }) {
					t.Errorf("seed %d: %s disturbs %s (guarding %v)", seed, g, f, guarded)
				}
			}
		}
	}
}

// Two minutes of the soak's fleet with the seed of make test apply every kind,
// overlapping, and kill a lease's holder and the node agent.
func TestScheduleCoversKindsInTwoMinutes(t *testing.T) {
	fleet := soakFleet()
	s := NewSchedule(SeedForTests, 2*time.Minute, fleet)
	counts := CountByKind(s)
	for _, k := range FaultKinds {
		if counts[k] == 0 {
			t.Errorf("the two-minute schedule of seed %d has no %s:\n%s", SeedForTests, k, Describe(s))
		}
	}
	holders, node := 0, 0
	for _, f := range s {
		if f.Kind == FaultKill && strings.HasPrefix(f.Target, HolderPrefix) {
			holders++
		}
		if f.Kind == FaultKill && f.Target == fleet.NodeAgent {
			node++
		}
	}
	if holders == 0 || node == 0 {
		t.Errorf("the two-minute schedule kills no lease holder or not the node agent:\n%s", Describe(s))
	}
	if Overlaps(s) == 0 {
		t.Errorf("no overlapping faults in two minutes:\n%s", Describe(s))
	}
	t.Logf("%d faults, %d overlapping:\n%s", len(s), Overlaps(s), Describe(s))
}
