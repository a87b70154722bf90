package soak

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

var base = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func at(sec float64) int64 { return base.Add(time.Duration(sec * float64(time.Second))).UnixNano() }

// sample is a verdict of src on key (an instance; a process for the exporter) answered
// at sec, sent 10 ms before; after is the time the last sample of the value before was
// answered (0: none), sent 10 ms before that.
func sample(sec float64, src, key string, alive bool, after float64) Event {
	e := Event{T: at(sec), From: at(sec - 0.01), Kind: EvVerdict, Source: src, Alive: alive}
	if src == SrcSQL {
		e.Note = map[bool]string{true: "alive", false: "stale"}[alive]
	}
	if src == SrcExporter {
		e.Proc = key
	} else {
		e.Inst = key
	}
	if after > 0 {
		e.Prev, e.PrevFrom = at(after), at(after-0.01)
	}
	return e
}

func withNote(e Event, note string) Event {
	e.Note = note
	return e
}

// tenure is one epoch of a lease as the lease rows show it: taken at taken (the row
// inserted, or updated from the epoch before it), renewed every ttl/4 and last at
// renewed, and deleted at released (0: it was not).
type tenure struct {
	epoch                    int64
	taken, renewed, released float64
	ttl                      float64
}

// leaseRows are the lease rows of lease's tenures, one after the other.
func leaseRows(lease string, tenures ...tenure) []Event {
	var ev []Event
	gone := true
	for _, tn := range tenures {
		row := func(sec float64, op string) {
			ev = append(ev, Event{T: at(sec), Kind: EvLeaseRow, Lease: lease, Epoch: tn.epoch, Note: op, Taken: at(tn.taken),
				Exp: at(min(sec, tn.renewed) + tn.ttl)})
		}
		row(tn.taken, map[bool]string{true: "insert", false: "update"}[gone])
		for s := tn.taken + tn.ttl/4; s < tn.renewed; s += tn.ttl / 4 {
			row(s, "update")
		}
		row(tn.renewed, "update")
		gone = tn.released > 0
		if gone {
			row(tn.released, "delete")
		}
	}
	return ev
}

// cleanHistory is a small run with nothing wrong: three processes (p1 and p2 compete for
// lease L and share the two shards of set S, p3 holds none), p1 killed while it holds L
// and restarted, p2 taking over; see shardHistory for the shards.
func cleanHistory() []Event {
	ev := []Event{
		{T: at(0), Kind: EvStart, Proc: "p1", Inst: "i1", Lease: "L", Set: "S", Shards: 2},
		{T: at(0), Kind: EvStart, Proc: "p2", Inst: "i2", Lease: "L", Set: "S", Shards: 2},
		{T: at(0), Kind: EvStart, Proc: "p3", Inst: "i3"},
		{T: at(1), Kind: EvAlert, Name: TwoLeadersAlert, State: ""},
		{T: at(2), Kind: EvJobBegin, Inst: "i1", Lease: "L", Epoch: 1},
		{T: at(2), Kind: EvHolder, Lease: "L", Inst: "i1", Epoch: 1},
		{T: at(3), Kind: EvLedger, ID: 10, Inst: "i1", Lease: "L", Epoch: 1},
		{T: at(4), Kind: EvLedger, ID: 20, Inst: "i1", Lease: "L", Epoch: 1},
		{T: at(60), Kind: EvFault, Fault: FaultKill, FaultID: 1, Targets: []string{"p1"}},
		sample(61, SrcSQL, "i1", false, 60.98),
		{T: at(62), Kind: EvJobBegin, Inst: "i2", Lease: "L", Epoch: 2},
		{T: at(62), Kind: EvHolder, Lease: "L", Inst: "i2", Epoch: 2},
		{T: at(63), Kind: EvLedger, ID: 30, Inst: "i2", Lease: "L", Epoch: 2},
		{T: at(65), Kind: EvHeal, Fault: FaultKill, FaultID: 1, Targets: []string{"p1"}},
		{T: at(66), Kind: EvStart, Proc: "p1", Inst: "i4", Lease: "L", Set: "S", Shards: 2},
		sample(68, SrcSQL, "i4", true, 0),
		sample(68, SrcLock, "i4", true, 0),
		{T: at(200), Kind: EvRunEnd},
	}
	ev = append(ev, leaseRows("L", tenure{1, 1.9, 59.5, 0, 10}, tenure{2, 61.9, 199, 0, 10})...)
	for _, i := range []string{"i1", "i2", "i3"} {
		ev = append(ev, sample(1, SrcSQL, i, true, 0), sample(1, SrcLock, i, true, 0))
	}
	for _, p := range []string{"p1", "p2", "p3"} {
		ev = append(ev, sample(1, SrcExporter, p, true, 0))
	}
	ev = append(ev, shardHistory()...)
	ev = append(ev, dbHistoryOf(ev)...)
	for s := 0.0; s <= 200; s += 5 {
		for _, r := range []struct {
			name string
			v    float64
		}{{"goroutines", 40 + float64(int(s)%3)}, {"fds", 20}, {"conns", 3}, {"rss", 30 << 20}} {
			ev = append(ev, Event{T: at(s), Kind: EvResource, Source: r.name, Value: r.v})
		}
	}
	return ev
}

// shardHistory is the shards' part of cleanHistory: i1 owns S/0 (epoch 101) and i2 S/1
// (102), each writing every 5 s; i1's kill at 60 s moves S/0 to i2 (103), and i4, p1's
// restart, takes it back (104), a write of i2 in flight committing just after its
// callback returned (and before its release); at 80 s i2 is told it lost S/1's lease
// (its trust ran out: renewed last at 65.5 s, the lease expires at 80.5 s), which i4
// takes once it expired (105).
func shardHistory() []Event {
	ev := []Event{
		{T: at(2), Kind: EvShardOwned, Inst: "i1", Lease: "S/0", Epoch: 101},
		{T: at(2), Kind: EvShardOwned, Inst: "i2", Lease: "S/1", Epoch: 102},
		{T: at(62.5), Kind: EvShardOwned, Inst: "i2", Lease: "S/0", Epoch: 103},
		{T: at(67), Kind: EvShardStop, Inst: "i2", Lease: "S/0", Epoch: 103, Note: "moved"},
		{T: at(67.1), Kind: EvShardReleased, Inst: "i2", Lease: "S/0", Epoch: 103},
		{T: at(67.2), Kind: EvShardOwned, Inst: "i4", Lease: "S/0", Epoch: 104},
		{T: at(50), Kind: EvShardRefused, Inst: "i2", Lease: "S/1", Epoch: 102, Note: "late"},
		{T: at(80), Kind: EvShardLost, Inst: "i2", Lease: "S/1", Epoch: 102, Note: "lost"},
		{T: at(80.1), Kind: EvShardReleased, Inst: "i2", Lease: "S/1", Epoch: 102},
		{T: at(81), Kind: EvShardOwned, Inst: "i4", Lease: "S/1", Epoch: 105},
	}
	ev = append(ev, leaseRows("S/0", tenure{101, 1.9, 59.5, 0, 15}, tenure{103, 62.45, 66, 67.17, 15}, tenure{104, 67.18, 199, 0, 15})...)
	ev = append(ev, leaseRows("S/1", tenure{102, 1.9, 65.5, 0, 15}, tenure{105, 80.9, 199, 0, 15})...)
	id := int64(1000)
	row := func(sec float64, inst, lease string, epoch int64) {
		id += 10 // room for a doctored row between two
		ev = append(ev, Event{T: at(sec), Kind: EvLedger, ID: id, Inst: inst, Lease: lease, Epoch: epoch})
	}
	for s := 3.0; s < 200; s += 5 {
		switch {
		case s < 60:
			row(s, "i1", "S/0", 101)
		case s > 62.5 && s < 67:
			row(s, "i2", "S/0", 103)
		case s > 67.2:
			row(s, "i4", "S/0", 104)
		}
		switch {
		case s+0.5 < 80:
			row(s+0.5, "i2", "S/1", 102)
		case s+0.5 > 81:
			row(s+0.5, "i4", "S/1", 105)
		}
		if s == 63 {
			row(67.15, "i2", "S/0", 103) // in flight when the move cancelled it
		}
	}
	return ev
}

// firstRow is the id of the first ledger row of lease under epoch.
func firstRow(ev []Event, lease string, epoch int64) int64 {
	first := int64(math.MaxInt64)
	for _, e := range ev {
		if e.Kind == EvLedger && e.Lease == lease && e.Epoch == epoch {
			first = min(first, e.ID)
		}
	}
	return first
}

func sorted(ev []Event) []Event {
	slices.SortStableFunc(ev, func(a, b Event) int {
		switch {
		case a.T < b.T:
			return -1
		case a.T > b.T:
			return 1
		}
		return 0
	})
	return ev
}

// failing returns the names of the checks that failed.
func failing(t *testing.T, ev []Event) []string {
	t.Helper()
	var out []string
	for _, r := range Check(sorted(ev)) {
		if r.Failed() {
			out = append(out, r.Name)
			t.Logf("%s: %s", r.Name, strings.Join(r.Violations, "; "))
		}
	}
	return out
}

// result is the result of the check named name over ev.
func result(t *testing.T, ev []Event, name string) Result {
	t.Helper()
	for _, r := range Check(sorted(ev)) {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no check %q", name)
	return Result{}
}

func TestCheckCleanHistoryPasses(t *testing.T) {
	if f := failing(t, cleanHistory()); len(f) > 0 {
		t.Fatalf("a clean history fails %v", f)
	}
	for _, r := range Check(sorted(cleanHistory())) {
		if r.Cases == 0 {
			t.Errorf("%s looked at nothing in the clean history", r.Name)
		}
		if r.NotMeasured > 0 {
			t.Errorf("%s did not judge %d cases of the clean history: %s", r.Name, r.NotMeasured, r.WhyNot())
		}
	}
}

// without removes the events match matches.
func without(ev []Event, match func(Event) bool) []Event { return slices.DeleteFunc(ev, match) }

// stoppedHolder is p1 stopped from 20 to 40 s while it holds L under epoch 1, i2 taking
// L under epoch 9 at 29.9 s and leaving at 31 s, i1 leaving 0.3 s after SIGCONT and
// taking L again under epoch 3 at 43 s; the lease rows are expired's: epoch 1 renewed
// last at expired-10 s (its ttl), so that it expires at expired.
func stoppedHolder(ev []Event, expired float64) []Event {
	ev = without(ev, func(e Event) bool { return (e.Kind == EvLeaseRow || e.Kind == EvDBHistory) && e.Lease == "L" })
	rows := leaseRows("L", tenure{1, 1.9, expired - 10, 0, 10}, tenure{9, 29.9, 29.9, 31.05, 10},
		tenure{3, 42.9, 59.5, 0, 10}, tenure{2, 61.9, 199, 0, 10})
	leaders := []Event{Event{T: at(30), Kind: EvJobBegin, Inst: "i2", Lease: "L", Epoch: 9},
		Event{T: at(43), Kind: EvJobBegin, Inst: "i1", Lease: "L", Epoch: 3},
		Event{T: at(2), Kind: EvJobBegin, Inst: "i1", Lease: "L", Epoch: 1},
		Event{T: at(62), Kind: EvJobBegin, Inst: "i2", Lease: "L", Epoch: 2}}
	ev = append(ev, rows...)
	ev = append(ev, dbHistoryOf(append(rows, leaders...))...)
	return append(ev, Event{T: at(20), Kind: EvFault, Fault: FaultStop, FaultID: 2, Targets: []string{"p1"}},
		leaders[0],
		Event{T: at(31), Kind: EvJobEnd, Inst: "i2", Lease: "L", Epoch: 9},
		Event{T: at(40), Kind: EvHeal, Fault: FaultStop, FaultID: 2, Targets: []string{"p1"}},
		Event{T: at(40.2), Kind: EvLost, Inst: "i1", Lease: "L", Epoch: 1},
		Event{T: at(40.3), Kind: EvJobEnd, Inst: "i1", Lease: "L", Epoch: 1},
		leaders[1])
}

// dbHistoryOf is the schema's history of the leases that ev's lease rows record, as its
// triggers would write it: each acquisition and end a microsecond before the soak's
// record of the same statement, an end by expiry at the row's expiry and one by death
// just before the takeover, holders from ev's jobs begun and shards owned.
func dbHistoryOf(ev []Event) []Event {
	holder := map[string]string{}
	for _, e := range ev {
		if e.Kind == EvJobBegin || e.Kind == EvShardOwned {
			holder[epochKey(e.Lease, e.Epoch)] = e.Inst
		}
	}
	byLease := map[string][]*epochRecord{}
	for _, rec := range epochRecords(ev) {
		byLease[rec.lease] = append(byLease[rec.lease], rec)
	}
	var out []Event
	for lease, recs := range byLease {
		slices.SortFunc(recs, func(a, b *epochRecord) int { return int(a.exps[0].at - b.exps[0].at) })
		var lastEnd int64
		for _, rec := range recs {
			k := epochKey(lease, rec.epoch)
			out = append(out, Event{T: rec.exps[0].at - 1000, Kind: EvDBHistory, Note: "acquired", Lease: lease, Epoch: rec.epoch,
				Inst: holder[k], Prev: lastEnd})
			switch {
			case rec.released > 0:
				lastEnd = rec.released - 1000
				out = append(out, Event{T: lastEnd, Kind: EvDBHistory, Note: "ended", Name: "released", Lease: lease, Epoch: rec.epoch, Inst: holder[k]})
			case rec.replaced > 0 && rec.final() < rec.replaced:
				lastEnd = rec.final()
				out = append(out, Event{T: lastEnd, Kind: EvDBHistory, Note: "ended", Name: "expired", Lease: lease, Epoch: rec.epoch, Inst: holder[k]})
			case rec.replaced > 0:
				lastEnd = rec.replaced - 2000
				out = append(out, Event{T: lastEnd, Kind: EvDBHistory, Note: "ended", Name: "holder_dead", Lease: lease, Epoch: rec.epoch, Inst: holder[k]})
			}
		}
	}
	return out
}

// Each check fails on a history doctored to break it, and only that check (or the checks
// listed, when the doctoring breaks more than one promise).
func TestCheckEachFailsOnADoctoredHistory(t *testing.T) {
	replace := func(ev []Event, match func(Event) bool, to func(*Event)) []Event { return replace(t, ev, match, to) }
	cases := []struct {
		name   string
		want   []string
		doctor func([]Event) []Event
	}{
		{"a second holder enters the job", []string{CheckOneInJob, CheckHistory}, func(ev []Event) []Event {
			return append(ev, Event{T: at(30), Kind: EvJobBegin, Inst: "i2", Lease: "L", Epoch: 9},
				Event{T: at(31), Kind: EvJobEnd, Inst: "i2", Lease: "L", Epoch: 9})
		}},
		{"a stopped holder stays in the job after SIGCONT", []string{CheckOneInJob}, func(ev []Event) []Event {
			ev = stoppedHolder(ev, 29.5)
			return replace(ev, func(e Event) bool { return e.Kind == EvJobEnd && e.Inst == "i1" }, func(e *Event) { e.T = at(42) })
		}},
		{"a stopped holder's lease taken before it expired", []string{CheckOneInJob}, func(ev []Event) []Event {
			return stoppedHolder(ev, 30) // expires at 30 s, taken at 29.9 s
		}},
		{"a stopped holder's row committed after its lease expired", []string{CheckOneInJob, CheckNoWriteAfterLease}, func(ev []Event) []Event {
			return append(stoppedHolder(ev, 29.5), Event{T: at(29.6), Kind: EvLedger, ID: 21, Inst: "i1", Lease: "L", Epoch: 1})
		}},
		{"a stopped holder's overlap without the lease rows", []string{CheckOneInJob, CheckHistory}, func(ev []Event) []Event {
			return without(stoppedHolder(ev, 29.5), func(e Event) bool { return e.Kind == EvLeaseRow && e.Lease == "L" && e.Epoch == 9 })
		}},
		{"an older epoch's row after a newer one", []string{CheckEpochsMonotone}, func(ev []Event) []Event {
			// Committed before the takeover, but numbered after the newer epoch's row.
			return append(ev, Event{T: at(61.5), Kind: EvLedger, ID: 40, Inst: "i1", Lease: "L", Epoch: 1})
		}},
		{"a row after its writer was told", []string{CheckNoWriteAfterEnd}, func(ev []Event) []Event {
			return append(ev, Event{T: at(50), Kind: EvLost, Inst: "i1", Lease: "L", Epoch: 1},
				Event{T: at(55), Kind: EvLedger, ID: 25, Inst: "i1", Lease: "L", Epoch: 1})
		}},
		{"a row begun after its writer was told", []string{CheckNoWriteAfterEnd}, func(ev []Event) []Event {
			return append(ev, Event{T: at(50), Kind: EvLost, Inst: "i1", Lease: "L", Epoch: 1},
				Event{T: at(50.004), From: at(50.001), Kind: EvLedger, ID: 25, Inst: "i1", Lease: "L", Epoch: 1})
		}},
		{"a row after its lease expired", []string{CheckNoWriteAfterLease}, func(ev []Event) []Event {
			ev = without(ev, func(e Event) bool { return e.Kind == EvLeaseRow && e.Lease == "L" && e.Epoch == 2 && e.T > at(90) })
			return append(ev, Event{T: at(120), Kind: EvLedger, ID: 35, Inst: "i2", Lease: "L", Epoch: 2})
		}},
		{"a row while its lease had expired, though renewed after", []string{CheckNoWriteAfterLease}, func(ev []Event) []Event {
			// Renewed last at 80 s (expiring at 90 s) and again at 95 s, which the database
			// would refuse; the checker judges by the expiry in force at the commit.
			ev = without(ev, func(e Event) bool {
				return e.Kind == EvLeaseRow && e.Lease == "L" && e.Epoch == 2 && e.T > at(80) && e.T < at(95)
			})
			return append(ev, Event{T: at(92), Kind: EvLedger, ID: 35, Inst: "i2", Lease: "L", Epoch: 2})
		}},
		{"a row after its lease was released", []string{CheckNoWriteAfterLease, CheckHistory}, func(ev []Event) []Event {
			ev = without(ev, func(e Event) bool { return e.Kind == EvLeaseRow && e.Lease == "L" && e.Epoch == 2 && e.T > at(100) })
			return append(ev, Event{T: at(100), Kind: EvLeaseRow, Lease: "L", Epoch: 2, Note: "delete", Taken: at(61.9), Exp: at(109)},
				Event{T: at(101), Kind: EvLedger, ID: 35, Inst: "i2", Lease: "L", Epoch: 2})
		}},
		{"a row after its lease was taken under another epoch", []string{CheckNoWriteAfterLease, CheckHistory}, func(ev []Event) []Event {
			ev = without(ev, func(e Event) bool { return e.Kind == EvLeaseRow && e.Lease == "L" && e.Epoch == 2 && e.T > at(100) })
			return append(ev, Event{T: at(100), Kind: EvLeaseRow, Lease: "L", Epoch: 3, Note: "update", Taken: at(100), Exp: at(110)},
				Event{T: at(100.5), Kind: EvLedger, ID: 35, Inst: "i2", Lease: "L", Epoch: 2})
		}},
		{"a row under an epoch the lease never had", []string{CheckNoWriteAfterLease}, func(ev []Event) []Event {
			return append(ev, Event{T: at(100), Kind: EvLedger, ID: 36, Inst: "i2", Lease: "L", Epoch: 7})
		}},
		{"is_instance_alive false for a live process", []string{CheckNoFalseDead}, func(ev []Event) []Event {
			return append(ev, sample(100, SrcSQL, "i2", false, 99.98), sample(101, SrcSQL, "i2", true, 100.5))
		}},
		{"is_instance_alive false right after a heal, once the process proved life", []string{CheckNoFalseDead}, func(ev []Event) []Event {
			return append(ev, Event{T: at(100), Kind: EvFault, Fault: FaultRestartFast, FaultID: 3, Targets: []string{AllProcs}},
				Event{T: at(103), Kind: EvHeal, Fault: FaultRestartFast, FaultID: 3, Targets: []string{AllProcs}},
				sample(103.03, SrcSQL, "i2", true, 99.9), // the first sample after the heal
				sample(103.5, SrcSQL, "i2", false, 103.48), sample(104, SrcSQL, "i2", true, 103.98))
		}},
		{"is_instance_alive false after a heal, once a heartbeat_only sample proved life (a lock_lost one before it did not)", []string{CheckNoFalseDead}, func(ev []Event) []Event {
			lockLost, beat := sample(103.03, SrcSQL, "i2", true, 99.9), sample(103.2, SrcSQL, "i2", true, 103.18)
			lockLost.Note, beat.Note = "lock_lost", "heartbeat_only"
			return append(ev, Event{T: at(100), Kind: EvFault, Fault: FaultRestartFast, FaultID: 3, Targets: []string{AllProcs}},
				Event{T: at(103), Kind: EvHeal, Fault: FaultRestartFast, FaultID: 3, Targets: []string{AllProcs}},
				lockLost, beat, sample(103.5, SrcSQL, "i2", false, 103.48), sample(104, SrcSQL, "i2", true, 103.98))
		}},
		{"the Reader calls a live process not alive", []string{CheckNoFalseDead}, func(ev []Event) []Event {
			return append(ev, sample(100, SrcReader, "i3", false, 99.9), sample(101, SrcReader, "i3", true, 100.5))
		}},
		{"the Reader calls a process dead across its proof of life", []string{CheckNoFalseDead}, func(ev []Event) []Event {
			// Its first and last dead samples straddle the live stretch's edges (the heal's
			// proof at 103.03 s, the pool's exhaustion at 105 s), but those between them
			// were sent and answered inside it.
			return append(ev, Event{T: at(100), Kind: EvFault, Fault: FaultRestartFast, FaultID: 3, Targets: []string{AllProcs}},
				Event{T: at(103), Kind: EvHeal, Fault: FaultRestartFast, FaultID: 3, Targets: []string{AllProcs}},
				sample(103.03, SrcSQL, "i3", true, 99.9),
				Event{T: at(103.02), From: at(102.95), Kind: EvVerdict, Source: SrcReader, Inst: "i3"},
				Event{T: at(105), Kind: EvFault, Fault: FaultPoolExhaustion, FaultID: 4, Targets: []string{"p3"}},
				Event{T: at(113), Kind: EvHeal, Fault: FaultPoolExhaustion, FaultID: 4, Targets: []string{"p3"}},
				sample(113.03, SrcSQL, "i3", true, 112.9),
				Event{T: at(106), From: at(105.9), Prev: at(105.1), PrevFrom: at(104.95), Kind: EvVerdict, Source: SrcReader, Inst: "i3", Alive: true})
		}},
		{"the exporter shows no live instance of a live process", []string{CheckNoFalseDead}, func(ev []Event) []Event {
			return append(ev, sample(100, SrcExporter, "p3", false, 99.75), sample(102, SrcExporter, "p3", true, 101.5))
		}},
		{"a crash called dead late", []string{CheckCrashDead}, func(ev []Event) []Event {
			return replace(ev, func(e Event) bool { return e.Kind == EvVerdict && e.Inst == "i1" && !e.Alive },
				func(e *Event) { *e = sample(64, SrcSQL, "i1", false, 63.98) })
		}},
		{"a crash never called dead", []string{CheckCrashDead}, func(ev []Event) []Event {
			return without(ev, func(e Event) bool { return e.Kind == EvVerdict && e.Inst == "i1" && !e.Alive })
		}},
		{"fewer than 90 % of the kills judged", []string{CheckCrashDead}, func(ev []Event) []Event {
			// p3 killed during a restart: nothing can be said of when it was called dead.
			return append(ev, Event{T: at(100), Kind: EvFault, Fault: FaultRestartImmediate, FaultID: 5, Targets: []string{AllProcs}},
				Event{T: at(101), Kind: EvFault, Fault: FaultKill, FaultID: 6, Targets: []string{"p3"}},
				Event{T: at(102), Kind: EvHeal, Fault: FaultRestartImmediate, FaultID: 5, Targets: []string{AllProcs}},
				Event{T: at(103), Kind: EvHeal, Fault: FaultKill, FaultID: 6, Targets: []string{"p3"}},
				sample(102.5, SrcSQL, "i3", false, 99.9),
				Event{T: at(104), Kind: EvStart, Proc: "p3", Inst: "i5"}, sample(104.5, SrcSQL, "i5", true, 0),
				sample(104.5, SrcLock, "i5", true, 0))
		}},
		{"a crashed holder's lease taken late", []string{CheckLeaseTaken}, func(ev []Event) []Event {
			return replace(ev, func(e Event) bool { return e.Kind == EvJobBegin && e.Inst == "i2" },
				func(e *Event) { e.T = at(65.5) })
		}},
		{"a restarted agent never takes its lock", []string{CheckConvergence}, func(ev []Event) []Event {
			return without(ev, func(e Event) bool { return e.Kind == EvVerdict && e.Inst == "i4" && e.Source == SrcLock })
		}},
		{"the two-leaders alert fires", []string{CheckTwoLeaders}, func(ev []Event) []Event {
			return append(ev, Event{T: at(120), Kind: EvAlert, Name: TwoLeadersAlert, State: "firing", Note: "lease=L value=2"})
		}},
		{"an agent exits on its own", []string{CheckNoExit}, func(ev []Event) []Event {
			return append(ev, Event{T: at(150), Kind: EvExit, Proc: "p3", Inst: "i3", Note: "exit status 1"})
		}},
		{"a leadership missing from the history", []string{CheckHistory}, func(ev []Event) []Event {
			return without(ev, func(e Event) bool {
				return e.Kind == EvDBHistory && e.Lease == "L" && e.Epoch == 2 && e.Note == "acquired"
			})
		}},
		{"a leadership in the history that no lease row had", []string{CheckHistory}, func(ev []Event) []Event {
			return append(ev, Event{T: at(150), Kind: EvDBHistory, Note: "acquired", Lease: "S/1", Epoch: 7, Inst: "i3"})
		}},
		{"two leaderships at once in the history", []string{CheckHistory}, func(ev []Event) []Event {
			return without(ev, func(e Event) bool {
				return e.Kind == EvDBHistory && e.Lease == "S/0" && e.Epoch == 103 && e.Note == "ended"
			})
		}},
		{"the history's gap not counted from the end before it", []string{CheckHistory}, func(ev []Event) []Event {
			return replace(ev, func(e Event) bool {
				return e.Kind == EvDBHistory && e.Lease == "S/0" && e.Epoch == 104 && e.Note == "acquired"
			},
				func(e *Event) { e.Prev -= int64(time.Second) })
		}},
		{"a release the history records late", []string{CheckHistory}, func(ev []Event) []Event {
			return replace(ev, func(e Event) bool {
				return e.Kind == EvDBHistory && e.Lease == "S/0" && e.Epoch == 103 && e.Note == "ended"
			},
				func(e *Event) { e.T += int64(time.Millisecond) })
		}},
		{"a second owner in a shard's callback", []string{CheckShardOneOwner, CheckHistory}, func(ev []Event) []Event {
			return append(ev, Event{T: at(30), Kind: EvShardOwned, Inst: "i2", Lease: "S/0", Epoch: 100},
				Event{T: at(31), Kind: EvShardReleased, Inst: "i2", Lease: "S/0", Epoch: 100})
		}},
		{"a stopped owner stays in its shard's callback after SIGCONT", []string{CheckShardOneOwner, CheckHistory}, func(ev []Event) []Event {
			ev = without(ev, func(e Event) bool {
				return (e.Kind == EvLedger || e.Kind == EvLeaseRow) && e.Lease == "S/0" && e.T > at(20) && e.T < at(60)
			})
			return append(ev, Event{T: at(20), Kind: EvFault, Fault: FaultStop, FaultID: 2, Targets: []string{"p1"}},
				Event{T: at(30), Kind: EvShardOwned, Inst: "i2", Lease: "S/0", Epoch: 100},
				Event{T: at(31), Kind: EvShardReleased, Inst: "i2", Lease: "S/0", Epoch: 100},
				Event{T: at(40), Kind: EvHeal, Fault: FaultStop, FaultID: 2, Targets: []string{"p1"}},
				Event{T: at(42), Kind: EvShardReleased, Inst: "i1", Lease: "S/0", Epoch: 101})
		}},
		{"a shard's row under an older epoch after a newer one's", []string{CheckShardEpochs}, func(ev []Event) []Event {
			// Inserted after epoch 103's first row, committed before its lease was taken.
			return append(ev, Event{T: at(62.4), Kind: EvLedger, ID: firstRow(ev, "S/0", 103) + 1, Inst: "i1", Lease: "S/0", Epoch: 101})
		}},
		{"two writers under one shard epoch", []string{CheckShardEpochs}, func(ev []Event) []Event {
			return append(ev, Event{T: at(10), Kind: EvLedger, ID: firstRow(ev, "S/1", 102) + 1, Inst: "i1", Lease: "S/1", Epoch: 102})
		}},
		{"an owner's row after the next owner was given the shard", []string{CheckNoWriteAfterLease, CheckShardAfterNext}, func(ev []Event) []Event {
			// The lease rows say so too: the shard's lease was taken before its next owner
			// was given it.
			return append(ev, Event{T: at(62.8), Kind: EvLedger, ID: firstRow(ev, "S/0", 103) - 1, Inst: "i1", Lease: "S/0", Epoch: 101})
		}},
		{"a row after its owner was told it lost the shard", []string{CheckShardAfterLost}, func(ev []Event) []Event {
			return append(ev, Event{T: at(80.05), Kind: EvLedger, ID: firstRow(ev, "S/1", 105) - 1, Inst: "i2", Lease: "S/1", Epoch: 102})
		}},
		{"a row after its owner's write was refused as lost", []string{CheckShardAfterLost}, func(ev []Event) []Event {
			return replace(ev, func(e Event) bool { return e.Kind == EvShardRefused }, func(e *Event) { e.Note = "lost"; e.T = at(49) })
		}},
		{"a shard not written again after the fleet heals", []string{CheckShardsWrittenAll}, func(ev []Event) []Event {
			return without(ev, func(e Event) bool { return e.Kind == EvLedger && e.Lease == "S/1" && e.T > at(65) && e.T < at(100) })
		}},
		{"the observer leaks goroutines", []string{CheckFlat}, func(ev []Event) []Event {
			return replace(ev, func(e Event) bool { return e.Kind == EvResource && e.Source == "goroutines" },
				func(e *Event) { e.Value = 40 + float64(e.T-at(0))/1e9*0.2 })
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := failing(t, c.doctor(cleanHistory()))
			want := slices.Clone(c.want)
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("failing checks %q, want %q", got, want)
			}
		})
	}
}

// What faults cause and the checks may not judge is left unjudged, and said: a dead
// verdict during a database restart and after it until the process proved life again;
// a successor in the job while the holder is stopped, when the holder's lease had expired
// by the database's clock and it leaves at once after SIGCONT; a Reader's dead dip across
// the edges of a proven stretch, when a gap of its samples hides what lay between.
func TestCheckFaultsExcuseOnlyWhatTheyProve(t *testing.T) {
	ev := append(stoppedHolder(cleanHistory(), 29.5),
		sample(40.03, SrcSQL, "i1", true, 19.9), // i1's proof of life after SIGCONT
		Event{T: at(100), Kind: EvFault, Fault: FaultRestartFast, FaultID: 3, Targets: []string{AllProcs}},
		// i4 is alive after the heal only by the rule's grace (its lock vanished in the
		// restart), then dead until its beat lands: it proved nothing before that beat.
		withNote(sample(103.03, SrcSQL, "i4", true, 99.9), "lock_lost"),
		sample(104.03, SrcSQL, "i4", false, 104.01),
		withNote(sample(104.4, SrcSQL, "i4", true, 104.38), "heartbeat_only"),
		sample(101, SrcSQL, "i2", false, 99.9),
		Event{T: at(103), Kind: EvHeal, Fault: FaultRestartFast, FaultID: 3, Targets: []string{AllProcs}},
		sample(103.03, SrcSQL, "i2", false, 100.98), // the first after the heal: still dead
		sample(104.5, SrcSQL, "i2", true, 104.48),   // its proof of life
		// The Reader's dip on i3 straddles i3's proof (103.03 s) and the pool's exhaustion
		// (105 s); a gap of the Reader's samples covers what lay between.
		sample(103.03, SrcSQL, "i3", true, 99.9),
		Event{T: at(103.02), From: at(102.95), Kind: EvVerdict, Source: SrcReader, Inst: "i3"},
		Event{T: at(103.1), Prev: at(103.02), Kind: EvGap, Source: SrcReader},
		Event{T: at(104.95), Prev: at(103.1), Kind: EvGap, Source: SrcReader},
		Event{T: at(105), Kind: EvFault, Fault: FaultPoolExhaustion, FaultID: 4, Targets: []string{"p3"}},
		Event{T: at(113), Kind: EvHeal, Fault: FaultPoolExhaustion, FaultID: 4, Targets: []string{"p3"}},
		sample(113.03, SrcSQL, "i3", true, 112.9),
		Event{T: at(106), From: at(105.9), Prev: at(105.1), PrevFrom: at(104.95), Kind: EvVerdict, Source: SrcReader, Inst: "i3", Alive: true},
	)
	// The crash at 60 s: i1's epoch-3 job, which the kill ends.
	if f := failing(t, ev); len(f) > 0 {
		t.Fatalf("faults' own effects counted as violations: %v", f)
	}
	if r := result(t, ev, CheckOneInJob); !strings.Contains(r.Detail, "1 overlaps excused") {
		t.Errorf("%s: %s; want the stopped holder's overlap excused", r.Name, r.Detail)
	}
	r := result(t, ev, CheckNoFalseDead)
	if !strings.Contains(r.Detail, "proof of life after a heal within") || r.NotMeasured != 0 {
		t.Errorf("%s: %d not judged (%s), %s", r.Name, r.NotMeasured, r.WhyNot(), r.Detail)
	}
}

// A crash right after a database restart, before any sample showed the victim's lock
// held again, is not judged: nothing vanishes when a lock that is not held goes, and the
// instance stays alive by its heartbeat until the stale threshold. It is said, and a run
// that judges fewer than 90 % of its kills fails.
func TestCheckCrashBeforeRelockIsNotJudged(t *testing.T) {
	ev := cleanHistory()
	ev = append(ev, Event{T: at(55), Kind: EvFault, Fault: FaultRestartFast, FaultID: 4, Targets: []string{AllProcs}},
		Event{T: at(59.9), Kind: EvHeal, Fault: FaultRestartFast, FaultID: 4, Targets: []string{AllProcs}})
	ev = without(ev, func(e Event) bool { return e.Kind == EvVerdict && e.Inst == "i1" && !e.Alive })
	ev = replace(t, ev, func(e Event) bool { return e.Kind == EvJobBegin && e.Inst == "i2" }, func(e *Event) { e.T = at(70.5) })
	f := failing(t, ev)
	if !slices.Equal(f, []string{CheckCrashDead, CheckLeaseTaken}) {
		t.Errorf("failing %v; want the two crash checks, for judging 0 of 1", f)
	}
	for _, r := range Check(sorted(ev)) {
		if r.Name != CheckCrashDead && r.Name != CheckLeaseTaken {
			continue
		}
		if r.NotMeasured != 1 || r.Why["the victim's alive lock not seen held at the kill"] != 1 || !strings.Contains(r.Violations[0], "judged 0 of 1") {
			t.Errorf("%s: %d not judged (%s); %v", r.Name, r.NotMeasured, r.WhyNot(), r.Violations)
		}
	}
}

// A kill whose samples straddle the bound (the last that said alive sent before it, the
// first that said dead answered after it) is not judged, and says why.
func TestCheckCrashSamplesStraddlingTheBound(t *testing.T) {
	ev := replace(t, cleanHistory(), func(e Event) bool { return e.Kind == EvVerdict && e.Inst == "i1" && !e.Alive },
		func(e *Event) { *e = sample(63.2, SrcSQL, "i1", false, 62.5) })
	r := result(t, ev, CheckCrashDead)
	if r.NotMeasured != 1 || r.Why["the samples straddle the bound (a sampling gap)"] != 1 {
		t.Errorf("%s: %d not judged (%s)", r.Name, r.NotMeasured, r.WhyNot())
	}
}

// A heir attached to a node agent under a fault cannot take the lease: the kill is not
// judged for its takeover.
func TestCheckHeirOfAStoppedNodeAgent(t *testing.T) {
	ev := replace(t, cleanHistory(), func(e Event) bool { return e.Kind == EvStart && e.Proc == "p2" }, func(e *Event) { e.Node = "p3" })
	ev = append(ev, Event{T: at(59), Kind: EvFault, Fault: FaultStop, FaultID: 7, Targets: []string{"p3"}},
		Event{T: at(61), Kind: EvHeal, Fault: FaultStop, FaultID: 7, Targets: []string{"p3"}})
	r := result(t, ev, CheckLeaseTaken)
	if r.NotMeasured != 1 || r.Why["no heir undisturbed through the bound"] != 1 {
		t.Errorf("%s: %d not judged (%s)", r.Name, r.NotMeasured, r.WhyNot())
	}
}

// The shard checks look at what the clean history holds, and a write in flight when a
// move stopped its callback, committing with the lease still held before the next owner
// began, is counted, not called a violation.
func TestCheckShardChecksCount(t *testing.T) {
	want := map[string]struct {
		cases  int
		detail string
	}{
		CheckShardOneOwner:    {5, "5 callbacks over 2 shards"},
		CheckShardEpochs:      {81, "81 rows of 2 shards under 5 epochs"},
		CheckShardAfterNext:   {81, "81 rows, 5 owners given a shard"},
		CheckShardAfterLost:   {81, "1 callbacks told their shard's lease was lost, 1 stopped with it held"},
		CheckShardsWrittenAll: {1, "1 heals measured, worst 3500 ms (after the kill healed at 12:01:05.000)"},
	}
	for _, r := range Check(sorted(cleanHistory())) {
		w, ok := want[r.Name]
		if !ok {
			continue
		}
		delete(want, r.Name)
		if r.Cases != w.cases || !strings.Contains(r.Detail, w.detail) {
			t.Errorf("%s: %d cases, %q; want %d, %q", r.Name, r.Cases, r.Detail, w.cases, w.detail)
		}
		if r.Name == CheckShardAfterLost && !strings.Contains(r.Detail, "; 1 rows committed just after their callback returned") {
			t.Errorf("%s: the write in flight at the move is not counted: %s", r.Name, r.Detail)
		}
	}
	for name := range want {
		t.Errorf("no check %q", name)
	}
	// The lease checks count the leases' rows only; the lease rows' check, every row.
	for _, r := range Check(sorted(cleanHistory())) {
		if r.Name == CheckEpochsMonotone && r.Cases != 3 {
			t.Errorf("%s: %d rows, want the 3 of lease L", r.Name, r.Cases)
		}
		if r.Name == CheckNoWriteAfterLease && r.Cases != 84 {
			t.Errorf("%s: %d rows, want 84", r.Name, r.Cases)
		}
	}
}

func TestCheckTheilSenIgnoresASpike(t *testing.T) {
	var pts [][2]float64
	for i := range 50 {
		v := 100.0
		if i == 10 {
			v = 10000
		}
		pts = append(pts, [2]float64{float64(i), v})
	}
	if s := TheilSen(pts); s != 0 {
		t.Errorf("slope %v of a flat series with one spike, want 0", s)
	}
	pts = pts[:0]
	for i := range 50 {
		pts = append(pts, [2]float64{float64(i), 3 * float64(i)})
	}
	if s := TheilSen(pts); s != 3 {
		t.Errorf("slope %v of a line of slope 3", s)
	}
	// Past theilSenPairs points: the halves' pairs, as robust to a spike.
	pts = pts[:0]
	for i := range 3 * theilSenPairs {
		v := 2 * float64(i)
		if i%100 == 7 {
			v = 1e9
		}
		pts = append(pts, [2]float64{float64(i), v})
	}
	if s := TheilSen(pts); s != 2 {
		t.Errorf("slope %v of %d points of slope 2 with spikes", s, len(pts))
	}
}

// replace applies to to every event match matches, failing when none does.
func replace(t *testing.T, ev []Event, match func(Event) bool, to func(*Event)) []Event {
	t.Helper()
	n := 0
	for i := range ev {
		if match(ev[i]) {
			to(&ev[i])
			n++
		}
	}
	if n == 0 {
		t.Fatal("the doctoring matched no event")
	}
	return ev
}

// The samplers' recorder keeps a verdict's changes only, each with when its sample was
// sent and answered and when the last sample of the value before was; after a heal it
// records the first sample sent after it whatever its value (the checker's proof of life
// needs one), and after a gap the next one.
func TestCheckChangesRecordAfterHealsAndGaps(t *testing.T) {
	h, _ := NewHistory("")
	c := newChanges(h)
	s := func(sec float64) time.Time { return time.Unix(0, at(sec)) }
	see := func(from, to float64, alive bool) {
		c.see("sql/i", map[bool]string{true: "true", false: "false"}[alive], s(from), s(to), Event{Kind: EvVerdict, Source: SrcSQL, Inst: "i", Alive: alive})
	}
	see(1, 1.01, true)     // recorded: the first
	see(1.02, 1.03, true)  // unchanged
	see(1.04, 1.05, false) // recorded: a change
	see(1.06, 1.07, false)
	c.resample(at(1.075))
	see(1.07, 1.08, false) // sent before the heal: not recorded
	see(1.09, 1.10, false) // the first sent after it: recorded
	see(1.11, 1.12, false)
	c.gap("sql/")
	see(1.50, 1.51, false) // after a gap: recorded
	see(1.52, 1.53, true)  // a change
	want := []Event{
		{T: at(1.01), From: at(1)},
		{T: at(1.05), From: at(1.04), Prev: at(1.03), PrevFrom: at(1.02)},
		{T: at(1.10), From: at(1.09), Prev: at(1.08), PrevFrom: at(1.07)},
		{T: at(1.51), From: at(1.50), Prev: at(1.12), PrevFrom: at(1.11)},
		{T: at(1.53), From: at(1.52), Prev: at(1.51), PrevFrom: at(1.50)},
	}
	got := h.Events()
	if len(got) != len(want) {
		t.Fatalf("%d events recorded, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.T != w.T || g.From != w.From || g.Prev != w.Prev || g.PrevFrom != w.PrevFrom {
			t.Errorf("event %d: t %d from %d prev %d prev_from %d; want %+v", i, g.T, g.From, g.Prev, g.PrevFrom, w)
		}
	}
}

// A row that committed after its writer was told it lost the lease, but whose
// transaction began before (it was sent before), is no violation: it is counted as in
// flight; one begun after the tell is one.
func TestCheckNoWriteAfterEndCountsWritesInFlight(t *testing.T) {
	ev := append(cleanHistory(), Event{T: at(50), Kind: EvLost, Inst: "i1", Lease: "L", Epoch: 1},
		Event{T: at(50.004), From: at(49.998), Kind: EvLedger, ID: 25, Inst: "i1", Lease: "L", Epoch: 1})
	r := result(t, ev, CheckNoWriteAfterEnd)
	if r.Failed() || !strings.Contains(r.Detail, "1 committed after their writer was told, sent before it") {
		t.Errorf("a write in flight when its writer was told: %v, %q", r.Violations, r.Detail)
	}
}
