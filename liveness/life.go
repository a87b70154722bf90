package liveness

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/alivelock"
	"github.com/pg-liveness/pg_liveness_exporter/internal/lease"
	"github.com/pg-liveness/pg_liveness_exporter/internal/lifegate"
)

// lifeMonitor gathers what this process knows of its own liveness (its alive lock's
// proofs and losses, its acknowledged beats) and asks internal/lifegate, which decides by
// the same rules as instance_state_rule but always earlier, whether it may count on the
// fleet seeing it alive. Two answers:
//
//   - Alive, for a process that leads nothing: whether to try for a lease at all. It
//     trusts a held lock without fresh proofs, and a lost one for half a grace after the
//     loss was noticed (the beat the loss triggers proves life).
//   - A leadership (lead), for every lease it holds: a lifegate.Trust that follows the
//     leader's deadline (the last proof of the lock plus three quarters of the grace, and
//     the heartbeat's limit) and ends for good the first time the clock reaches it. Every
//     question a leadership is asked (alive? the fence's deadline?) looks at the evidence
//     and the clock as of then, so a late timer or a paused goroutine never lets it answer
//     from an old view; run only ends it on time, so that its job's context is cancelled.
type lifeMonitor struct {
	lock      alivelock.Lock
	heartbeat *heartbeatWorker
	lockMode  bool
	timing    lifegate.Timing
	poll      time.Duration

	alive   atomic.Bool
	changed atomic.Pointer[chan struct{}]

	mu          sync.Mutex
	leaderships map[*leadership]struct{}
	began       chan struct{} // a leadership began: run looks at its deadline
}

func newLifeMonitor(lock alivelock.Lock, hb *heartbeatWorker, lockMode bool, fast, stale, dead, grace time.Duration) *lifeMonitor {
	m := &lifeMonitor{lock: lock, heartbeat: hb, lockMode: lockMode,
		timing: lifegate.Timing{Grace: grace, Stale: stale, Dead: dead, Margin: fast / 2},
		poll:   min(max(grace/10, 10*time.Millisecond), 100*time.Millisecond),
		began:  make(chan struct{}, 1), leaderships: map[*leadership]struct{}{}}
	ch := make(chan struct{})
	m.changed.Store(&ch)
	return m
}

// leaderVerifyInterval is how often a leader's alive lock is verified
// (lifegate.Timing.LeaderVerifyInterval).
func leaderVerifyInterval(grace time.Duration) time.Duration {
	return lifegate.Timing{Grace: grace}.LeaderVerifyInterval()
}

// Alive reports the last evaluation of the gate of a process that leads nothing. Safe
// from any goroutine.
func (m *lifeMonitor) Alive() bool { return m.alive.Load() }

// Changed returns a channel closed at the next change of Alive.
func (m *lifeMonitor) Changed() <-chan struct{} { return *m.changed.Load() }

// evidence is what the gate decides from, read now.
func (m *lifeMonitor) evidence() lifegate.Evidence {
	ev := lifegate.Evidence{LockMode: m.lockMode}
	ev.BeatSent, ev.BeatHolds = m.heartbeat.lastProof()
	if m.lockMode {
		p, _ := m.lock.LastProof()
		ev.Proof, ev.Held, ev.LossNoticed = p.Sent, m.lock.Held(), m.lock.LossNoticed()
	}
	return ev
}

// anchor is the latest statement that returned the server's clock: a beat, or a proof of
// the lock.
func (m *lifeMonitor) anchor() lifegate.Anchor {
	a := m.heartbeat.lastAnchor()
	if m.lockMode {
		if p, _ := m.lock.LastProof(); !p.ServerClock.IsZero() {
			a = lifegate.Later(a, lifegate.Anchor{Sent: p.Sent, Server: p.ServerClock, RoundTrip: p.RoundTrip})
		}
	}
	return a
}

// run evaluates every poll, at each new proof of the lock, when a leadership begins, and
// at the moment the nearest leadership's deadline comes, until ctx ends; then the
// instance counts as not alive, and every leadership is over.
func (m *lifeMonitor) run(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	defer func() {
		m.set(false)
		for _, l := range m.current() {
			l.end()
		}
	}()
	for {
		var proved <-chan struct{}
		if m.lockMode {
			_, proved = m.lock.LastProof()
		}
		next := m.poll
		ev := m.evidence()
		now := time.Now()
		until, ok := lifegate.Deadline(m.timing, ev, false)
		m.set(ok && now.Before(until))
		for _, l := range m.current() {
			if until, alive := l.check(ev, now); alive {
				next = min(next, until.Sub(now))
			}
		}
		t.Reset(next)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-proved:
		case <-m.began:
		}
	}
}

func (m *lifeMonitor) current() []*leadership {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*leadership, 0, len(m.leaderships))
	for l := range m.leaderships {
		out = append(out, l)
	}
	return out
}

// steadyFor is how long the alive lock has been held without a break, zero while it is
// not (or without a lock): until the fleet has seen it held for a while (the watcher
// clears a stamp within a tick), a refused try may be the fleet's verdict on this
// instance rather than a live holder's answer, and nothing will notify when that changes.
func (m *lifeMonitor) steadyFor() time.Duration {
	if !m.lockMode || m.lock == nil {
		return 0
	}
	since := m.lock.HeldSinceNano()
	if since == 0 {
		return 0
	}
	return time.Since(time.Unix(0, since))
}

// errNoLockProof: no proof that the alive lock is held came in time for a new leadership.
var errNoLockProof = errors.New("liveness: no proof in time that the alive lock is held")

// Hold is taken just before an acquisition is sent: whether the lock was held, and by
// which claim (lease.Gate).
func (m *lifeMonitor) Hold() lease.HoldMark {
	if !m.lockMode {
		return lease.HoldMark{}
	}
	claim := m.lock.ClaimCount() // before Held: a claim counts before it is held
	return lease.HoldMark{Held: m.lock.Held(), Claim: claim}
}

// Lead is lead for internal/lease (lease.Gate): no leadership, not a nil one, with an
// error.
func (m *lifeMonitor) Lead(ctx context.Context, mark lease.HoldMark, answered time.Time) (lease.Leadership, error) {
	l, err := m.lead(ctx, mark, answered)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// lead begins a leadership whose acquisition was sent after mark was taken and answered
// at answered. The lock is verified often from now on, until the leadership ends; when it
// was held, lead waits (at most one lock grace, and within ctx) for a proof sent after
// answered by the same claim as mark's, so that the job starts with a fresh proof and
// the whole of its three quarters of the grace ahead. Then the leadership's Trust starts,
// if the gate's deadline for a leader lies ahead.
func (m *lifeMonitor) lead(ctx context.Context, mark lease.HoldMark, answered time.Time) (*leadership, error) {
	done := func() {}
	if m.lockMode {
		done = m.lock.Lead()
	}
	if m.lockMode && mark.Held {
		wctx, cancel := context.WithDeadline(ctx, answered.Add(m.timing.Grace))
		defer cancel()
		for {
			p, proved := m.lock.LastProof()
			if p.Claim > mark.Claim {
				done()
				return nil, errNoLockProof // the lock was lost and claimed again meanwhile
			}
			if !p.Sent.Before(answered) {
				break
			}
			select {
			case <-wctx.Done():
				done()
				return nil, errNoLockProof
			case <-proved:
			}
		}
	}
	l := &leadership{m: m, over: make(chan struct{}), done: done}
	ev := m.evidence()
	now := time.Now()
	until, ok := lifegate.Deadline(m.timing, ev, true)
	l.trust = lifegate.Start(now, until, ok)
	if !l.trust.Alive(now) {
		done()
		return nil, errNoLockProof
	}
	m.mu.Lock()
	m.leaderships[l] = struct{}{}
	m.mu.Unlock()
	select {
	case m.began <- struct{}{}:
	default:
	}
	return l, nil
}

func (m *lifeMonitor) set(v bool) {
	if m.alive.Swap(v) == v {
		return
	}
	next := make(chan struct{})
	close(*m.changed.Swap(&next))
}

// leadership is one lease's trust in the gate (lifegate.Trust): it ends for good the
// first time the clock reaches the leader's deadline in force, which every question put to
// it checks as of then.
type leadership struct {
	m    *lifeMonitor
	done func() // the lock goes back to its usual verifications

	mu    sync.Mutex
	trust lifegate.Trust

	over     chan struct{} // closed once the trust has ended
	overOnce sync.Once
	stopOnce sync.Once
}

// check observes the gate (evidence ev, read before now) and returns the deadline in
// force while the trust holds.
func (l *leadership) check(ev lifegate.Evidence, now time.Time) (until time.Time, alive bool) {
	until, ok := lifegate.Deadline(l.m.timing, ev, true)
	l.mu.Lock()
	alive = l.trust.Observe(now, until, ok)
	l.mu.Unlock()
	if !alive {
		l.end()
	}
	return until, alive
}

// Alive reports whether the leadership still holds, as of now.
func (l *leadership) Alive() bool {
	ev := l.m.evidence()
	_, alive := l.check(ev, time.Now())
	return alive
}

// Over returns a channel closed once the leadership has ended.
func (l *leadership) Over() <-chan struct{} { return l.over }

// FenceDeadline is the moment, on the server's clock, past which a write fenced now under
// this leadership must be refused (lifegate.FenceUntil carried over with the latest
// statement that returned the server's clock); false when it must be refused already.
func (l *leadership) FenceDeadline() (time.Time, bool) {
	ev := l.m.evidence()
	anchor := l.m.anchor()
	now := time.Now()
	if _, alive := l.check(ev, now); !alive {
		return time.Time{}, false
	}
	l.mu.Lock()
	until, ok := lifegate.FenceUntil(l.m.timing, ev, l.trust, now)
	l.mu.Unlock()
	if !ok || anchor.Server.IsZero() {
		return time.Time{}, false
	}
	return anchor.OnServer(until), true
}

// end marks the leadership over (its trust ran out, or the monitor stopped).
func (l *leadership) end() {
	l.overOnce.Do(func() {
		l.mu.Lock()
		l.trust = lifegate.Trust{}
		l.mu.Unlock()
		close(l.over)
	})
}

// Stop is called once the lease has ended: the leadership is over, the monitor forgets
// it, and the lock goes back to its usual verifications once no leadership is left.
func (l *leadership) Stop() {
	l.stopOnce.Do(func() {
		l.end()
		l.m.mu.Lock()
		delete(l.m.leaderships, l)
		l.m.mu.Unlock()
		l.done()
	})
}
