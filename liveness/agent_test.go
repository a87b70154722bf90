package liveness_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

func agentDB(t *testing.T, maxConns int32) (*pgtest.DB, *pgxpool.Pool) {
	t.Helper()
	db := pgtest.NewDB(t)
	pool := db.Pool(t, maxConns)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := migrations.Apply(ctx, pool, liveness.DefaultSchema); err != nil {
		t.Fatal(err)
	}
	return db, pool
}

func agentConfig(db *pgtest.DB, pool *pgxpool.Pool) liveness.AgentConfig {
	return liveness.AgentConfig{
		Pool: pool, DirectDSN: db.DSN, Schema: liveness.DefaultSchema,
		InstanceID: uuid.New(), ServiceName: "agent-test", Mode: liveness.ModeAdvisoryLockWhenAvailable,
		HeartbeatInterval: 200 * time.Millisecond, HeartbeatSlowInterval: 400 * time.Millisecond,
		StaleThreshold: time.Second, DefinitiveDeadCutoff: 3 * time.Second,
		Reaper: true, ReaperInterval: 200 * time.Millisecond, ReaperLeaseTTL: 2 * time.Second,
	}
}

func isAlive(t *testing.T, pool *pgxpool.Pool, id uuid.UUID) (alive, row bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pool.QueryRow(ctx, `SELECT liveness.is_instance_alive($1, 3600),
		EXISTS (SELECT 1 FROM liveness.instances WHERE instance_id = $1)`, id).Scan(&alive, &row); err != nil {
		t.Fatal(err)
	}
	return alive, row
}

func TestAgentValidateNamesFields(t *testing.T) {
	db, pool := agentDB(t, 2)
	for _, tc := range []struct {
		mutate func(*liveness.AgentConfig)
		field  string
	}{
		{func(c *liveness.AgentConfig) { c.DefinitiveDeadCutoff = c.HeartbeatSlowInterval + c.StaleThreshold }, "AgentConfig.DefinitiveDeadCutoff"},
		{func(c *liveness.AgentConfig) { c.ReaperInterval = -time.Second }, "AgentConfig.ReaperInterval"},
		{func(c *liveness.AgentConfig) { c.ReaperLeaseTTL = 3 * time.Millisecond }, "AgentConfig.ReaperLeaseTTL"},
		{func(c *liveness.AgentConfig) { c.HeartbeatInterval = -time.Second }, "AgentConfig.HeartbeatInterval"},
		{func(c *liveness.AgentConfig) { c.LockGrace = -time.Second }, "AgentConfig.LockGrace"},
		{func(c *liveness.AgentConfig) { c.KeepaliveIdle = 1500 * time.Millisecond }, "AgentConfig.KeepaliveIdle"},
		{func(c *liveness.AgentConfig) { c.DirectDSN = "" }, "AgentConfig.DirectDSN"},
		{func(c *liveness.AgentConfig) { c.ServiceName = "" }, "AgentConfig.ServiceName"},
		{func(c *liveness.AgentConfig) { c.Pool = nil }, "AgentConfig.Pool"},
	} {
		cfg := agentConfig(db, pool)
		tc.mutate(&cfg)
		_, err := liveness.NewAgent(cfg)
		var ce *liveness.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field || strings.Contains(err.Error(), "--") {
			t.Errorf("want a *ConfigError for %s that names no flag, got %v", tc.field, err)
		}
	}
	if _, err := liveness.NewAgent(agentConfig(db, pool)); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	// Zero values take the documented defaults: only the identity and the connections
	// must be given.
	if _, err := liveness.NewAgent(liveness.AgentConfig{Pool: pool, DirectDSN: db.DSN, InstanceID: uuid.New(),
		ServiceName: "minimal", Reaper: true}); err != nil {
		t.Fatalf("a config with only the required fields is refused: %v", err)
	}
}

// The agent participates, reaps others, and on shutdown leaves nothing that makes it
// look alive.
func TestAgentParticipatesAndShutsDownCleanly(t *testing.T) {
	db, pool := agentDB(t, 2)
	cfg := agentConfig(db, pool)
	agent, err := liveness.NewAgent(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// A dead instance (no lock, old heartbeat) for the reaper.
	dead := uuid.New()
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, last_heartbeat_at)
		VALUES ($1, 'other', now() - interval '1 hour')`, dead)

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() { done <- agent.Run(ctx); close(finished) }()
	t.Cleanup(func() { stop(); <-finished })

	testutil.Eventually(t, 10*time.Second, "alive lock held and a beat written", func() bool {
		s := agent.Snapshot()
		return s.AliveLock.Held && s.Heartbeat.Beats > 0
	})
	testutil.Eventually(t, 10*time.Second, "slow cadence while the lock is held", func() bool {
		return agent.Snapshot().Heartbeat.Interval == cfg.HeartbeatSlowInterval
	})
	testutil.Eventually(t, 10*time.Second, "the dead instance reaped and counted", func() bool {
		_, row := isAlive(t, pool, dead)
		return !row && agent.Snapshot().Reaped >= 1
	})
	s := agent.Snapshot()
	if s.Reaped < 1 || s.InstanceID != cfg.InstanceID || s.ServiceName != "agent-test" || s.Mode != cfg.Mode {
		t.Fatalf("snapshot: %+v", s)
	}
	if !hasLease(s.Leases, liveness.ReaperLease) {
		t.Fatalf("snapshot has no reaper lease stats: %+v", s.Leases)
	}
	if alive, row := isAlive(t, pool, cfg.InstanceID); !alive || !row {
		t.Fatalf("agent not alive while running: alive=%v row=%v", alive, row)
	}

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("agent did not stop within 15s")
	}
	// Gone at once: no row, and the lock session is closed (the backend may take a moment
	// to exit after the client's Terminate).
	testutil.Eventually(t, 5*time.Second, "instance dead after shutdown", func() bool {
		alive, row := isAlive(t, pool, cfg.InstanceID)
		return !alive && !row
	})
	var leases int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM liveness.leases`).Scan(&leases); err != nil || leases != 0 {
		t.Fatalf("leases left after shutdown: %d, %v", leases, err)
	}
}

func hasLease(ls []liveness.LeaseStats, name string) bool {
	for _, l := range ls {
		if l.Name == name {
			return true
		}
	}
	return false
}

// Run returns within ShutdownBudget even when every statement of the clean-up hangs:
// another session locks the instances table while a beat and a reap round are waiting on
// it, then the leases table, so that the reaper's lease release hangs too.
func TestAgentShutdownWithinBudgetWhenStatementsHang(t *testing.T) {
	db, pool := agentDB(t, 4)
	cfg := agentConfig(db, pool)
	cfg.HeartbeatInterval, cfg.HeartbeatSlowInterval = 2*time.Second, 4*time.Second
	cfg.StaleThreshold, cfg.DefinitiveDeadCutoff = 10*time.Second, 20*time.Second
	budget := cfg.ShutdownBudget()
	if want := 5*time.Second + time.Second + 5*time.Second; budget != want {
		t.Fatalf("ShutdownBudget() = %s, want %s (lease release 5s, row removal 1s, lock session close 5s)", budget, want)
	}
	agent, err := liveness.NewAgent(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		if err := agent.Run(ctx); err != nil {
			t.Logf("Run: %v", err) // the row removal times out, as intended
		}
	}()
	t.Cleanup(func() { stop(); <-finished })
	testutil.Eventually(t, 10*time.Second, "alive lock held and a beat written", func() bool {
		s := agent.Snapshot()
		return s.AliveLock.Held && s.Heartbeat.Beats > 0
	})

	locker := db.Conn(t)
	bg := context.Background()
	if _, err := locker.Exec(bg, `BEGIN; LOCK TABLE liveness.instances IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = locker.Exec(context.Background(), `ROLLBACK`) })
	testutil.Eventually(t, 20*time.Second, "a beat and a reap round wait for the instances table", func() bool {
		var beat, reap bool
		if err := pool.QueryRow(bg, `SELECT
			coalesce(bool_or(query LIKE '%pg_liveness:heartbeat %'), false),
			-- the reap round waits in its cleanup, or already in its lease acquisition,
			-- which asks whether the current holder is alive
			coalesce(bool_or(query LIKE '%pg_liveness:cleanup %' OR query LIKE '%pg_liveness:lease_acquire %'), false)
			FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&beat, &reap); err != nil {
			t.Fatal(err)
		}
		return beat && reap
	})
	if _, err := locker.Exec(bg, `LOCK TABLE liveness.leases IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	stop()
	const slack = 3 * time.Second // scheduling on a loaded machine
	select {
	case <-finished:
	case <-time.After(budget + slack):
		t.Fatalf("Run did not return within its budget %s (+%s)", budget, slack)
	}
	t.Logf("Run returned %s after its context ended; budget %s", time.Since(start).Round(time.Millisecond), budget)
}

// TestAgentDuplicateInstanceWritesNothing: a second agent with the same instance id
// cannot take the alive lock, so it must not write the row (its service name would flip
// the first one's), must not delete the row on its way out, and gives up with
// ErrDuplicateInstance once the duplicate has lasted DuplicateTimeout.
func TestAgentDuplicateInstanceWritesNothing(t *testing.T) {
	db, pool := agentDB(t, 4)
	first := agentConfig(db, pool)
	first.Reaper = false
	a1, err := liveness.NewAgent(first)
	if err != nil {
		t.Fatal(err)
	}
	ctx1, stop1 := context.WithCancel(context.Background())
	done1 := make(chan error, 1)
	go func() { done1 <- a1.Run(ctx1) }()
	t.Cleanup(func() { stop1(); <-done1 })
	testutil.Eventually(t, 10*time.Second, "the first agent holds its lock and beat", func() bool {
		s := a1.Snapshot()
		return s.AliveLock.Held && s.Heartbeat.Beats > 0
	})

	second := first
	second.ServiceName = "impostor"
	second.DuplicateTimeout = 2 * time.Second
	a2, err := liveness.NewAgent(second)
	if err != nil {
		t.Fatal(err)
	}
	ctx2, stop2 := context.WithTimeout(context.Background(), time.Minute)
	defer stop2()
	done2 := make(chan error, 1)
	go func() { done2 <- a2.Run(ctx2) }()
	var runErr error
	select {
	case runErr = <-done2:
	case <-time.After(30 * time.Second):
		t.Fatal("the duplicate agent did not give up within 30s (DuplicateTimeout 2s)")
	}
	if !errors.Is(runErr, liveness.ErrDuplicateInstance) {
		t.Fatalf("the duplicate's Run returned %v, want ErrDuplicateInstance", runErr)
	}
	s := a2.Snapshot()
	if s.Heartbeat.Beats != 0 || !s.AliveLock.Duplicate || !s.Heartbeat.Duplicate {
		t.Fatalf("duplicate's snapshot: %+v; want no beat and Duplicate reported", s)
	}
	var service string
	if err := pool.QueryRow(context.Background(), `SELECT service_name FROM liveness.instances WHERE instance_id = $1`,
		first.InstanceID).Scan(&service); err != nil {
		t.Fatalf("the first agent's row is gone after the duplicate left: %v", err)
	}
	if service != first.ServiceName {
		t.Fatalf("service_name = %q: the duplicate wrote the row", service)
	}
	if alive, _ := isAlive(t, pool, first.InstanceID); !alive {
		t.Fatal("the first agent is not alive after the duplicate left")
	}
}

// TestAgentNeedsTheSchema: forgetting the migrations fails Run at once with one line that
// says what to do; with WaitForSchema the agent waits, and joins once they are applied.
func TestAgentNeedsTheSchema(t *testing.T) {
	db := pgtest.NewDB(t)
	pool := db.Pool(t, 3)
	cfg := liveness.AgentConfig{Pool: pool, DirectDSN: db.DSN, InstanceID: uuid.New(), ServiceName: "no-schema"}
	agent, err := liveness.NewAgent(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = agent.Run(ctx)
	if !errors.Is(err, liveness.ErrSchemaNotReady) || !strings.Contains(err.Error(), "migrations.Apply") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Run without the schema = %v; want one line with ErrSchemaNotReady naming migrations.Apply", err)
	}

	cfg.WaitForSchema = true
	waiting, err := liveness.NewAgent(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- waiting.Run(runCtx) }()
	time.Sleep(300 * time.Millisecond)
	if s := waiting.Snapshot(); s.Heartbeat.Beats != 0 {
		t.Fatalf("the agent beat before the schema existed: %+v", s)
	}
	if _, err := migrations.Apply(ctx, pool, liveness.DefaultSchema); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "the waiting agent joins once the migrations are applied", func() bool {
		s := waiting.Snapshot()
		return s.AliveLock.Held && s.Heartbeat.Beats > 0
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
