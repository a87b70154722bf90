package lifegate_test

import (
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/lifegate"
)

var defaults = lifegate.Timing{Grace: time.Second, Stale: 90 * time.Second, Dead: 5 * time.Minute, Margin: 15 * time.Second}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// TestLeaderDeadlineCountsFromTheLastProofNotTheNotice: a leader's deadline is three
// quarters of the grace after its last proof was sent, whenever the loss is noticed
// (the late-FIN case of the safety review: the notice at 0.725 grace must not move it),
// and no beat after the loss extends it.
func TestLeaderDeadlineCountsFromTheLastProofNotTheNotice(t *testing.T) {
	for _, notice := range []time.Duration{0, 500 * time.Millisecond, 725 * time.Millisecond, 740 * time.Millisecond} {
		ev := lifegate.Evidence{LockMode: true, BeatSent: at(-10 * time.Second), BeatHolds: true, Held: notice == 0,
			Proof: at(0)}
		if notice > 0 {
			ev.LossNoticed = at(notice)
		}
		until, ok := lifegate.Deadline(defaults, ev, true)
		if !ok || !until.Equal(at(750*time.Millisecond)) {
			t.Errorf("loss noticed at %s: deadline %s (ok %v), want 750ms after the last proof", notice, until.Sub(t0), ok)
		}
		// A beat that landed after the notice, recording the lock as not held, moves nothing.
		ev.BeatSent, ev.BeatHolds = at(notice+time.Millisecond), false
		if until2, _ := lifegate.Deadline(defaults, ev, true); !until2.Equal(until) {
			t.Errorf("loss noticed at %s: a beat after it moved the deadline from %s to %s", notice, until.Sub(t0), until2.Sub(t0))
		}
	}
}

// TestLeaderDeadlineHeedsTheHeartbeat: whatever the lock, some observer judges the row by
// its heartbeat alone, so a leader's deadline is never past its last beat plus the stale
// threshold less the margin, even with fresh proofs; before its first beat it has none.
func TestLeaderDeadlineHeedsTheHeartbeat(t *testing.T) {
	ev := lifegate.Evidence{LockMode: true, BeatSent: at(0), BeatHolds: true, Held: true, Proof: at(80 * time.Second)}
	if until, ok := lifegate.Deadline(defaults, ev, true); !ok || !until.Equal(at(75*time.Second)) {
		t.Errorf("deadline %s (ok %v), want 75s (stale 90s less the 15s margin after the beat)", until.Sub(t0), ok)
	}
	ev.BeatSent = time.Time{}
	if _, ok := lifegate.Deadline(defaults, ev, true); ok {
		t.Error("a deadline before the first beat")
	}
	never := lifegate.Evidence{LockMode: true, BeatSent: at(0)}
	if until, ok := lifegate.Deadline(defaults, never, true); !ok || !until.Equal(at(75*time.Second)) {
		t.Errorf("never held: deadline %s (ok %v), want the heartbeat's 75s", until.Sub(t0), ok)
	}
	table := lifegate.Evidence{BeatSent: at(0), Proof: at(time.Second)}
	if until, _ := lifegate.Deadline(defaults, table, true); !until.Equal(at(75 * time.Second)) {
		t.Errorf("table-only: deadline %s, want 75s", until.Sub(t0))
	}
}

// TestTrustOnlyEnds: once the clock reaches the deadline in force, the Trust is over,
// whatever later evidence says; before that, evidence moves the deadline either way.
func TestTrustOnlyEnds(t *testing.T) {
	tr := lifegate.Start(at(0), at(time.Second), true)
	if !tr.Alive(at(999 * time.Millisecond)) {
		t.Fatal("not alive before its deadline")
	}
	if tr.Alive(at(time.Second)) {
		t.Fatal("alive at its deadline")
	}
	if !tr.Observe(at(500*time.Millisecond), at(2*time.Second), true) {
		t.Fatal("ended by a later deadline")
	}
	if !tr.Alive(at(1500 * time.Millisecond)) {
		t.Fatal("the later deadline is not in force")
	}
	if tr.Observe(at(2*time.Second), at(10*time.Second), true) {
		t.Fatal("revived by evidence that came at its deadline: a paused process must not lead on")
	}
	if tr.Alive(at(2500*time.Millisecond)) || tr.Observe(at(2500*time.Millisecond), at(time.Hour), true) {
		t.Fatal("alive again after it ended")
	}
	if _, ok := tr.Until(); ok {
		t.Fatal("an ended trust has a deadline")
	}

	short := lifegate.Start(at(0), at(time.Second), true)
	if short.Observe(at(100*time.Millisecond), at(50*time.Millisecond), true) {
		t.Fatal("alive under a deadline already past")
	}
	if lifegate.Start(at(time.Second), at(time.Second), true).Alive(at(time.Second)) {
		t.Fatal("started with no time left")
	}
	var zero lifegate.Trust
	if zero.Alive(t0) {
		t.Fatal("the zero Trust is alive")
	}
}

// TestAnchorCarriesAMomentNoLaterThanTheServersClock: the server read Server somewhere in
// the round trip, so the carried moment is at most what the server's clock reads then.
func TestAnchorCarriesAMomentNoLaterThanTheServersClock(t *testing.T) {
	offset := 3 * time.Hour // the server's clock runs ahead; only the rate is assumed equal
	for _, readAt := range []time.Duration{0, 40 * time.Millisecond, 100 * time.Millisecond} {
		a := lifegate.Anchor{Sent: at(0), Server: at(readAt + offset), RoundTrip: 100 * time.Millisecond}
		target := at(time.Second)
		if got, serverAtTarget := a.OnServer(target), target.Add(offset); got.After(serverAtTarget) {
			t.Errorf("read at %s: carried %s past the server's %s", readAt, got, serverAtTarget)
		}
	}
	older := lifegate.Anchor{Sent: at(0), Server: at(time.Hour)}
	newer := lifegate.Anchor{Sent: at(time.Second), Server: at(time.Hour)}
	if lifegate.Later(older, newer) != newer || lifegate.Later(newer, older) != newer || lifegate.Later(lifegate.Anchor{}, older) != older {
		t.Error("Later does not pick the anchor sent last")
	}
}
