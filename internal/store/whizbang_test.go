package store_test

import (
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/whizbangtest"
)

type verdict struct {
	State     string
	Alive     bool
	LockHeld  *bool
	KeyShared bool
}

// Verdicts reads every instance's verdict as the observer.
func verdicts(f *whizbangtest.Fixture, t *testing.T) map[uuid.UUID]verdict {
	t.Helper()
	q := store.VerdictsQuery(f.Reads(t))
	rows, err := f.Observer.Query(testutil.Context(t, 30*time.Second), q.SQL, q.Args()...)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uuid.UUID]verdict{}
	for rows.Next() {
		var id uuid.UUID
		var v verdict
		if err := rows.Scan(&id, &v.State, &v.Alive, &v.LockHeld, &v.KeyShared); err != nil {
			t.Fatal(err)
		}
		out[id] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// One instance walks through every state Whizbang's rows can be in, and the verdict
// follows at each step, read by a role that can only SELECT.
func TestVerdictWalksThroughTheStates(t *testing.T) {
	f := whizbangtest.NewFixture(t, pgtest.NewDB(t))
	src := f.Source
	id := uuid.New()
	steps := []struct {
		name  string
		do    func()
		state string
		alive bool
		held  bool
	}{
		{"registered, lock held, fresh heartbeat", func() {
			f.Register(t, id, "orders", 0)
			if !f.Claim(t, id) {
				t.Fatal("claim failed")
			}
		}, "alive", true, true},
		{"lock held, heartbeat at the slow cadence", func() { f.Beat(t, id, src.Timing.HeartbeatSlowInterval+time.Second) }, "alive", true, true},
		{"lock held, heartbeat stale", func() { f.Beat(t, id, src.Timing.StaleThreshold+time.Second) }, "lock_only", true, true},
		{"lock held, heartbeat past the definitive-dead cutoff (hung)", func() { f.Beat(t, id, src.Timing.DefinitiveDeadCutoff+time.Second) }, "zombie", false, true},
		{"crashed: lock gone, heartbeat old", func() { f.Crash(t, id) }, "stale", false, false},
		{"heartbeat-only mode, fresh", func() { f.Beat(t, id, time.Second) }, "heartbeat_only", true, false},
		{"heartbeat-only mode, stale", func() { f.Beat(t, id, src.Timing.StaleThreshold+time.Second) }, "stale", false, false},
		{"back: lock and heartbeat", func() {
			f.Beat(t, id, 0)
			if !f.Claim(t, id) {
				t.Fatal("claim failed")
			}
		}, "alive", true, true},
	}
	for _, s := range steps {
		s.do()
		v, ok := verdicts(f, t)[id]
		if !ok {
			t.Fatalf("%s: no verdict for the instance", s.name)
		}
		if v.State != s.state || v.Alive != s.alive || v.LockHeld == nil || *v.LockHeld != s.held || v.KeyShared {
			t.Fatalf("%s: got state %s, alive %v, lock held %v, key shared %v; want %s, %v, %v, false",
				s.name, v.State, v.Alive, deref(v.LockHeld), v.KeyShared, s.state, s.alive, s.held)
		}
	}
}

// Locks that are not Whizbang's alive lock of an instance do not count: the two-int4
// lock on the key's halves, a shared lock on the key, and the key in another database.
func TestOnlyTheExactLockCounts(t *testing.T) {
	f := whizbangtest.NewFixture(t, pgtest.NewDB(t))
	id := uuid.New()
	f.Register(t, id, "orders", 0)
	c := f.DB.Conn(t)
	var key int64
	if err := c.QueryRow(testutil.Context(t, 30*time.Second), `SELECT hashtext($1 || $2::text)::bigint`, f.Source.LockKeyPrefix, id).Scan(&key); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(testutil.Context(t, 30*time.Second), `SELECT pg_advisory_lock($1::int4, $2::int4), pg_advisory_lock_shared($3)`,
		int32(key>>32), int32(key), key); err != nil {
		t.Fatal(err)
	}
	other := pgtest.NewDBOn(t, f.DB.Server)
	if _, err := other.Conn(t).Exec(testutil.Context(t, 30*time.Second), `SELECT pg_advisory_lock($1)`, key); err != nil {
		t.Fatal(err)
	}
	if v := verdicts(f, t)[id]; v.State != "heartbeat_only" || deref(v.LockHeld) {
		t.Fatalf("with only look-alike locks: got %s, lock held %v; want heartbeat_only, not held", v.State, deref(v.LockHeld))
	}
}

// Two instance ids with the same 32-bit key: the lock cannot say which of them holds it,
// so both are judged by their heartbeats and reported as sharing a key.
//   - both alive: the first holds the lock, the second's claim fails (Whizbang carries
//     on with its heartbeat); both are heartbeat_only, alive.
//   - the holder hangs (its session keeps the lock) while its twin beats: the hung one
//     goes stale by its heartbeat instead of hiding behind the lock as lock_only, then
//     zombie, until the cutoff.
func TestCollidingKeys(t *testing.T) {
	f := whizbangtest.NewFixture(t, pgtest.NewDB(t))
	a, b := f.CollidingIDs(t)
	f.Register(t, a, "orders", 0)
	f.Register(t, b, "orders", 0)
	if !f.Claim(t, a) {
		t.Fatal("claim failed")
	}
	if f.Claim(t, b) {
		t.Fatal("test setup: the twin got the lock its key shares")
	}
	vs := verdicts(f, t)
	for _, id := range []uuid.UUID{a, b} {
		if v := vs[id]; v.State != "heartbeat_only" || !v.Alive || !v.KeyShared || !deref(v.LockHeld) {
			t.Fatalf("both alive, %s: got %+v; want heartbeat_only, alive, key shared, lock held", id, v)
		}
	}
	f.Beat(t, a, f.Source.Timing.StaleThreshold+time.Second)
	vs = verdicts(f, t)
	if v := vs[a]; v.State != "stale" || v.Alive {
		t.Fatalf("hung holder sharing its key: got %+v; want stale, dead", v)
	}
	if v := vs[b]; v.State != "heartbeat_only" || !v.Alive {
		t.Fatalf("its live twin: got %+v; want heartbeat_only, alive", v)
	}
	// A third instance with a key of its own is judged by its lock as usual.
	c := uuid.New()
	f.Register(t, c, "orders", f.Source.Timing.StaleThreshold+time.Second)
	if !f.Claim(t, c) {
		t.Fatal("claim failed")
	}
	if v := verdicts(f, t)[c]; v.State != "lock_only" || v.KeyShared {
		t.Fatalf("an instance with a key of its own: got %+v; want lock_only, key not shared", v)
	}
}

func deref(b *bool) bool { return b != nil && *b }
