package liveness

// The helpers of the tests in package liveness that run the heartbeat, over an alive lock
// of their own.

import (
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/alivelock"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// testHeartbeatConfig has the agent's default timing.
func testHeartbeatConfig(pool *pgxpool.Pool, lock lockSource) heartbeatConfig {
	return heartbeatConfig{
		Pool:        pool,
		InstanceID:  uuid.New(),
		ServiceName: "svc",
		Timing:      Timing{}, // the defaults
		Lock:        lock,
	}
}

func startHeartbeat(t *testing.T, cfg heartbeatConfig) (*heartbeatWorker, func()) {
	t.Helper()
	h, err := newHeartbeatWorker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h, testutil.RunUntilCleanup(t, h.Run)
}

func startAliveLock(t *testing.T, cfg alivelock.DirectConfig) *alivelock.Direct {
	t.Helper()
	lock, _ := startAliveLockStoppable(t, cfg)
	return lock
}

func startAliveLockStoppable(t *testing.T, cfg alivelock.DirectConfig) (*alivelock.Direct, func()) {
	t.Helper()
	lock, err := alivelock.NewDirect(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return lock, testutil.RunUntilCleanup(t, lock.Run)
}
