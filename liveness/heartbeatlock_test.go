package liveness

import (
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/alivelock"
	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// TestAliveLockTerminatedBackend ends the lock's session from the server. The verify
// interval is a minute, so only the read on the idle connection can notice in time:
// Held turns false, the heartbeat beats at once instead of after its slow 60s, and the
// lock is claimed again on a new connection.
func TestAliveLockTerminatedBackend(t *testing.T) {
	t.Parallel()
	ctx := testutil.Context(t, 90*time.Second)
	db, pool := testdb.MigratedPool(t, 4)
	id := uuid.New()
	lock := startAliveLock(t, alivelock.DirectConfig{DSN: db.DSN, InstanceID: id, ServiceName: "svc", VerifyInterval: time.Minute})
	testutil.Eventually(t, 5*time.Second, "the alive lock is held", lock.Held)

	cfg := testHeartbeatConfig(pool, lock)
	cfg.InstanceID = id
	h, _ := startHeartbeat(t, cfg)
	testutil.Eventually(t, 5*time.Second, "the first beat, at the slow cadence", func() bool {
		s := h.Stats()
		return s.Beats == 1 && s.Interval == defaults.HeartbeatSlowInterval
	})
	lastBeat := h.Stats().LastBeat

	oldPID := testdb.AliveLockHolder(t, ctx, pool, id)
	if oldPID == 0 {
		t.Fatal("no backend holds the alive lock")
	}
	changed := lock.Changed()
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, oldPID).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend = %v, %v", ok, err)
	}
	select {
	case <-changed:
	case <-time.After(3 * time.Second):
		t.Fatal("the alive lock did not notice its terminated backend within 3s")
	}
	if s := lock.Stats(); s.Losses != 1 {
		t.Fatalf("Stats = %+v, want 1 loss", s)
	}
	testutil.Eventually(t, 3*time.Second, "a beat right after the loss", func() bool { return h.Stats().Beats == 2 })
	var rowBeat time.Time
	if err := pool.QueryRow(ctx, `SELECT last_heartbeat_at FROM liveness.instances WHERE instance_id = $1`, id).Scan(&rowBeat); err != nil {
		t.Fatal(err)
	}
	if !rowBeat.After(lastBeat) {
		t.Fatalf("last_heartbeat_at %s did not move past %s", rowBeat, lastBeat)
	}

	testutil.Eventually(t, 5*time.Second, "the lock claimed again after reconnecting", lock.Held)
	if s := lock.Stats(); s.Claims != 2 || s.Reconnects != 1 || s.Losses != 1 || !s.Held {
		t.Fatalf("Stats = %+v, want 2 claims, 1 reconnect, 1 loss, held", s)
	}
	if pid := testdb.AliveLockHolder(t, ctx, pool, id); pid == 0 || pid == oldPID {
		t.Fatalf("lock holder pid = %d, want a new backend (the old one was %d)", pid, oldPID)
	}
}

// TestAliveLockDuplicateInstance starts a second lock with the same instance id: its
// claim is false, logged once, its heartbeat stays fast, and it takes the lock over once
// the first one is gone.
func TestAliveLockDuplicateInstance(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	id := uuid.New()
	first, stopFirst := startAliveLockStoppable(t, alivelock.DirectConfig{DSN: db.DSN, InstanceID: id, ServiceName: "svc"})
	testutil.Eventually(t, 5*time.Second, "the first lock is held", first.Held)

	logs := &logbuf.Recorder{}
	second := startAliveLock(t, alivelock.DirectConfig{DSN: db.DSN, InstanceID: id, ServiceName: "svc",
		VerifyInterval: 20 * time.Millisecond, Logger: slog.New(logs)})
	cfg := testHeartbeatConfig(pool, second)
	cfg.InstanceID = id
	h, _ := startHeartbeat(t, cfg)

	logs.ToldOnce(t, "held by another session", slog.LevelWarn, 5, 5*time.Second)
	if second.Held() || second.Stats().Claims != 0 || !first.Held() {
		t.Fatalf("first held %v, second %+v: want only the first to hold", first.Held(), second.Stats())
	}
	// A duplicate must not write the row that belongs to the lock's holder.
	testutil.Eventually(t, 5*time.Second, "the duplicate's heartbeat reports it", func() bool { return h.Stats().Duplicate })
	if s := h.Stats(); s.Beats != 0 || !second.Duplicate() {
		t.Fatalf("the duplicate's heartbeat %+v, lock Duplicate %v: want no beat while another session holds the lock",
			s, second.Duplicate())
	}

	stopFirst()
	if s := first.Stats(); s.Held || s.Losses != 0 || s.Claims != 1 {
		t.Fatalf("first Stats after a clean stop = %+v, want not held, 1 claim and no loss", s)
	}
	testutil.Eventually(t, 5*time.Second, "the second lock takes over once the first is gone", second.Held)
	if s := second.Stats(); s.Claims != 1 || s.Duplicate {
		t.Fatalf("second Stats = %+v, want 1 claim and no longer a duplicate", s)
	}
	testutil.Eventually(t, 5*time.Second, "the second instance beats once its lock is held", func() bool { return h.Stats().Beats >= 1 })
}
