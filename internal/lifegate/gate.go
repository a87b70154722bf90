package lifegate

import "time"

// Timing is what the gate's rules count with: the instance's own timing, as its row
// records it for the fleet.
type Timing struct {
	Grace  time.Duration // the lock grace
	Stale  time.Duration // the stale threshold
	Dead   time.Duration // the definitive-dead cutoff
	Margin time.Duration // taken off the heartbeat's limits: half a fast interval
}

// LeaderVerifyInterval is how often a leader's alive lock is verified: a quarter of the
// lock grace, so that a proof or two may come late before the last one's age reaches
// ProofMaxAge.
func (t Timing) LeaderVerifyInterval() time.Duration { return t.Grace / 4 }

// ProofMaxAge is how long after its sending a leader's last proof of its lock vouches
// for it: three quarters of the lock grace. The fleet may call the instance dead one
// grace after the lock vanished, which may be just after that proof ran; the last
// quarter is the job's time to notice its cancelled context.
func (t Timing) ProofMaxAge() time.Duration { return t.Grace - t.LeaderVerifyInterval() }

// Evidence is what the process knows of its own liveness, each time on its own
// monotonic clock.
type Evidence struct {
	// LockMode is false in heartbeat-table-only mode: no lock, judged by the heartbeat.
	LockMode bool
	// BeatSent is when the last beat the server acknowledged was sent (zero before the
	// first); BeatHolds, whether it recorded the lock as held.
	BeatSent  time.Time
	BeatHolds bool
	// Held is whether the lock's session holds the lock as far as it knows (its last
	// claim or verification found it held, and it has noticed no loss since).
	Held bool
	// Proof is the last claim or verification that found the lock held: when it was
	// sent. Zero if the lock was never held.
	Proof time.Time
	// LossNoticed is when the session last noticed that the lock was no longer held.
	LossNoticed time.Time
}

// Deadline is the moment, on the process's clock, until which the instance may count on
// the fleet seeing it alive, by the rules in the package's doc; ok is false when it may
// not at all (no acknowledged beat yet). With leading false it is the gate of a process
// that leads nothing, which decides only whether to try for a lease: it trusts a held
// lock without fresh proofs and a lost one for half a grace after the loss was noticed.
// A leadership needs leading true, and a Trust.
func Deadline(t Timing, ev Evidence, leading bool) (until time.Time, ok bool) {
	if ev.BeatSent.IsZero() {
		return time.Time{}, false // no row yet for the fleet to see
	}
	heartbeat := ev.BeatSent.Add(t.Stale - t.Margin)
	if !ev.LockMode {
		return heartbeat, true
	}
	if leading {
		if ev.Proof.IsZero() {
			// Never held: no beat recorded it held, so the fleet judges the instance by
			// its heartbeat alone.
			return heartbeat, true
		}
		return earliest(heartbeat, ev.Proof.Add(t.ProofMaxAge())), true
	}
	switch {
	case ev.Held:
		return ev.BeatSent.Add(t.Dead - t.Margin), true
	case ev.BeatHolds:
		// Lost while the row says held: the beat the loss triggers proves life.
		return earliest(ev.BeatSent.Add(t.Dead-t.Margin), ev.LossNoticed.Add(t.Grace/2)), true
	}
	return heartbeat, true
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// Trust is one leadership's trust in the gate. It starts at a moment the gate's deadline
// lies ahead, follows the deadline as the evidence moves it, and ends for good the first
// time the clock reaches the deadline in force: later evidence never revives it. The
// zero Trust has ended. Not safe for concurrent use: its owner serializes.
type Trust struct {
	until time.Time
	ended bool
}

// Start begins a Trust at now under the gate's deadline (until, ok); it has already
// ended when that deadline does not lie ahead.
func Start(now, until time.Time, ok bool) Trust {
	if !ok || !now.Before(until) {
		return Trust{ended: true}
	}
	return Trust{until: until}
}

// Observe takes the gate's deadline as of now and reports whether the Trust is still
// alive. If now has reached the deadline in force, the Trust ends, whatever the new
// deadline says; otherwise the new one is in force from now on (it may lie earlier or
// later), and ends the Trust at once when it does not lie ahead.
func (tr *Trust) Observe(now, until time.Time, ok bool) bool {
	if tr.ended {
		return false
	}
	if !now.Before(tr.until) || !ok || !now.Before(until) {
		tr.ended, tr.until = true, time.Time{}
		return false
	}
	tr.until = until
	return true
}

// Alive reports whether the Trust still holds at now: it has not ended, and now is
// before the deadline in force. It changes nothing: a Trust whose deadline has passed
// unobserved says not alive all the same, and the next Observe ends it.
func (tr Trust) Alive(now time.Time) bool { return !tr.ended && now.Before(tr.until) }

// Until is the deadline in force, and false once the Trust has ended.
func (tr Trust) Until() (time.Time, bool) { return tr.until, !tr.ended }

// FenceUntil is the moment, on the process's clock, past which a write fenced now under
// the leadership tr must be refused; false when it must be refused already. It is the
// Trust's deadline, but for a lock never yet held: its deadline is the heartbeat's, far
// ahead, and the lock may be claimed, recorded held by a beat and lost right after this
// fence, which the fleet may call dead one grace after the beat landed; the fence's
// deadline stays on the server whatever happens here later, so it lies at most three
// quarters of the grace ahead. (The Trust itself follows such a change: its deadline
// moves when the next beat records the lock held.)
func FenceUntil(t Timing, ev Evidence, tr Trust, now time.Time) (until time.Time, ok bool) {
	until, ok = tr.Until()
	if !ok || !now.Before(until) {
		return time.Time{}, false
	}
	if ev.LockMode && ev.Proof.IsZero() {
		until = earliest(until, now.Add(t.ProofMaxAge()))
	}
	return until, true
}

// Anchor is a statement that returned the server's clock: when it was sent (the
// process's clock), what the server's clock read while it ran, and its round trip.
type Anchor struct {
	Sent      time.Time
	Server    time.Time
	RoundTrip time.Duration
}

// OnServer carries the process's moment t over to the server's clock, no later than the
// server's clock reads at t: the server read Server at some moment between Sent and
// Sent + RoundTrip, so at t its clock reads at least Server − RoundTrip + (t − Sent)
// (clocks running at the same rate). A fence deadline taken this way refuses whatever
// reaches the server after t.
func (a Anchor) OnServer(t time.Time) time.Time {
	return a.Server.Add(t.Sub(a.Sent) - a.RoundTrip)
}

// Later returns the anchor of the two that was sent last; the zero Anchor never wins.
func Later(a, b Anchor) Anchor {
	if a.Server.IsZero() || (!b.Server.IsZero() && b.Sent.After(a.Sent)) {
		return b
	}
	return a
}
