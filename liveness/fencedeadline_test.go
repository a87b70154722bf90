package liveness_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/netfault"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// heldBackWrites are two fenced inserts sent by a holder just as the network to the
// server froze, on connections taken before: one fenced as the library documents
// (lease_is_held and the fence deadline), one by lease_is_held alone. The test thaws the
// network after the holder was told it lost the lease; wait gives how many rows each
// added.
type heldBackWrites struct {
	wg               sync.WaitGroup
	guarded, control int64
	errs             [2]error
}

const (
	fencedLedger  = `CREATE TABLE ledger (id bigserial PRIMARY KEY, epoch bigint NOT NULL, guarded bool NOT NULL)`
	guardedInsert = `INSERT INTO ledger (epoch, guarded) SELECT $1, true
	                  WHERE liveness.lease_is_held('job', $1) AND clock_timestamp() < $2`
	controlInsert = `INSERT INTO ledger (epoch, guarded) SELECT $1, false
	                  WHERE liveness.lease_is_held('job', $1)`
)

// sendHeldBack takes two connections of writes (whose proxy is not frozen yet), then
// freezes every proxy in freeze and sends both inserts, with deadline from the holder.
func sendHeldBack(t *testing.T, ctx context.Context, writes *pgxpool.Pool, epoch int64, deadline func() time.Time,
	freeze ...*netfault.Proxy) *heldBackWrites {
	t.Helper()
	var conns [2]*pgxpool.Conn
	for i := range conns {
		c, err := writes.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	d := deadline() // as a job takes it for each write, just before sending
	for _, p := range freeze {
		p.Freeze()
	}
	h := &heldBackWrites{}
	h.wg.Go(func() {
		defer conns[0].Release()
		tag, err := conns[0].Exec(ctx, guardedInsert, epoch, d)
		h.guarded, h.errs[0] = tag.RowsAffected(), err
	})
	h.wg.Go(func() {
		defer conns[1].Release()
		tag, err := conns[1].Exec(ctx, controlInsert, epoch)
		h.control, h.errs[1] = tag.RowsAffected(), err
	})
	return h
}

// check waits for both inserts and fails unless the server ran them late, after the
// holder was told, and the deadline refused the guarded one: the control insert (no
// deadline) must have been accepted, or the test reproduced nothing.
func (h *heldBackWrites) check(t *testing.T) {
	t.Helper()
	h.wg.Wait()
	if err := errors.Join(h.errs[:]...); err != nil {
		t.Fatalf("held-back inserts: %v", err)
	}
	if h.control != 1 {
		t.Fatalf("the insert fenced by lease_is_held alone added %d rows after the thaw; want 1 (the lease still held by "+
			"the database, so this test did not reproduce a write landing after its writer was told)", h.control)
	}
	if h.guarded != 0 {
		t.Fatal("the insert fenced with FenceDeadline was accepted after its writer was told it lost the lease")
	}
}

// TestFenceDeadlineRefusesALeadersWriteHeldBackPastItsStepDown reproduces the soak's
// violation: a leader sends a fenced write just as a partition begins, steps down
// (Reason "not_alive": it can no longer prove its alive lock) and is told so; once the partition
// heals, TCP delivers the write, and the server, which still holds the leader's lock over
// the half-open session and so still counts the lease held, ran it. The fence deadline,
// on the server's clock, refuses it.
func TestFenceDeadlineRefusesALeadersWriteHeldBackPastItsStepDown(t *testing.T) {
	t.Parallel()
	db, direct := testdb.MigratedPool(t, 2)
	db.Exec(t, fencedLedger)
	agent, agentNet := startCuttableAgent(t, db, "fence-deadline")
	writesNet := netfault.NewProxy(t, db.DSN, 0)
	t.Cleanup(writesNet.Close)
	writes := pgtest.Pool(t, writesNet.DSN(), 2)

	ctx := testutil.Context(t, time.Minute)
	self, told := lead(t, ctx, agent, "job")
	// The fence lets the leader's writes through while it leads.
	if tag, err := writes.Exec(ctx, guardedInsert, self.Epoch, self.FenceDeadline()); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("the leader's fenced insert, before any fault: %v rows, %v", tag.RowsAffected(), err)
	}

	held := sendHeldBack(t, ctx, writes, self.Epoch, self.FenceDeadline, agentNet, writesNet)
	var reason error
	select {
	case reason = <-told:
	case <-time.After(20 * time.Second):
		t.Fatal("the leader did not step down within 20s of the partition")
	}
	var lost *liveness.LeaseLostError
	if !errors.As(reason, &lost) || lost.Reason != "not_alive" {
		t.Fatalf("the leader stopped because %v; want %s", reason, "not_alive")
	}
	if deadline := self.FenceDeadline(); !deadline.IsZero() {
		t.Fatalf("FenceDeadline after the step-down = %s; want the zero time", deadline)
	}
	writesNet.Thaw() // the writes' network heals; the agent's stays cut, so nothing races them
	held.check(t)
	// A write sent now, with the deadline of a lease that has ended, is refused as well.
	if tag, err := writes.Exec(ctx, guardedInsert, self.Epoch, self.FenceDeadline()); err != nil || tag.RowsAffected() != 0 {
		t.Fatalf("a fenced insert after the step-down: %d rows, %v; want refused", tag.RowsAffected(), err)
	}
	agentNet.Thaw()

	var rows int
	if err := direct.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE guarded`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("guarded rows in the ledger: %d, %v; want only the one written while leading", rows, err)
	}
}

// TestFenceDeadlineRefusesAWriteHeldBackPastTheTrustWindow: the same for Leases without an
// agent, whose bound is the trust window (ttl − margin from the last renewal sent): the
// write is held back until the window has closed, and reaches the server while the row is
// still unexpired.
func TestFenceDeadlineRefusesAWriteHeldBackPastTheTrustWindow(t *testing.T) {
	t.Parallel()
	db := testdb.Migrated(t)
	db.Exec(t, fencedLedger)
	leaseNet := netfault.NewProxy(t, db.DSN, 0)
	t.Cleanup(leaseNet.Close)
	writesNet := netfault.NewProxy(t, db.DSN, 0)
	t.Cleanup(writesNet.Close)
	pool := pgtest.Pool(t, leaseNet.DSN(), 2)
	writes := pgtest.Pool(t, writesNet.DSN(), 2)
	// The window closes 3.5 s after a renewal is sent; the row expires 2.5 s later.
	const ttl, margin = 6 * time.Second, 2500 * time.Millisecond
	l, err := liveness.NewLeases(liveness.LeasesConfig{Pool: pool, Margin: margin})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t, time.Minute)
	le := mustAcquire(t, ctx, l, "job", ttl)
	waitRenewed(t, le, 5*time.Second)
	// The window's end on the server's clock: the row's expiry less the margin and the
	// renewal's round trip.
	exp, d := le.ExpiresAt(), le.FenceDeadline()
	for !le.ExpiresAt().Equal(exp) { // a renewal came in between
		exp, d = le.ExpiresAt(), le.FenceDeadline()
	}
	if d.After(exp.Add(-margin)) || d.Before(exp.Add(-margin-time.Second)) {
		t.Fatalf("FenceDeadline %s with the row expiring at %s; want within a second before expiry - margin (%s)", d, exp, margin)
	}
	if tag, err := writes.Exec(ctx, guardedInsert, le.Epoch, le.FenceDeadline()); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("the holder's fenced insert, before any fault: %v rows, %v", tag.RowsAffected(), err)
	}

	held := sendHeldBack(t, ctx, writes, le.Epoch, le.FenceDeadline, leaseNet, writesNet)
	if reason := waitLost(t, le); reason != "expired" {
		t.Fatalf("lost reason %q, want %q", reason, "expired")
	}
	writesNet.Thaw()
	held.check(t)
	leaseNet.Thaw()
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
