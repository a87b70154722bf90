package alivelock

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Lock is an instance's alive lock, however it is held: on a direct session of its own
// (Direct), or on the node agent's session, attached over a local socket (Node). The
// library's Agent, its heartbeat and its life monitor see only this.
type Lock interface {
	// Run holds the lock until ctx ends, then lets it go.
	Run(ctx context.Context) error
	Held() bool
	HeldPID() int64
	Changed() <-chan struct{}
	Duplicate() bool
	Settled() <-chan struct{}
	Stats() Stats
	LastProof() (Proof, <-chan struct{})
	LossNoticed() time.Time
	Lead() (done func())
	ClaimCount() uint64
	HeldSinceNano() int64
}

// Stats is the library's AgentSnapshot.AliveLock, by name for the lock's two kinds (held
// on the agent's own session or through a node agent). The two declarations must stay
// alike: the library's Snapshot assigns one to the other, so its build fails if they
// drift.
type Stats struct {
	Duplicate, Stranger, Held  bool
	Claims, Losses, Reconnects uint64
}

// state is what every way of holding the alive lock shares: whether it is held and by
// which backend, its claims, proofs, losses and leaderships, and who waits for a change.
// Its owner (Direct, Node) runs the session and calls the setters from its Run
// goroutine; the getters are safe from any goroutine.
type state struct {
	held      atomic.Bool
	pid       atomic.Int64 // the backend pid of the session that last claimed the lock
	duplicate atomic.Bool  // the last claim found the lock held by another session of this instance
	stranger  atomic.Bool  // the last claim found the key held by a session that did not claim it
	changed   atomic.Pointer[chan struct{}]
	settled   chan struct{} // closed once the first claim has an answer
	settle    sync.Once

	claims     atomic.Uint64
	losses     atomic.Uint64
	reconnects atomic.Uint64

	// leading counts the leaderships (Lead) that want frequent proofs.
	leading atomic.Int32
	// proof is the last claim or verification that answered "held"; proved is closed at
	// the next one.
	proofMu sync.Mutex
	proof   Proof
	proved  chan struct{}
	lostAt  time.Time // monotonic: when setHeld last cleared Held
	// heldSince is when the lock was last found held after not being (UnixNano; 0 while
	// not held).
	heldSince atomic.Int64
	// wake, set by the owner, asks its session for a proof now.
	wake func()
}

func (a *state) init() {
	a.proved = make(chan struct{})
	ch := make(chan struct{})
	a.changed.Store(&ch)
	a.settled = make(chan struct{})
}

// ClaimCount counts the claims that took the lock: a new one means that it was lost and
// claimed again. Safe from any goroutine.
func (a *state) ClaimCount() uint64 { return a.claims.Load() }

// HeldSinceNano is when the lock was last found held after not being (UnixNano), 0 while
// it is not held. Safe from any goroutine.
func (a *state) HeldSinceNano() int64 { return a.heldSince.Load() }

// Held reports whether the lock is claimed and was verified on the holding session's own
// backend. It never blocks, is safe from any goroutine, and is false on a nil state.
func (a *state) Held() bool { return a != nil && a.held.Load() }

// HeldPID is the backend pid of the session that holds the lock, and 0 while it is not
// held: the heartbeat records it, and only that session's lock counts for the instance.
func (a *state) HeldPID() int64 {
	if a == nil || !a.held.Load() {
		return 0
	}
	return a.pid.Load()
}

// Changed returns a channel that is closed at the next change of Held. Take the channel
// before reading Held, then wait on it; call Changed again for the change after that.
func (a *state) Changed() <-chan struct{} {
	if a == nil {
		return nil
	}
	return *a.changed.Load()
}

// Duplicate reports whether the last claim found the lock held by another session: a
// second process runs with this instance id, or this instance's previous session has
// not ended yet. Such a process must not write the instance's row.
func (a *state) Duplicate() bool { return a != nil && a.duplicate.Load() }

// Settled returns a channel that is closed once the first claim has an answer: held,
// held by another session, or refused (a pooler, a missing function). The heartbeat
// waits for it, boundedly, so that a duplicate never writes a row.
func (a *state) Settled() <-chan struct{} {
	if a == nil {
		return nil
	}
	return a.settled
}

// Stats returns counters for exporters. Safe from any goroutine.
func (a *state) Stats() Stats {
	return Stats{
		Duplicate:  a.duplicate.Load(),
		Stranger:   a.stranger.Load(),
		Held:       a.held.Load(),
		Claims:     a.claims.Load(),
		Losses:     a.losses.Load(),
		Reconnects: a.reconnects.Load(),
	}
}

// Lead has the lock proved every leaderEvery, starting now, until the returned function
// (idempotent) is called; leaderships count, so the lock goes back to verifyEvery only
// once none is left. Safe from any goroutine.
func (a *state) Lead() (done func()) {
	if a == nil {
		return func() {}
	}
	a.leading.Add(1)
	if a.wake != nil {
		a.wake()
	}
	var once sync.Once
	return func() { once.Do(func() { a.leading.Add(-1) }) }
}

// Proof is a claim or a verification that answered "held": the lock was held, on the
// session's own backend, when the statement ran, which was after Sent. The lock may have
// vanished at any moment since; Claim counts the successful claims, so that two proofs
// with the same Claim show that one session held the lock between them.
type Proof struct {
	Sent  time.Time // monotonic
	Claim uint64
	// ServerClock is the server's clock while the statement ran, and RoundTrip the time
	// from sending it to its answer (zero in tests that make proofs by hand). The server's
	// clock reads ServerClock − RoundTrip + d no later than Sent + d: that is how a local
	// deadline becomes one on the server's clock (the library's fence deadline).
	ServerClock time.Time
	RoundTrip   time.Duration
}

// recordProof records a proof and wakes whoever waits on the next one. Only the owner's
// Run goroutine calls it.
func (a *state) recordProof(p Proof) {
	a.proofMu.Lock()
	defer a.proofMu.Unlock()
	a.proof = p
	close(a.proved)
	a.proved = make(chan struct{})
}

// LastProof returns the last proof (zero before the first), and a channel closed at the
// next one. Safe from any goroutine.
func (a *state) LastProof() (Proof, <-chan struct{}) {
	a.proofMu.Lock()
	defer a.proofMu.Unlock()
	return a.proof, a.proved
}

// settledOnce closes Settled, once: the first claim has an answer.
func (a *state) settledOnce() { a.settle.Do(func() { close(a.settled) }) }

// setHeld records a change of Held, counting a loss, and wakes whoever waits on
// Changed. Only the owner calls it: its Run goroutine, or a timer of a statement in
// flight that the Run goroutine waits for before it goes on.
func (a *state) setHeld(v bool) {
	if a.held.Load() == v {
		return
	}
	if v {
		a.heldSince.Store(time.Now().UnixNano())
	} else {
		a.heldSince.Store(0)
	}
	if !v {
		a.losses.Add(1)
		a.proofMu.Lock()
		a.lostAt = time.Now()
		a.proofMu.Unlock()
	}
	a.change(v)
}

// LossNoticed is when the session last noticed that the lock was no longer held (zero
// before the first loss). Safe from any goroutine.
func (a *state) LossNoticed() time.Time {
	a.proofMu.Lock()
	defer a.proofMu.Unlock()
	return a.lostAt
}

// setDuplicate records a change of Duplicate and wakes whoever waits on Changed.
func (a *state) setDuplicate(v bool) {
	if a.duplicate.Swap(v) != v {
		a.change(a.held.Load())
	}
}

// release clears Held on shutdown, which is not a loss.
func (a *state) release() {
	if a.held.Load() {
		a.change(false)
	}
}

func (a *state) change(v bool) {
	a.held.Store(v)
	next := make(chan struct{})
	close(*a.changed.Swap(&next))
}
