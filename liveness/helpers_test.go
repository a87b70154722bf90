package liveness_test

// The helpers that more than one file of the tests in package liveness_test uses.

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

func agentConfig(db *pgtest.DB, pool *pgxpool.Pool) liveness.AgentConfig {
	return liveness.AgentConfig{
		Pool: pool, DirectDSN: db.DSN, Schema: defaults.Schema,
		InstanceID: uuid.New(), ServiceName: "agent-test", Mode: liveness.ModeAdvisoryLockWhenAvailable,
		Timing: liveness.Timing{HeartbeatInterval: 200 * time.Millisecond, HeartbeatSlowInterval: 400 * time.Millisecond,
			StaleThreshold: time.Second, DefinitiveDeadCutoff: 3 * time.Second},
		Reaper: true, ReaperInterval: 200 * time.Millisecond, ReaperLeaseTTL: 2 * time.Second,
	}
}

// newAgent is liveness.NewAgent for a configuration the test says is valid.
func newAgent(t testing.TB, cfg liveness.AgentConfig) *liveness.Agent {
	t.Helper()
	a, err := liveness.NewAgent(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// runAgent runs the agent until stop; done yields Run's error once it has returned.
func runAgent(t testing.TB, a *liveness.Agent) (stop context.CancelFunc, done <-chan error) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	out := make(chan error, 1)
	finished := make(chan struct{})
	go func() { defer close(finished); out <- a.Run(ctx) }()
	t.Cleanup(func() { stop(); <-finished })
	testutil.Eventually(t, 10*time.Second, "the agent beats (and holds its lock if it has one)", func() bool {
		s := a.Snapshot()
		return s.Heartbeat.Beats > 0 && (s.Mode == liveness.ModeHeartbeatTableOnly || s.AliveLock.Held)
	})
	return stop, out
}

func newTestLeases(t *testing.T, pool *pgxpool.Pool) *liveness.Leases {
	t.Helper()
	l, err := liveness.NewLeases(liveness.LeasesConfig{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// mustAcquire takes a lease that must be free and releases it when the test ends.
// fencedTx begins a transaction on pool that le fences; it is rolled back when the test
// ends, unless committed before.
func fencedTx(t *testing.T, ctx context.Context, pool *pgxpool.Pool, le *liveness.Lease) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if err := le.Fence(ctx, tx); err != nil {
		t.Fatalf("Fence: %v", err)
	}
	return tx
}

func mustAcquire(t *testing.T, ctx context.Context, l *liveness.Leases, name string, ttl time.Duration) *liveness.Lease {
	t.Helper()
	le, err := l.TryAcquire(ctx, name, ttl)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", name, err)
	}
	releaseAtEnd(t, le)
	return le
}

// releaseAtEnd releases le when the test ends.
func releaseAtEnd(t *testing.T, le *liveness.Lease) {
	t.Cleanup(func() {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = le.Release(rctx)
	})
}
