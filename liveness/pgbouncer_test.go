package liveness

import (
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/alivelock"
	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// aliveLockStartupParameters are the parameters the lock's connection sends that
// PgBouncer does not know.
var aliveLockStartupParameters = []string{"tcp_keepalives_idle", "tcp_keepalives_interval",
	"tcp_keepalives_count", "tcp_user_timeout", "idle_session_timeout"}

// TestAliveLockBehindPgBouncer points the direct DSN at a real PgBouncer in transaction
// pooling mode. The lock must be reported not held, with one clear log line, no lock may
// be left on a pooled server connection, and the heartbeat stays fast.
func TestAliveLockBehindPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := testutil.Context(t, 90*time.Second)

	t.Run("transaction pooling", func(t *testing.T) {
		db, direct := testdb.MigratedPool(t, 4)
		bouncer := pgtest.NewPgBouncer(t, db.DSN, pgtest.WithIgnoreStartupParameters(aliveLockStartupParameters...))
		id := uuid.New()
		logs := &logbuf.Recorder{}
		lock := startAliveLock(t, alivelock.DirectConfig{DSN: bouncer.DSN(db.Name), InstanceID: id, ServiceName: "svc",
			VerifyInterval: 20 * time.Millisecond, Logger: slog.New(logs)})

		// The service's pool goes through PgBouncer too, as it would behind one; pgx must
		// not use named prepared statements there.
		poolCfg := bouncer.DSN(db.Name) + " default_query_exec_mode=exec"
		pool := pgtest.Pool(t, poolCfg, 2)
		cfg := testHeartbeatConfig(pool, lock)
		cfg.InstanceID = id
		h, _ := startHeartbeat(t, cfg)

		logs.ToldOnce(t, "PgBouncer in transaction pooling mode", slog.LevelError, 5, 5*time.Second)
		if s := lock.Stats(); s.Held || s.Claims != 0 {
			t.Fatalf("alive lock Stats = %+v through PgBouncer, want not held and no claim", s)
		}
		if pid := testdb.AliveLockHolder(t, ctx, direct, id); pid != 0 {
			t.Fatalf("backend %d holds the alive lock: a claim leaked onto a pooled server connection", pid)
		}
		testutil.Eventually(t, 5*time.Second, "a beat through PgBouncer", func() bool { return h.Stats().Beats >= 1 })
		if s := h.Stats(); s.Interval != defaults.HeartbeatInterval {
			t.Fatalf("heartbeat interval %s, want the fast %s", s.Interval, defaults.HeartbeatInterval)
		}
		var n int
		if err := direct.QueryRow(ctx, `SELECT count(*) FROM liveness.instances WHERE instance_id = $1`, id).Scan(&n); err != nil || n != 1 {
			t.Fatalf("%d instance rows (%v), want 1", n, err)
		}
	})

	// A stock PgBouncer refuses the keepalive startup parameters: the lock cannot
	// connect, says why once, and the heartbeat goes on at the fast cadence.
	t.Run("startup parameters refused", func(t *testing.T) {
		db, pool := testdb.MigratedPool(t, 4)
		bouncer := pgtest.NewPgBouncer(t, db.DSN)
		logs := &logbuf.Recorder{}
		lock := startAliveLock(t, alivelock.DirectConfig{DSN: bouncer.DSN(db.Name), InstanceID: uuid.New(), ServiceName: "svc",
			Logger: slog.New(logs)})
		cfg := testHeartbeatConfig(pool, lock)
		h, _ := startHeartbeat(t, cfg)

		logs.ToldOnce(t, "points at PgBouncer", slog.LevelError, 2, 10*time.Second)
		if lock.Held() {
			t.Fatal("the alive lock is held without a connection")
		}
		testutil.Eventually(t, 5*time.Second, "the first beat", func() bool { return h.Stats().Beats >= 1 })
		if s := h.Stats(); s.Interval != defaults.HeartbeatInterval {
			t.Fatalf("heartbeat interval %s, want the fast %s", s.Interval, defaults.HeartbeatInterval)
		}
	})
}

// TestWatcherNotifiesDeadThroughPgBouncer: a service whose pool goes through PgBouncer in
// transaction mode (default_query_exec_mode=exec: parameters in text, their types not
// asked) still gets its watcher's dead:<id>. Its ids were sent as a []uuid.UUID, which
// pgx cannot encode as text for a parameter of unknown type: every notification failed.
func TestWatcherNotifiesDeadThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := testutil.Context(t, 60*time.Second)
	db, direct := testdb.MigratedPool(t, 4)
	bouncer := pgtest.NewPgBouncer(t, db.DSN)
	pool := pgtest.Pool(t, bouncer.DSN(db.Name)+" default_query_exec_mode=exec", 2)
	id := uuid.New()
	// A holder whose lock vanished five seconds ago: dead by the verdict.
	for _, sql := range []string{
		`INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock) VALUES ($1, 'svc', true)`,
		`INSERT INTO liveness.alive_lock_absences (instance_id, missing_since, server_started_at)
		 VALUES ($1, now() - interval '5 seconds', pg_postmaster_start_time())`,
	} {
		if _, err := direct.Exec(ctx, sql, id); err != nil {
			t.Fatal(err)
		}
	}
	w := newWatcher(watcherConfig{Pool: pool, Schema: defaults.Schema})
	st := &watchState{due: map[uuid.UUID]time.Time{id: time.Now()}}
	if err := w.notify(ctx, st, []uuid.UUID{id}, time.Now()); err != nil {
		t.Fatalf("notify through PgBouncer: %v", err)
	}
	if _, due := st.due[id]; due || w.notified.Load() != 1 {
		t.Fatalf("the dead instance was not notified (still due %v, notified %d)", due, w.notified.Load())
	}
}
