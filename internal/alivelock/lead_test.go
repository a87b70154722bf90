package alivelock

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// TestAliveLockVerifiesOftenWhileLeading: on a real server, a leadership beginning wakes
// the lock's session for a verification at once, although its interval is a minute, and
// then it verifies every LeaderVerifyInterval until the leadership ends.
func TestAliveLockVerifiesOftenWhileLeading(t *testing.T) {
	t.Parallel()
	db := testdb.Migrated(t)
	lock := startAliveLock(t, DirectConfig{DSN: db.DSN, InstanceID: uuid.New(), ServiceName: "svc",
		VerifyInterval: time.Minute, LeaderVerifyInterval: 50 * time.Millisecond})
	testutil.Eventually(t, 10*time.Second, "the alive lock is held", lock.Held)
	first, proved := lock.LastProof()
	if first.Sent.IsZero() || first.Claim != 1 {
		t.Fatalf("the claim recorded no proof: %+v", first)
	}
	testutil.Eventually(t, 5*time.Second, "the session waits for its next verification", func() bool {
		lock.wakeMu.Lock()
		defer lock.wakeMu.Unlock()
		return lock.wakeWait != nil
	})
	done := lock.Lead()
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
func proofsWithin(lock *Direct, d time.Duration) int {
	end := time.After(d)
	n := 0
	for {
		_, proved := lock.LastProof()
		select {
		case <-proved:
			n++
		case <-end:
			return n
		}
	}
}

// TestLeadAsksTheSessionForAProofNow: a leadership beginning asks the lock's session for
// a proof now (here no wait runs, so the next one does not begin) and counts until its
// done, idempotent, is called. (The library's life monitor leads through it:
// TestLifeGateLeadWaitsForAProofOfTheSameClaim there.)
func TestLeadAsksTheSessionForAProofNow(t *testing.T) {
	lock, err := NewDirect(DirectConfig{DSN: "host=127.0.0.1 dbname=unused", InstanceID: uuid.New(), ServiceName: "svc"})
	if err != nil {
		t.Fatal(err)
	}
	done := lock.Lead()
	lock.wakeMu.Lock()
	woken := lock.woken
	lock.wakeMu.Unlock()
	if !woken || lock.leading.Load() != 1 {
		t.Fatalf("lead did not ask the session for a proof now (woken %v) or count the leadership (%d)", woken, lock.leading.Load())
	}
	done()
	done()
	if n := lock.leading.Load(); n != 0 {
		t.Fatalf("leading = %d after the leadership ended (done called twice), want 0", n)
	}
}
