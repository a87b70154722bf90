package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
)

// testErrors stand for the library's: distinct types, so that a test sees which one
// an error was made by.
var (
	errTestHeld     = errors.New("liveness: held (test)")
	errTestLost     = errors.New("liveness: lost (test)")
	errTestReleased = errors.New("liveness: released (test)")
)

type testLostError struct{ Loss }
type testRefusedError struct{ Refusal }

func (e *testLostError) Error() string    { return e.Loss.Error() }
func (e *testRefusedError) Error() string { return "liveness: refused (test)" }

func testLeases(t *testing.T) (*Leases, context.Context) {
	t.Helper()
	_, pool := testdb.MigratedPool(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return New(Config{Pool: pool, Logger: logging.Wrap(nil), Errors: Errors{
		Held: errTestHeld, Lost: errTestLost, Released: errTestReleased,
		LostLease: func(l Loss) error { return &testLostError{l} },
		Refused:   func(r Refusal) error { return &testRefusedError{r} },
	}}), ctx
}

// A release says how the leadership ended: a plain one released, one after a loss
// stepped down with its string.
func TestReleaseRecordsWhyTheLeadershipEnded(t *testing.T) {
	t.Parallel()
	leases, ctx := testLeases(t)
	for _, lost := range []string{"", ReasonError, ReasonNotAlive} {
		le, err := leases.Acquire(ctx, ctx, "job-"+lost, time.Minute)
		if err != nil || le == nil {
			t.Fatalf("Acquire: %v, %v", le, err)
		}
		if lost != "" {
			le.lose(lost, nil)
		}
		if err := le.Release(ctx); err != nil {
			t.Fatal(err)
		}
		var how, reason string
		if err := leases.pool.QueryRow(ctx, `SELECT how, coalesce(reason, '') FROM liveness.history WHERE kind = 'ended' AND epoch = $1`, le.Epoch).Scan(&how, &reason); err != nil {
			t.Fatal(err)
		}
		if want := map[bool]string{true: "released", false: "stepped_down"}[lost == ""]; how != want || reason != lost {
			t.Errorf("lost %q: the history says %s (%q); want %s (%q)", lost, how, reason, want, lost)
		}
	}
}

// Every error that reaches a user is one Errors made: a loss (the context's cause, Err,
// a fence's error), a release, a refused acquisition, a refused fenced write. None of
// this package's own types escapes, which the library's callers could not match.
func TestUsersSeeOnlyTheErrorsTheyWereGiven(t *testing.T) {
	t.Parallel()
	leases, ctx := testLeases(t)

	le, err := leases.Acquire(ctx, ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_, err = leases.Acquire(ctx, ctx, "job", time.Minute)
	var held *HeldError
	if !errors.Is(err, errTestHeld) || !errors.As(err, &held) {
		t.Errorf("a held lease's acquisition: %v; want a *HeldError that is errors.Is Errors.Held", err)
	}

	le.lose(ReasonTaken, nil)
	var lost *testLostError
	if cause := context.Cause(le.Context()); !errors.As(cause, &lost) || lost.Reason != ReasonTaken || lost.Name != "job" {
		t.Errorf("a lost lease's context ended with %#v; want what Errors.LostLease made of its loss", cause)
	}
	if err := le.Err(); !errors.As(err, &lost) {
		t.Errorf("a lost lease's Err() = %#v; want what Errors.LostLease made", err)
	}
	if l := le.Loss(); l == nil || l.Reason != ReasonTaken {
		t.Errorf("Loss() = %v; want the loss, taken", l)
	}
	tx, err := leases.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := le.Fence(ctx, tx); !errors.As(err, &lost) {
		t.Errorf("a lost lease's fence: %#v; want what Errors.LostLease made", err)
	}
	var refused *testRefusedError
	if _, err := le.Exec(ctx, leases.pool, `SELECT 1`); !errors.As(err, &refused) || refused.Held {
		t.Errorf("a write under a lost lease: %#v; want what Errors.Refused made, not held", err)
	}
	_ = le.Release(ctx)

	released, err := leases.Acquire(ctx, ctx, "job-2", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := released.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if cause := context.Cause(released.Context()); cause != errTestReleased {
		t.Errorf("a released lease's context ended with %v; want Errors.Released", cause)
	}
	if l := released.Loss(); l != nil {
		t.Errorf("a released lease's Loss() = %v; want nil", l)
	}
	if err := released.Fence(ctx, tx); !errors.Is(err, errTestLost) {
		t.Errorf("a released lease's fence: %v; want an error errors.Is Errors.Lost", err)
	}
}
