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
			holds, nil, nil, nil, nil, nil, pid); err != nil {
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
