package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// TestBeatNeverOverwritesAClaimant: the claim records the backend that holds the alive
// lock on the instance's row (lock_pid), and only that backend's lock counts. A beat
// reads the lock's state before it is sent: one sent before the lock was lost and
// claimed again from a new session can land after that claim, and must not put the old
// backend back (the new session's lock would count as a stranger's, and the instance as
// dead one lock grace later while it holds its lock). A beat records the claimant only on
// a row that records none yet.
func TestBeatNeverOverwritesAClaimant(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	ctx := testutil.Context(t, 60*time.Second)
	id := uuid.New()
	beat := func(holds bool, pid int64) {
		t.Helper()
		if _, err := pool.Exec(ctx, store.Heartbeat.In("").SQL, id, "svc", "host", 1, "advisory-lock-when-available", "{}",
			holds, nil, nil, nil, nil, nil, pid, nil); err != nil {
			t.Fatal(err)
		}
	}
	isTrue := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}, sql string) bool {
		t.Helper()
		var b bool
		if err := q.QueryRow(ctx, sql, id).Scan(&b); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return b
	}
	claimant := func() int64 {
		t.Helper()
		return int64(db.QueryInt(t, `SELECT coalesce(lock_pid, -1) FROM liveness.instances WHERE instance_id = $1`, id))
	}
	beat(true, 1111) // the claim ran before the row existed: the first beat records it
	if got := claimant(); got != 1111 {
		t.Fatalf("the first beat recorded claimant %d; want 1111", got)
	}
	// The lock is claimed again from a new session; a beat read before the loss lands.
	claim := db.Conn(t)
	if !isTrue(claim, `SELECT liveness.claim_instance_alive_lock($1)`) {
		t.Fatal("the claim failed")
	}
	var pid int64
	if err := claim.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	beat(true, 1111)
	if got := claimant(); got != pid {
		t.Fatalf("a late beat put claimant %d back over the claim's %d", got, pid)
	}
	if !isTrue(pool, `SELECT alive FROM liveness.instance_state_verdicts(p_instance_id => $1)`) {
		t.Fatal("the instance holding its lock is dead after a late beat")
	}
	beat(false, 0) // a beat that says the lock is not held leaves the claimant
	if got := claimant(); got != pid {
		t.Fatalf("a beat without the lock changed the claimant to %d; want %d", got, pid)
	}
}

// TestBeatPastItsDeadlineWritesNothing: a beat carries its deadline by the server's clock,
// and one that reaches the row after it writes nothing, so that a beat its process gave up
// on (a slow link, a pooled connection a network cut left behind) cannot land after the
// next one and put back what that one corrected (a lock the process no longer holds).
// The deadline is checked once the row is locked: a beat that waited for the row past its
// deadline writes nothing either. Each answer carries the server's clock.
func TestBeatPastItsDeadlineWritesNothing(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	ctx := testutil.Context(t, 60*time.Second)
	id := uuid.New()
	type answer struct {
		landed   *time.Time
		inserted bool
		server   time.Time
	}
	beat := func(holds bool, deadline any) (a answer) {
		t.Helper()
		if err := pool.QueryRow(ctx, store.Heartbeat.In("").SQL, id, "svc", "host", 1, "advisory-lock-when-available", "{}",
			holds, nil, nil, nil, nil, nil, 0, deadline).Scan(&a.landed, &a.inserted, &a.server); err != nil {
			t.Fatal(err)
		}
		return a
	}
	claims := func() int {
		return db.QueryInt(t, `SELECT count(*) FROM liveness.instances WHERE instance_id = $1 AND holds_alive_lock`, id)
	}
	var serverNow time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&serverNow); err != nil {
		t.Fatal(err)
	}

	if a := beat(true, serverNow.Add(-time.Second)); a.landed != nil || a.inserted || a.server.IsZero() {
		t.Fatalf("a first beat past its deadline answered %+v; want nothing landed, nothing inserted, the server's clock", a)
	}
	if n := db.QueryInt(t, `SELECT count(*) FROM liveness.instances WHERE instance_id = $1`, id); n != 0 {
		t.Fatal("a beat past its deadline inserted the row")
	}
	if a := beat(true, nil); a.landed == nil || !a.inserted {
		t.Fatalf("a beat without a deadline answered %+v; want it inserted", a)
	}
	if a := beat(false, serverNow.Add(time.Hour)); a.landed == nil || a.inserted || claims() != 0 {
		t.Fatalf("a beat within its deadline answered %+v (rows claiming the lock: %d); want it landed", a, claims())
	}
	if a := beat(true, serverNow.Add(-time.Second)); a.landed != nil || claims() != 0 {
		t.Fatalf("a beat past its deadline answered %+v and left %d rows claiming the lock; want it to write nothing", a, claims())
	}

	// A beat that waits for the row, locked by another transaction, past its deadline.
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, `SELECT 1 FROM liveness.instances WHERE instance_id = $1 FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&serverNow); err != nil {
		t.Fatal(err)
	}
	done := make(chan answer, 1)
	go func() {
		var a answer
		err := pool.QueryRow(ctx, store.Heartbeat.In("").SQL, id, "svc", "host", 1, "advisory-lock-when-available", "{}",
			true, nil, nil, nil, nil, nil, 0, serverNow.Add(300*time.Millisecond)).Scan(&a.landed, &a.inserted, &a.server)
		if err != nil {
			t.Error(err)
		}
		done <- a
	}()
	testutil.Eventually(t, 10*time.Second, "the beat waiting for the row", func() bool {
		return db.QueryInt(t, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%INSERT INTO%instances%'`) == 1
	})
	for db.QueryInt(t, `SELECT (clock_timestamp() <= $1)::int`, serverNow.Add(300*time.Millisecond)) == 1 {
		time.Sleep(20 * time.Millisecond)
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if a := <-done; a.landed != nil || claims() != 0 {
		t.Fatalf("a beat that got the row past its deadline answered %+v and left %d rows claiming the lock; want nothing written", a, claims())
	}
}
