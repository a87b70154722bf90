package liveness

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/alivelock"
	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/lease"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// gateUnderTest is a lifeMonitor at the default timing over an alive lock that never
// connects: the test sets what the lock's session and the heartbeat would have seen.
func gateUnderTest(t *testing.T) (*lifeMonitor, *handLock, *heartbeatWorker) {
	t.Helper()
	lock := &handLock{proved: make(chan struct{})}
	hb := &heartbeatWorker{}
	m := newLifeMonitor(lock, hb, true, defaults.HeartbeatInterval, defaults.StaleThreshold, defaults.DefinitiveDeadCutoff,
		defaults.LockGrace)
	return m, lock, hb
}

// handLock is an alive lock (alivelock.Lock) whose state the test sets by hand, as its
// session would: whether it is held, its claims and proofs (a proof carries the server's
// clock and round trip last set), when its loss was noticed; and it records what a
// leadership asks of it (Lead): a proof now, and frequent ones while it counts. The life
// monitor reads no more of a lock; how a real one answers is internal/alivelock's tests'.
type handLock struct {
	held    atomic.Bool
	claims  atomic.Uint64
	leading atomic.Int32

	proofMu         sync.Mutex
	proof           alivelock.Proof
	proved          chan struct{} // closed at the next proof
	lostAt          time.Time
	lastServerClock time.Time
	lastRoundTrip   time.Duration

	wakeMu sync.Mutex
	woken  bool // a leadership asked for a proof now
}

func (l *handLock) Run(ctx context.Context) error { <-ctx.Done(); return nil }
func (l *handLock) Held() bool                    { return l.held.Load() }
func (l *handLock) HeldPID() int64                { return 0 }
func (l *handLock) Changed() <-chan struct{}      { return nil }
func (l *handLock) Duplicate() bool               { return false }
func (l *handLock) Settled() <-chan struct{}      { return nil }
func (l *handLock) ClaimCount() uint64            { return l.claims.Load() }
func (l *handLock) HeldSinceNano() int64          { return 0 }
func (l *handLock) Stats() alivelock.Stats {
	return alivelock.Stats{Held: l.held.Load(), Claims: l.claims.Load()}
}

// change sets Held, as the session does, without counting a loss.
func (l *handLock) change(v bool) { l.held.Store(v) }

// noteProof records a proof sent at sent by claim, and wakes whoever waits on the next.
func (l *handLock) noteProof(sent time.Time, claim uint64) {
	l.proofMu.Lock()
	defer l.proofMu.Unlock()
	l.proof = alivelock.Proof{Sent: sent, Claim: claim, ServerClock: l.lastServerClock, RoundTrip: l.lastRoundTrip}
	close(l.proved)
	l.proved = make(chan struct{})
}

func (l *handLock) LastProof() (alivelock.Proof, <-chan struct{}) {
	l.proofMu.Lock()
	defer l.proofMu.Unlock()
	return l.proof, l.proved
}

func (l *handLock) LossNoticed() time.Time {
	l.proofMu.Lock()
	defer l.proofMu.Unlock()
	return l.lostAt
}

func (l *handLock) Lead() (done func()) {
	l.leading.Add(1)
	l.wakeMu.Lock()
	l.woken = true
	l.wakeMu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { l.leading.Add(-1) }) }
}

// TestLeadershipEndsAtItsDeadlineUnseenAndStaysOver: a leadership's trust ends the first
// time the clock reaches its deadline (three quarters of the lock grace after the last
// proof was sent), although nothing evaluated it then (the monitor does not run here:
// a process unscheduled, a timer late), and a proof that comes later does not revive it;
// its lease's Over is closed by the first question that finds it so.
func TestLeadershipEndsAtItsDeadlineUnseenAndStaysOver(t *testing.T) {
	t.Parallel()
	ctx := testutil.Context(t, 30*time.Second)
	m, lock, hb := gateUnderTest(t)
	server := time.Date(2026, time.December, 1, 12, 0, 0, 0, time.UTC)
	now := time.Now()
	hb.lastSent, hb.lastHolds, hb.lastStamp, hb.lastRoundTrip = now, true, server, 10*time.Millisecond
	lock.change(true)
	lock.noteProof(now, lock.claims.Add(1))
	mark := m.Hold()
	go func() {
		time.Sleep(10 * time.Millisecond)
		lock.noteProof(time.Now(), lock.claims.Load())
	}()
	l, err := m.lead(ctx, mark, time.Now())
	if err != nil {
		t.Fatalf("lead: %v", err)
	}
	defer l.Stop()
	if !l.Alive() {
		t.Fatal("not alive just after a fresh proof")
	}
	p, _ := lock.LastProof()
	time.Sleep(time.Until(p.Sent.Add(defaults.LockGrace * 3 / 4)))
	lock.noteProof(time.Now(), lock.claims.Load()) // a proof that comes after the deadline
	if l.Alive() {
		t.Fatal("alive after its deadline passed unseen, revived by a later proof")
	}
	select {
	case <-l.Over():
	default:
		t.Fatal("Over not closed once the leadership was found over")
	}
	if d, ok := l.FenceDeadline(); ok {
		t.Fatalf("a fence deadline %s after the leadership ended", d)
	}
}

// TestLeadershipFenceDeadlineOnTheServersClock: a leader's fence deadline is its trust's
// deadline carried over to the server's clock by the latest statement that returned it
// (S − round trip + (T − sent)): the beat's stamp, or a later proof of the lock.
func TestLeadershipFenceDeadlineOnTheServersClock(t *testing.T) {
	t.Parallel()
	m, lock, hb := gateUnderTest(t)
	server := time.Date(2026, time.December, 1, 12, 0, 0, 0, time.UTC)
	now := time.Now()
	hb.lastSent, hb.lastHolds, hb.lastStamp, hb.lastRoundTrip = now, true, server, 10*time.Millisecond
	lock.change(true)
	lock.noteProof(now, lock.claims.Add(1)) // made by hand: no server clock, so the beat carries it over
	l, err := m.lead(testutil.Context(t, 10*time.Second), lease.HoldMark{}, now)
	if err != nil {
		t.Fatalf("lead: %v", err)
	}
	defer l.Stop()
	expect := func(what string, want time.Time) {
		t.Helper()
		if d, ok := l.FenceDeadline(); !ok || !d.Equal(want) {
			t.Fatalf("%s: fence deadline %s, %v; want %s", what, d, ok, want)
		}
	}
	expect("a proof of the beat's moment", server.Add(750*time.Millisecond-10*time.Millisecond))

	// A later proof that returned the server's clock carries the deadline over instead.
	lock.lastServerClock, lock.lastRoundTrip = server.Add(time.Second), 40*time.Millisecond
	lock.noteProof(now.Add(5*time.Millisecond), lock.claims.Load())
	expect("a later proof with the server's clock", server.Add(time.Second-40*time.Millisecond+750*time.Millisecond))

	// The lock's loss noticed moves nothing: it may have vanished just after that proof.
	lock.change(false)
	lock.proofMu.Lock()
	lock.lostAt = now.Add(105 * time.Millisecond)
	lock.proofMu.Unlock()
	expect("the loss noticed", server.Add(time.Second-40*time.Millisecond+750*time.Millisecond))
}

// TestLifeGateLeadWaitsForAProofOfTheSameClaim: a new leadership is trusted only once a
// proof sent after its acquisition was answered comes from the claim that held the lock
// before it was sent; a proof of a later claim (the lock was lost and claimed again in
// between) or none within the lock grace refuses it.
func TestLifeGateLeadWaitsForAProofOfTheSameClaim(t *testing.T) {
	t.Parallel()
	ctx := testutil.Context(t, 30*time.Second)
	m, lock, hb := gateUnderTest(t)
	hb.lastSent, hb.lastHolds = time.Now(), true
	lock.change(true)
	lock.noteProof(time.Now(), lock.claims.Add(1))
	stop := testutil.RunUntilCleanup(t, func(ctx context.Context) error { m.run(ctx); return nil })
	defer stop()
	testutil.Eventually(t, 5*time.Second, "alive", m.Alive)

	mark := m.Hold()
	answered := time.Now()
	go func() {
		time.Sleep(50 * time.Millisecond) // the verification's round trip
		lock.noteProof(time.Now(), lock.claims.Load())
	}()
	l, err := m.lead(ctx, mark, answered)
	if err != nil {
		t.Fatalf("lead with a proof of the same claim: %v", err)
	}
	lock.wakeMu.Lock()
	woken := lock.woken
	lock.wakeMu.Unlock()
	if !woken || lock.leading.Load() != 1 {
		t.Fatalf("lead did not ask the session for a proof now (woken %v) or count the leadership (%d)", woken, lock.leading.Load())
	}
	if !l.Alive() {
		t.Fatal("lead returned while not alive")
	}
	l.Stop()

	mark = m.Hold()
	answered = time.Now()
	lock.noteProof(time.Now(), lock.claims.Add(1)) // lost and claimed again: a new claim
	if l, err := m.lead(ctx, mark, answered); !errors.Is(err, errNoLockProof) {
		t.Fatalf("lead with a proof of a later claim: %v; want %v", err, errNoLockProof)
	} else if l != nil {
		t.Fatal("lead refused but returned a leadership")
	}

	mark = m.Hold()
	began := time.Now()
	if _, err := m.lead(ctx, mark, began); !errors.Is(err, errNoLockProof) {
		t.Fatalf("lead without a new proof: %v; want %v", err, errNoLockProof)
	}
	if took := time.Since(began); took < defaults.LockGrace || took > 10*defaults.LockGrace {
		t.Fatalf("lead without a proof gave up after %s; want after the lock grace (%s)", took, defaults.LockGrace)
	}
	if n := lock.leading.Load(); n != 0 {
		t.Fatalf("leading = %d after refused leaderships, want 0", n)
	}
}
