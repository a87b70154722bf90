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
	lock                       *aliveLock
	heartbeat                  *heartbeatWorker
	lockMode                   bool
	grace, stale, dead, margin time.Duration
	proofMaxAge                time.Duration // of the lock's last proof, while leading
	poll                       time.Duration

	alive   atomic.Bool
	changed atomic.Pointer[chan struct{}]

	lostAt time.Time // owned by run: when the loss of a lock the row says held was noticed
}

func newLifeMonitor(lock *aliveLock, hb *heartbeatWorker, lockMode bool, fast, stale, dead, grace time.Duration) *lifeMonitor {
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
func (m *lifeMonitor) leading() bool { return m.lockMode && m.lock.leading.Load() > 0 }

func (m *lifeMonitor) evaluate(now time.Time) bool {
	sent, rowHolds := m.heartbeat.lastProof()
	if sent.IsZero() {
		return false
	}
	age := now.Sub(sent)
	if m.lockMode {
		if m.lock.Held() {
			m.lostAt = time.Time{}
			if m.leading() {
				if p, _ := m.lock.lastProof(); p.sent.IsZero() || now.Sub(p.sent) >= m.proofMaxAge {
					return false
				}
			}
			return age < m.dead-m.margin
		}
		if rowHolds {
			if m.lostAt.IsZero() {
				m.lostAt = now
			}
			return now.Sub(m.lostAt) < m.grace/2 && age < m.dead-m.margin
		}
		m.lostAt = time.Time{}
	}
	return age < m.stale-m.margin
}

// fenceDeadline is when, on the server's clock, evaluate turns false as of the last beat
// and the last proof of the lock: each rule's local age limit, counted from a statement
// that returned the server's clock (the beat's stamp, the proof's clock_timestamp), less
// that statement's round trip. The server's clock reads it no later than the moment the
// rule ends here. The lock gone while the row says held counts from the last proof (the
// rule's half grace after the loss was noticed ends about then, never earlier). ok is
// false before the first beat, which no leader is without.
func (m *lifeMonitor) fenceDeadline() (deadline time.Time, ok bool) {
	bound := func(from time.Time, roundTrip, limit time.Duration) {
		if from.IsZero() {
			return
		}
		if d := from.Add(limit - roundTrip); !ok || d.Before(deadline) {
			deadline, ok = d, true
		}
	}
	stamp, beatTrip, rowHolds := m.heartbeat.lastStamped()
	if m.lockMode {
		if held := m.lock.Held(); held || rowHolds {
			bound(stamp, beatTrip, m.dead-m.margin)
			if !held || m.leading() {
				p, _ := m.lock.lastProof()
				bound(p.serverClock, p.roundTrip, m.proofMaxAge)
			}
			return deadline, ok
		}
	}
	bound(stamp, beatTrip, m.stale-m.margin)
	return deadline, ok
}

// errNoLockProof: no proof that the lock is held came in time for a new leadership.
var errNoLockProof = errors.New("no proof in time that the alive lock is held")

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
	claim := m.lock.claims.Load() // before Held: a claim counts before it is held
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
