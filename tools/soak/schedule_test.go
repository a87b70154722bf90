package soak

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

var testFleet = Fleet{Procs: []string{"a", "b", "c", "d"}, Netns: []string{"a", "b"}, Pools: []string{"c", "d"}, Leases: []string{"L"}, Failover: true}

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

// Two minutes apply every kind once, overlapping; one database fault at a time, one fault
// per target at a time, one failover, everything healed before the quiet end.
func TestScheduleCoversKindsAndOverlaps(t *testing.T) {
	const d = 2 * time.Minute
	for seed := uint64(1); seed <= 50; seed++ {
		s := NewSchedule(seed, 10*time.Minute, testFleet)
		if n := CountByKind(s)[FaultFailover]; n != 1 {
			t.Errorf("seed %d: %d failovers in ten minutes, want 1", seed, n)
		}
		for i, f := range s {
			if f.At < Warmup || f.At+f.For > 10*time.Minute-Quiet() {
				t.Errorf("seed %d: %s outside the fault window", seed, f)
			}
			for _, g := range s[:i] {
				if g.At+g.For <= f.At {
					continue
				}
				if databaseFault[f.Kind] && databaseFault[g.Kind] {
					t.Errorf("seed %d: database faults overlap: %s, %s", seed, g, f)
				}
				link := func(k string) bool { return k == FaultLinkDown || k == FaultBlip }
				if f.Target != "" && f.Target == g.Target && link(f.Kind) == link(g.Kind) {
					t.Errorf("seed %d: one target, two faults at once: %s, %s", seed, g, f)
				}
			}
		}
	}
	s := NewSchedule(SeedForTests, d, testFleet)
	counts := CountByKind(s)
	for _, k := range FaultKinds {
		if counts[k] == 0 {
			t.Errorf("the two-minute schedule of seed %d has no %s:\n%s", SeedForTests, k, Describe(s))
		}
	}
	holders := 0
	for _, f := range s {
		if strings.HasPrefix(f.Target, HolderPrefix) {
			holders++
		}
	}
	if holders == 0 || counts[FaultKill] < 2 {
		t.Errorf("the two-minute schedule kills no lease holder:\n%s", Describe(s))
	}
	if Overlaps(s) == 0 {
		t.Errorf("no overlapping faults in two minutes:\n%s", Describe(s))
	}
}
