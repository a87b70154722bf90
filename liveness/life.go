package liveness

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// lifeMonitor tells whether this instance can count on the fleet seeing it alive, by the
// same rules as instance_states, but always earlier: it answers from what this process
// knows (its alive lock, and when its last successful beat was sent), with margins, so
// that a process stops leading before any observer can call it dead and let another
// process take its leases.
//
//   - Before the first successful beat: not alive (there is no row to see).
//   - Lock held: alive while the last beat is younger than the definitive-dead cutoff
//     minus half a fast interval (past it, observers call a lock holder a zombie). While
//     this instance leads (lead), also only while the last proof that the lock is held
//     was sent less than the lock grace less a quarter ago (proofMaxAge): the lock may
//     vanish, unseen by a session cut off from the server, at any moment after that
//     proof ran, and observers call the instance dead one lock grace later.
//   - Lock gone while the row still says held: alive for half the lock grace after the
//     loss was noticed; the heartbeat beats at once to prove life, and a proof ends this
//     case.
//   - Otherwise (no lock, or table-only mode): alive while the last beat is younger than
//     the stale threshold minus half a fast interval.
//
// The beat's age counts from when it was sent, which is before the server stamped it,
// so the local age is never below the database's.
type lifeMonitor struct {
	lock                       lockSession
	heartbeat                  *heartbeatWorker
	lockMode                   bool
	grace, stale, dead, margin time.Duration
	proofMaxAge                time.Duration // of the lock's last proof, while leading
	poll                       time.Duration

	alive   atomic.Bool
	changed atomic.Pointer[chan struct{}]

	lostAt time.Time // owned by run: when the loss of a lock the row says held was noticed
}

func newLifeMonitor(lock lockSession, hb *heartbeatWorker, lockMode bool, fast, stale, dead, grace time.Duration) *lifeMonitor {
	m := &lifeMonitor{lock: lock, heartbeat: hb, lockMode: lockMode,
		grace: grace, stale: stale, dead: dead, margin: fast / 2, proofMaxAge: grace - leaderVerifyInterval(grace),
		poll: min(max(grace/10, 10*time.Millisecond), 100*time.Millisecond)}
	ch := make(chan struct{})
	m.changed.Store(&ch)
	return m
}

// leaderVerifyInterval is how often a leader's alive lock is verified: a quarter of the
// lock grace, so that a proof or two may come late before the last one's age reaches
// proofMaxAge (the other three quarters), and the last quarter is left for the job to
// notice its cancelled context.
func leaderVerifyInterval(grace time.Duration) time.Duration { return grace / 4 }

// Alive reports the last evaluation. Safe from any goroutine.
func (m *lifeMonitor) Alive() bool { return m.alive.Load() }

// Changed returns a channel closed at the next change of Alive.
func (m *lifeMonitor) Changed() <-chan struct{} { return *m.changed.Load() }

// run evaluates every poll, at each new proof of the lock, and, while leading, the moment
// the last proof grows too old, until ctx ends; then the instance counts as not alive.
func (m *lifeMonitor) run(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	defer m.set(false)
	for {
		now := time.Now()
		var proved <-chan struct{}
		next := m.poll
		if m.lockMode {
			var p lockProof
			p, proved = m.lock.lastProof()
			if m.leading() && !p.sent.IsZero() {
				if left := p.sent.Add(m.proofMaxAge).Sub(now); left > 0 {
					next = min(next, left)
				}
			}
		}
		m.set(m.evaluate(now))
		t.Reset(next)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-proved:
		}
	}
}

// leading reports whether a leadership wants its lock proved often.
// steadyFor is how long the alive lock has been held without a break, zero while it is
// not (or without a lock): until the fleet has seen it held for a while (the watcher
// clears a stamp within a tick), a refused try may be the fleet's verdict on this
// instance rather than a live holder's answer, and nothing will notify when that changes.
func (m *lifeMonitor) steadyFor() time.Duration {
	if !m.lockMode || m.lock == nil {
		return 0
	}
	since := m.lock.heldSinceNano()
	if since == 0 {
		return 0
	}
	return time.Since(time.Unix(0, since))
}

func (m *lifeMonitor) leading() bool { return m.lockMode && m.lock.leaders() > 0 }

func (m *lifeMonitor) evaluate(now time.Time) bool {
	st := m.state()
	if st.lockLost() {
		if m.lostAt.IsZero() {
			m.lostAt = now
		}
	} else {
		m.lostAt = time.Time{}
	}
	until, ok := m.aliveUntil(st, m.lostAt)
	return ok && now.Before(until)
}

// lifeState is what the rules look at, read once.
type lifeState struct {
	beatSent time.Time // of the last successful beat; zero before the first
	rowHolds bool      // that beat recorded the lock as held
	held     bool      // the lock, as its session last saw it
	leading  bool
	proof    lockProof
}

func (m *lifeMonitor) state() lifeState {
	var st lifeState
	st.beatSent, st.rowHolds = m.heartbeat.lastProof()
	if m.lockMode {
		st.held, st.leading = m.lock.Held(), m.leading()
		st.proof, _ = m.lock.lastProof()
	}
	return st
}

// lockLost: the lock is gone while the row still says it is held.
func (st lifeState) lockLost() bool { return !st.held && st.rowHolds }

// aliveUntil is the moment, on this host's clock, at which the rules stop counting the
// instance alive given st, and lostAt when the lock is gone while the row says held
// (when that was noticed). ok is false before the first beat: not alive at all.
func (m *lifeMonitor) aliveUntil(st lifeState, lostAt time.Time) (until time.Time, ok bool) {
	if st.beatSent.IsZero() {
		return time.Time{}, false
	}
	if m.lockMode {
		if st.held {
			until = st.beatSent.Add(m.dead - m.margin)
			if st.leading {
				if st.proof.sent.IsZero() {
					return time.Time{}, true
				}
				until = earliest(until, st.proof.sent.Add(m.proofMaxAge))
			}
			return until, true
		}
		if st.rowHolds {
			return earliest(st.beatSent.Add(m.dead-m.margin), lostAt.Add(m.grace/2)), true
		}
	}
	return st.beatSent.Add(m.stale - m.margin), true
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// fenceDeadline is aliveUntil on the server's clock: when, by the server's clock, the
// rules stop counting this instance alive as of now. A local moment T becomes the
// server's S − roundTrip + (T − sent), from the latest statement that returned the
// server's clock S (the beat's stamp, or the lock proof's clock_timestamp) and was sent
// at sent: the server read S after sent, so its clock reads that value no later than T.
// The lock gone while the row says held counts from when the lock's session noticed the
// loss, which is no later than when the rules did. ok is false without any such
// statement (only tests make those); before the first beat the deadline is the zero
// time, which refuses every write.
func (m *lifeMonitor) fenceDeadline() (deadline time.Time, ok bool) {
	st := m.state()
	anchor := m.heartbeat.lastAnchor() // may be a beat newer than st's: it is read whole
	if p := st.proof; !p.serverClock.IsZero() && (anchor.server.IsZero() || p.sent.After(anchor.sent)) {
		anchor = serverAnchor{sent: p.sent, server: p.serverClock, roundTrip: p.roundTrip}
	}
	if anchor.server.IsZero() {
		return time.Time{}, false
	}
	var lostAt time.Time
	if st.lockLost() {
		if lostAt = m.lock.lossNoticed(); lostAt.IsZero() {
			lostAt = st.proof.sent // the lock vanished after its last proof
		}
	}
	until, alive := m.aliveUntil(st, lostAt)
	if !alive || until.IsZero() {
		return time.Time{}, true
	}
	return anchor.server.Add(until.Sub(anchor.sent) - anchor.roundTrip), true
}

// serverAnchor is a statement that returned the server's clock: when it was sent (this
// host's monotonic clock), what the server's clock read while it ran, and its round trip.
type serverAnchor struct {
	sent, server time.Time
	roundTrip    time.Duration
}

// errNoLockProof: no proof that the lock is held came in time for a new leadership.
var errNoLockProof = errors.New("liveness: no proof in time that the alive lock is held")

// holdMark is what hold saw before an acquisition was sent: whether the lock was held,
// and by which claim.
type holdMark struct {
	held  bool
	claim uint64
}

// hold is taken just before an acquisition is sent.
func (m *lifeMonitor) hold() holdMark {
	if !m.lockMode {
		return holdMark{}
	}
	claim := m.lock.claimCount() // before Held: a claim counts before it is held
	return holdMark{held: m.lock.Held(), claim: claim}
}

// lead begins a leadership whose acquisition was sent after mark was taken and answered
// at answered: the lock is verified often from now on, until done is called, and lead
// waits (at most one lock grace, and within ctx) for a proof sent after answered by the
// same claim as mark's (so one session held the lock from before the acquisition ran
// until after it), and for Alive. Then the lease may be trusted. Without a lock, or when
// the lock was not held (the fleet then judges the instance by its heartbeat, and no
// vanishing lock can make it dead early), it waits for nothing.
func (m *lifeMonitor) lead(ctx context.Context, mark holdMark, answered time.Time) (done func(), err error) {
	if !m.lockMode {
		return func() {}, nil
	}
	done = m.lock.lead()
	if !mark.held {
		return done, nil
	}
	wctx, cancel := context.WithDeadline(ctx, answered.Add(m.grace))
	defer cancel()
	for {
		changed := m.Changed()
		p, proved := m.lock.lastProof()
		if p.claim > mark.claim {
			done()
			return nil, errNoLockProof // the lock was lost and claimed again meanwhile
		}
		if !p.sent.Before(answered) && m.Alive() {
			return done, nil
		}
		select {
		case <-wctx.Done():
			done()
			return nil, errNoLockProof
		case <-proved:
		case <-changed:
		}
	}
}

func (m *lifeMonitor) set(v bool) {
	if m.alive.Swap(v) == v {
		return
	}
	next := make(chan struct{})
	close(*m.changed.Swap(&next))
}
