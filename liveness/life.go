package liveness

import (
	"context"
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
//     minus half a fast interval (past it, observers call a lock holder a zombie).
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
	poll                       time.Duration

	alive   atomic.Bool
	changed atomic.Pointer[chan struct{}]

	lostAt time.Time // owned by run: when the loss of a lock the row says held was noticed
}

func newLifeMonitor(lock *aliveLock, hb *heartbeatWorker, lockMode bool, fast, stale, dead, grace time.Duration) *lifeMonitor {
	m := &lifeMonitor{lock: lock, heartbeat: hb, lockMode: lockMode,
		grace: grace, stale: stale, dead: dead, margin: fast / 2,
		poll: min(max(grace/10, 10*time.Millisecond), 100*time.Millisecond)}
	ch := make(chan struct{})
	m.changed.Store(&ch)
	return m
}

// Alive reports the last evaluation. Safe from any goroutine.
func (m *lifeMonitor) Alive() bool { return m.alive.Load() }

// Changed returns a channel closed at the next change of Alive.
func (m *lifeMonitor) Changed() <-chan struct{} { return *m.changed.Load() }

// run evaluates every poll until ctx ends; then the instance counts as not alive.
func (m *lifeMonitor) run(ctx context.Context) {
	t := time.NewTicker(m.poll)
	defer t.Stop()
	defer m.set(false)
	for {
		m.set(m.evaluate(time.Now()))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (m *lifeMonitor) evaluate(now time.Time) bool {
	sent, rowHolds := m.heartbeat.lastProof()
	if sent.IsZero() {
		return false
	}
	age := now.Sub(sent)
	if m.lockMode {
		if m.lock.Held() {
			m.lostAt = time.Time{}
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

func (m *lifeMonitor) set(v bool) {
	if m.alive.Swap(v) == v {
		return
	}
	next := make(chan struct{})
	close(*m.changed.Swap(&next))
}
