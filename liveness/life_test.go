package liveness

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// gateUnderTest is a lifeMonitor at the default timing over an alive lock that never
// connects: the test sets what the lock's session and the heartbeat would have seen.
func gateUnderTest(t *testing.T) (*lifeMonitor, *aliveLock, *heartbeatWorker) {
	t.Helper()
	lock, err := newAliveLock(aliveLockConfig{DSN: "host=127.0.0.1 dbname=unused", InstanceID: uuid.New(), ServiceName: "svc",
		LeaderVerifyInterval: leaderVerifyInterval(DefaultLockGrace)})
	if err != nil {
		t.Fatal(err)
	}
	hb := &heartbeatWorker{}
	m := newLifeMonitor(lock, hb, true, DefaultHeartbeatInterval, DefaultStaleThreshold, DefaultDefinitiveDeadCutoff,
		DefaultLockGrace)
	return m, lock, hb
}

// TestLifeGateWantsAFreshLockProofWhileLeading: with the lock held and a fresh beat, an
// instance is alive; while it leads, only as long as the last proof that the lock is held
// was sent less than three quarters of the lock grace ago (a session cut off from the
// server cannot see its lock vanish, and the fleet calls it dead a lock grace after).
func TestLifeGateWantsAFreshLockProofWhileLeading(t *testing.T) {
	m, lock, hb := gateUnderTest(t)
	now := time.Now()
	hb.lastSent, hb.lastHolds = now.Add(-time.Second), true
	lock.change(true)
	lock.noteProof(now.Add(-800*time.Millisecond), lock.claims.Add(1)) // older than 750 ms

	if !m.evaluate(now) {
		t.Fatal("not alive without leading, with the lock held and a fresh beat")
	}
	done := lock.lead()
	if m.evaluate(now) {
		t.Fatal("alive while leading on a proof sent 800 ms ago; want not alive past 750 ms (lock grace 1 s)")
	}
	if !m.evaluate(now.Add(-100 * time.Millisecond)) { // the same proof, 700 ms old
		t.Fatal("not alive while leading on a proof 700 ms old; want alive below 750 ms")
	}
	lock.noteProof(now.Add(-10*time.Millisecond), lock.claims.Load())
	if !m.evaluate(now) {
		t.Fatal("not alive while leading on a fresh proof")
	}
	if m.evaluate(now.Add(750 * time.Millisecond)) {
		t.Fatal("alive while leading 760 ms after the last proof was sent")
	}
	done()
	done() // idempotent: the count must not go below the other leaderships'
	if n := lock.leading.Load(); n != 0 {
		t.Fatalf("leading = %d after done, want 0", n)
	}
	if !m.evaluate(now.Add(750 * time.Millisecond)) {
		t.Fatal("not alive after the leadership ended, with the lock held and a fresh beat")
	}

	// Without a lock (table-only mode) there is no proof to want.
	table := newLifeMonitor(nil, hb, false, DefaultHeartbeatInterval, DefaultStaleThreshold, DefaultDefinitiveDeadCutoff,
		DefaultLockGrace)
	if !table.evaluate(now) {
		t.Fatal("table-only: not alive with a fresh beat")
	}
}

// TestLifeGateFenceDeadlineMirrorsItsRulesOnTheServersClock: the fence deadline is the
// moment the gate's rules end, carried over to the server's clock through the latest
// statement that returned it (S − round trip + (T − sent)): the beat's stamp, or a later
// proof of the lock. Each rule: three quarters of the lock grace after the last proof
// while leading; half the grace after the loss was noticed while the row still says the
// lock is held; the heartbeat's limits less half a fast interval otherwise.
func TestLifeGateFenceDeadlineMirrorsItsRulesOnTheServersClock(t *testing.T) {
	m, lock, hb := gateUnderTest(t)
	if d, ok := m.fenceDeadline(); ok {
		t.Fatalf("fence deadline %s before any statement returned the server's clock; want none", d)
	}
	server := time.Date(2026, time.December, 1, 12, 0, 0, 0, time.UTC)
	now := time.Now()
	hb.lastSent, hb.lastHolds, hb.lastStamp, hb.lastRoundTrip = now, true, server, 10*time.Millisecond
	lock.change(true)
	margin := DefaultHeartbeatInterval / 2
	expect := func(what string, want time.Time) {
		t.Helper()
		if d, ok := m.fenceDeadline(); !ok || !d.Equal(want) {
			t.Fatalf("%s: fence deadline %s, %v; want %s", what, d, ok, want)
		}
	}
	byBeat := func(after time.Duration) time.Time { return server.Add(after - 10*time.Millisecond) }
	expect("lock held, not leading", byBeat(DefaultDefinitiveDeadCutoff-margin))

	done := lock.lead()
	defer done()
	expect("leading without a proof", time.Time{})
	lock.noteProof(now, lock.claims.Add(1)) // made by hand: no server clock, so the beat carries it over
	expect("leading on a proof of the beat's moment", byBeat(750*time.Millisecond))

	// A later proof that returned the server's clock carries the rules over instead.
	lock.lastServerClock, lock.lastRoundTrip = server.Add(time.Second), 40*time.Millisecond
	lock.noteProof(now.Add(5*time.Millisecond), lock.claims.Load())
	byProof := func(after time.Duration) time.Time { return server.Add(time.Second - 40*time.Millisecond + after) }
	expect("leading, lock held", byProof(750*time.Millisecond))

	lock.change(false) // gone, the loss not recorded: counted from the last proof
	expect("the lock gone while the row says held, loss not noticed", byProof(500*time.Millisecond))
	lock.proofMu.Lock()
	lock.lostAt = now.Add(105 * time.Millisecond)
	lock.proofMu.Unlock()
	expect("the lock gone while the row says held", byProof(100*time.Millisecond+500*time.Millisecond))
	hb.lastHolds = false
	expect("the lock gone and the row without it: judged by the heartbeat",
		byProof(DefaultStaleThreshold-margin-5*time.Millisecond))
}

// TestLifeGateLeadWaitsForAProofOfTheSameClaim: a new leadership is trusted only once a
// proof sent after its acquisition was answered comes from the claim that held the lock
// before it was sent; a proof of a later claim (the lock was lost and claimed again in
// between) or none within the lock grace refuses it.
func TestLifeGateLeadWaitsForAProofOfTheSameClaim(t *testing.T) {
	ctx := testutil.Context(t, 30*time.Second)
	m, lock, hb := gateUnderTest(t)
	hb.lastSent, hb.lastHolds = time.Now(), true
	lock.change(true)
	lock.noteProof(time.Now(), lock.claims.Add(1))
	stop := runUntilCleanup(t, func(ctx context.Context) error { m.run(ctx); return nil })
	defer stop()
	testutil.Eventually(t, 5*time.Second, "alive", m.Alive)

	mark := m.hold()
	answered := time.Now()
	go func() {
		time.Sleep(50 * time.Millisecond) // the verification's round trip
		lock.noteProof(time.Now(), lock.claims.Load())
	}()
	done, err := m.lead(ctx, mark, answered)
	if err != nil {
		t.Fatalf("lead with a proof of the same claim: %v", err)
	}
	lock.wakeMu.Lock()
	woken := lock.woken
	lock.wakeMu.Unlock()
	if !woken || lock.leading.Load() != 1 {
		t.Fatalf("lead did not ask the session for a proof now (woken %v) or count the leadership (%d)", woken, lock.leading.Load())
	}
	if !m.Alive() {
		t.Fatal("lead returned while not alive")
	}
	done()

	mark = m.hold()
	answered = time.Now()
	lock.noteProof(time.Now(), lock.claims.Add(1)) // lost and claimed again: a new claim
	if done, err := m.lead(ctx, mark, answered); !errors.Is(err, errNoLockProof) {
		t.Fatalf("lead with a proof of a later claim: %v; want %v", err, errNoLockProof)
	} else if done != nil {
		t.Fatal("lead refused but returned a done function")
	}

	mark = m.hold()
	began := time.Now()
	if _, err := m.lead(ctx, mark, began); !errors.Is(err, errNoLockProof) {
		t.Fatalf("lead without a new proof: %v; want %v", err, errNoLockProof)
	}
	if took := time.Since(began); took < DefaultLockGrace || took > 10*DefaultLockGrace {
		t.Fatalf("lead without a proof gave up after %s; want after the lock grace (%s)", took, DefaultLockGrace)
	}
	if n := lock.leading.Load(); n != 0 {
		t.Fatalf("leading = %d after refused leaderships, want 0", n)
	}
}

// TestAliveLockVerifiesOftenWhileLeading: on a real server, a leadership beginning wakes
// the lock's session for a verification at once, although its interval is a minute, and
// then it verifies every LeaderVerifyInterval until the leadership ends.
func TestAliveLockVerifiesOftenWhileLeading(t *testing.T) {
	db := testdb.Migrated(t)
	lock := startAliveLock(t, aliveLockConfig{DSN: db.DSN, InstanceID: uuid.New(), ServiceName: "svc",
		VerifyInterval: time.Minute, LeaderVerifyInterval: 50 * time.Millisecond})
	testutil.Eventually(t, 10*time.Second, "the alive lock is held", lock.Held)
	first, proved := lock.lastProof()
	if first.sent.IsZero() || first.claim != 1 {
		t.Fatalf("the claim recorded no proof: %+v", first)
	}
	testutil.Eventually(t, 5*time.Second, "the session waits for its next verification", func() bool {
		lock.wakeMu.Lock()
		defer lock.wakeMu.Unlock()
		return lock.wakeWait != nil
	})
	done := lock.lead()
	select {
	case <-proved:
	case <-time.After(5 * time.Second):
		t.Fatal("no verification within 5 s of a leadership beginning; the interval is a minute")
	}
	if n := proofsWithin(lock, time.Second); n < 5 {
		t.Fatalf("%d proofs in 1 s while leading; want about 20 (every 50 ms)", n)
	}
	if s := lock.Stats(); s.Claims != 1 || !s.Held {
		t.Fatalf("Stats = %+v; want the one claim, held", s)
	}
	done()
	// At most the verification already waited for lands; then the wait is a minute again.
	if n := proofsWithin(lock, 1200*time.Millisecond); n > 2 {
		t.Fatalf("%d proofs in 1.2 s after the leadership ended; want at most 2 (the interval is a minute)", n)
	}
}

// proofsWithin counts the lock's proofs during d.
func proofsWithin(lock *aliveLock, d time.Duration) int {
	end := time.After(d)
	n := 0
	for {
		_, proved := lock.lastProof()
		select {
		case <-proved:
			n++
		case <-end:
			return n
		}
	}
}
