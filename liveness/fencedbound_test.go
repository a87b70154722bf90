package liveness_test

// How long a fenced transaction may run or idle, and what a COMMIT that came too late
// commits: nothing.

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// A fenced COMMIT on a session the server ended for idling in the transaction past its
// limit (SQLSTATE 25P03) commits nothing: it is a *FencedError, whether the COMMIT
// itself read the server's FATAL or a statement before it did and the connection was
// closed. The transaction sets a shorter limit of its own after the fence, as the fence's
// doc allows.
func TestFencedCommitAfterTheIdleLimitIsRefused(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	ctx := testutil.Context(t, 30*time.Second)
	le := mustAcquire(t, ctx, newTestLeases(t, pool), "idle", 10*time.Second)
	db.Exec(t, `CREATE TABLE idle_writes (n int)`)
	for _, statementFirst := range []bool{false, true} {
		tx, err := le.BeginTx(ctx, pool, pgx.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SET LOCAL idle_in_transaction_session_timeout = '200ms'`); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO idle_writes VALUES (1)`); err != nil {
			t.Fatal(err)
		}
		pid := tx.Conn().PgConn().PID()
		testutil.Eventually(t, 10*time.Second, "the server ending the idle session", func() bool {
			return db.QueryInt(t, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int64(pid)) == 0
		})
		if statementFirst {
			if _, err := tx.Exec(ctx, `SELECT 1`); err == nil {
				t.Fatal("a statement on the ended session succeeded")
			}
		}
		err = tx.Commit(ctx)
		var fenced *liveness.FencedError
		if !errors.As(err, &fenced) || !fenced.AtCommit || !fenced.Held {
			t.Errorf("COMMIT after the idle limit (a statement first: %v): %v; want a *FencedError at commit, "+
				"the lease still held", statementFirst, err)
		}
	}
	if n := db.QueryInt(t, `SELECT count(*) FROM idle_writes`); n != 0 {
		t.Errorf("%d rows committed; want none", n)
	}
}
