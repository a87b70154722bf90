package liveness_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

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
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 2)
	for _, tc := range []struct {
		mutate func(*liveness.AgentConfig)
		field  string
	}{
		{func(c *liveness.AgentConfig) {
			c.Timing.DefinitiveDeadCutoff = c.Timing.HeartbeatSlowInterval + c.Timing.StaleThreshold
		}, "AgentConfig.Timing.DefinitiveDeadCutoff"},
		{func(c *liveness.AgentConfig) { c.ReaperInterval = -time.Second }, "AgentConfig.ReaperInterval"},
		{func(c *liveness.AgentConfig) { c.ReaperLeaseTTL = 3 * time.Millisecond }, "AgentConfig.ReaperLeaseTTL"},
		{func(c *liveness.AgentConfig) { c.Timing.HeartbeatInterval = -time.Second }, "AgentConfig.Timing.HeartbeatInterval"},
		{func(c *liveness.AgentConfig) { c.Timing.LockGrace = -time.Second }, "AgentConfig.Timing.LockGrace"},
		{func(c *liveness.AgentConfig) { c.KeepaliveIdle = 1500 * time.Millisecond }, "AgentConfig.KeepaliveIdle"},
		{func(c *liveness.AgentConfig) { c.DirectDSN = "" }, "AgentConfig.DirectDSN"},
		{func(c *liveness.AgentConfig) { c.ServiceName = "" }, "AgentConfig.ServiceName"},
		{func(c *liveness.AgentConfig) { c.Pool = nil }, "AgentConfig.Pool"},
		{func(c *liveness.AgentConfig) { c.Mode = "lock-only" }, "AgentConfig.Mode"},
		{func(c *liveness.AgentConfig) { c.JobWindDown = -time.Second }, "AgentConfig.JobWindDown"},
		{func(c *liveness.AgentConfig) { c.ShutdownTimeout = -time.Second }, "AgentConfig.ShutdownTimeout"},
		{func(c *liveness.AgentConfig) { c.Metadata = map[string]any{"f": func() {}} }, "AgentConfig.Metadata"},
	} {
		cfg := agentConfig(db, pool)
		tc.mutate(&cfg)
		// Validate refuses exactly what NewAgent refuses.
		for name, err := range map[string]error{"Validate": cfg.Validate(), "NewAgent": func() error { _, err := liveness.NewAgent(cfg); return err }()} {
			var ce *liveness.ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field || strings.Contains(err.Error(), "--") {
				t.Errorf("%s: want a *ConfigError for %s that names no flag, got %v", name, tc.field, err)
			}
		}
	}
	if _, err := liveness.NewAgent(agentConfig(db, pool)); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	// In ModeHeartbeatTableOnly there is no alive lock, so no direct DSN either.
	tableOnly := agentConfig(db, pool)
	tableOnly.Mode, tableOnly.DirectDSN = liveness.ModeHeartbeatTableOnly, ""
	if err := tableOnly.Validate(); err != nil {
		t.Fatalf("ModeHeartbeatTableOnly without a DirectDSN is refused: %v", err)
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
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 2)
	cfg := agentConfig(db, pool)
	agent := newAgent(t, cfg)
	// A dead instance (no lock, old heartbeat) for the reaper.
	dead := uuid.New()
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, last_heartbeat_at)
		VALUES ($1, 'other', now() - interval '1 hour')`, dead)

	stop, done := runAgent(t, agent) // alive lock held and a beat written
	testutil.Eventually(t, 10*time.Second, "slow cadence while the lock is held", func() bool {
		return agent.Snapshot().Heartbeat.Interval == cfg.Timing.HeartbeatSlowInterval
	})
	testutil.Eventually(t, 10*time.Second, "the dead instance reaped and counted", func() bool {
		_, row := isAlive(t, pool, dead)
		return !row && agent.Snapshot().Reaped >= 1
	})
	s := agent.Snapshot()
	if s.Reaped < 1 || s.InstanceID != cfg.InstanceID || s.ServiceName != "agent-test" || s.Mode != cfg.Mode {
		t.Fatalf("snapshot: %+v", s)
	}
	if !hasLease(s.Leases, defaults.ReaperLease) {
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

// lockInstances takes an ACCESS EXCLUSIVE lock on liveness.instances, on a session of its
// own in a transaction that lasts until the session's ROLLBACK or the test's end: every
// statement on the table waits meanwhile.
func lockInstances(t *testing.T, db *pgtest.DB) *pgx.Conn {
	t.Helper()
	locker := db.Conn(t)
	if _, err := locker.Exec(context.Background(), `BEGIN; LOCK TABLE liveness.instances IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = locker.Exec(context.Background(), `ROLLBACK`) })
	return locker
}

// leaseExpiry reads a lease row's expiry; ok is false without a row.
func leaseExpiry(t *testing.T, pool *pgxpool.Pool, name string) (expires time.Time, holderID *uuid.UUID, ok bool) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT expires_at, holder_instance_id FROM liveness.leases WHERE name = $1`,
		name).Scan(&expires, &holderID)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return expires, holderID, true
}

// TestAgentShutdownGivesEachStepItsBudget: with ShutdownTimeout=20s, ShutdownBudget is
// the sum of the documented steps, and Run gives each step its time: when its context
// ends, the job's context is cancelled while its lease is still renewed and the
// instance still alive; the lease is released once the job returns, before Run does;
// and the row's deletion may wait for longer than the default ShutdownTimeout, and
// succeeds.
func TestAgentShutdownGivesEachStepItsBudget(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	cfg := agentConfig(db, pool)
	cfg.Reaper = false
	cfg.Timing = liveness.Timing{HeartbeatInterval: 2 * time.Second, HeartbeatSlowInterval: 4 * time.Second,
		StaleThreshold: 10 * time.Second, DefinitiveDeadCutoff: 20 * time.Second}
	cfg.JobWindDown = 3 * time.Second
	cfg.ShutdownTimeout = 20 * time.Second
	// The steps: the jobs' wind-down, their leases let go (5 s), a beat in flight (half
	// the fast interval, at most 10 s), the row's deletion, the lock session's close (5 s).
	want := cfg.JobWindDown + 5*time.Second + time.Second + cfg.ShutdownTimeout + 5*time.Second
	if got := cfg.ShutdownBudget(); got != want {
		t.Fatalf("ShutdownBudget() = %s, want %s", got, want)
	}
	agent := newAgent(t, cfg)
	stopAgent, agentDone := runAgent(t, agent)

	started, cancelled, finish := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var windDownFence error // written before cancelled is closed
	type stopped struct {
		reason            error
		leaseRow, runDone bool
	}
	stops := make(chan stopped, 1)
	electDone := make(chan error, 1)
	go func() {
		electDone <- agent.Elect(context.Background(), liveness.ElectorConfig{Lease: "job", TTL: time.Second,
			RetryPeriod: 100 * time.Millisecond,
			OnStartedLeading: func(ctx context.Context, self *liveness.Lease) {
				close(started)
				<-ctx.Done()
				// Winding down, the job still holds its lease: its fenced writes count.
				windDownFence = pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
					return self.Fence(context.Background(), tx)
				})
				close(cancelled)
				<-finish
			},
			OnStoppedLeading: func(reason error) {
				var row bool
				if err := pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM liveness.leases WHERE name = 'job')`).
					Scan(&row); err != nil {
					t.Error(err)
				}
				stops <- stopped{reason: reason, leaseRow: row, runDone: len(agentDone) > 0}
			},
		})
	}()
	t.Cleanup(func() {
		select {
		case <-finish:
		default:
			close(finish)
		}
	})
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not lead within 10s")
	}

	stopAgent() // SIGTERM
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the job's context was not cancelled when Run's ended")
	}
	if windDownFence != nil {
		t.Fatalf("a fenced write during the wind-down was refused: %v", windDownFence)
	}
	first, _, _ := leaseExpiry(t, pool, "job")
	testutil.Eventually(t, 5*time.Second, "the lease renewed while the job winds down", func() bool {
		expires, _, ok := leaseExpiry(t, pool, "job")
		return ok && expires.After(first)
	})
	if alive, row := isAlive(t, pool, cfg.InstanceID); !alive || !row {
		t.Fatalf("while its job winds down the instance is alive=%v (row %v); want alive", alive, row)
	}
	if len(agentDone) > 0 {
		t.Fatal("Run returned while the job was still running")
	}

	// The row's deletion will find the instances table locked.
	locker := lockInstances(t, db)
	bg := context.Background()
	close(finish)
	var st stopped
	select {
	case st = <-stops:
	case <-time.After(10 * time.Second):
		t.Fatal("OnStoppedLeading did not run within 10s of the job's return")
	}
	if !errors.Is(st.reason, context.Canceled) || st.leaseRow || st.runDone {
		t.Fatalf("OnStoppedLeading: reason %v, lease row left %v, Run returned %v; want context.Canceled, "+
			"the lease released, and Run still running", st.reason, st.leaseRow, st.runDone)
	}
	waited := defaults.ShutdownTimeout + time.Second
	testutil.Eventually(t, 30*time.Second, fmt.Sprintf("the row's deletion waiting for more than %s", waited), func() bool {
		var n int
		if err := pool.QueryRow(bg, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND query LIKE '%pg_liveness:heartbeat_delete %' AND wait_event_type = 'Lock'
			AND now() - query_start > $1::interval`, waited).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	if _, err := locker.Exec(bg, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-agentDone:
		if err != nil {
			t.Fatalf("Run = %v; want nil: the row's deletion had ShutdownTimeout (%s)", err, cfg.ShutdownTimeout)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of the table's unlocking")
	}
	if alive, row := isAlive(t, pool, cfg.InstanceID); alive || row {
		t.Fatalf("after Run: alive=%v row=%v; want neither", alive, row)
	}
	if err := <-electDone; err != nil {
		t.Fatalf("Elect = %v; want nil", err)
	}
}

// TestAgentLeavesAnOverrunningJobsLeaseToExpire: a job that ignores its cancelled
// context past JobWindDown keeps its lease from everyone else until the lease expires,
// even after its agent has stopped and is dead by the verdict: the lease is left to
// expire, never released early, and Elect says so.
func TestAgentLeavesAnOverrunningJobsLeaseToExpire(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	cfg := agentConfig(db, pool)
	cfg.Reaper = false
	cfg.JobWindDown = 300 * time.Millisecond
	agent := newAgent(t, cfg)
	stopAgent, agentDone := runAgent(t, agent)
	started, release := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(release) })
	electDone := make(chan error, 1)
	const ttl = 20 * time.Second
	go func() {
		electDone <- agent.Elect(context.Background(), liveness.ElectorConfig{Lease: "stubborn", TTL: ttl,
			OnStartedLeading: func(context.Context, *liveness.Lease) {
				close(started)
				<-release // ignores its context
			},
			OnStoppedLeading: func(error) { t.Error("OnStoppedLeading ran while the job had not returned") },
		})
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not lead within 10s")
	}
	stopAgent()
	select {
	case err := <-electDone:
		if !errors.Is(err, liveness.ErrWindDownExceeded) {
			t.Fatalf("Elect = %v; want ErrWindDownExceeded", err)
		}
		// The operator's one line: which lease, left to expire when.
		if !strings.Contains(err.Error(), `lease "stubborn" (epoch `) || !strings.Contains(err.Error(), "left to expire at") {
			t.Errorf("Elect = %q; want it to name the lease, its epoch and when it expires", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Elect did not return within 15s of the agent's stop")
	}
	if err := <-agentDone; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if alive, row := isAlive(t, pool, cfg.InstanceID); alive || row {
		t.Fatalf("the stopped agent: alive=%v row=%v; want dead and gone", alive, row)
	}
	expires, holderID, ok := leaseExpiry(t, pool, "stubborn")
	if !ok || holderID != nil {
		t.Fatalf("lease row present %v, holder instance %v; want the row left, without its holder instance", ok, holderID)
	}
	other := newTestLeases(t, pool)
	if le, err := other.TryAcquire(context.Background(), "stubborn", time.Minute); !errors.Is(err, liveness.ErrLeaseHeld) {
		t.Fatalf("TryAcquire of a lease left to expire (until %s) = %v, %v; want ErrLeaseHeld", expires, le, err)
	}
}

// Run returns within ShutdownBudget even when every statement of the clean-up hangs and
// a job never returns: another session locks the instances table while a beat and a
// reap round are waiting on it, then the leases table, so that the reaper's release and
// the stubborn job's leaving its lease to expire hang too.
func TestAgentShutdownWithinBudgetWhenStatementsHang(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	cfg := agentConfig(db, pool)
	cfg.Timing = liveness.Timing{HeartbeatInterval: 2 * time.Second, HeartbeatSlowInterval: 4 * time.Second,
		StaleThreshold: 10 * time.Second, DefinitiveDeadCutoff: 20 * time.Second}
	cfg.JobWindDown = 2 * time.Second
	budget := cfg.ShutdownBudget()
	if want := 2*time.Second + 5*time.Second + time.Second + defaults.ShutdownTimeout + 5*time.Second; budget != want {
		t.Fatalf("ShutdownBudget() = %s, want %s", budget, want)
	}
	agent := newAgent(t, cfg)
	stop, done := runAgent(t, agent)
	started, release := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(release) })
	go func() {
		_ = agent.Elect(context.Background(), liveness.ElectorConfig{Lease: "stubborn", TTL: time.Minute,
			OnStartedLeading: func(context.Context, *liveness.Lease) { close(started); <-release }})
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not lead within 10s")
	}

	// Both tables at once, the leases first, before anything waits: locking the leases
	// later, while a reap round's lease_acquire holds them and waits for the instances,
	// was a deadlock the server broke by failing the test's own statement.
	locker := db.Conn(t)
	bg := context.Background()
	if _, err := locker.Exec(bg, `BEGIN; LOCK TABLE liveness.leases, liveness.instances IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = locker.Exec(context.Background(), `ROLLBACK`) })
	testutil.Eventually(t, time.Minute, "a beat and a reap round wait for the tables", func() bool {
		var beat, reap bool
		if err := pool.QueryRow(bg, `SELECT
			coalesce(bool_or(query LIKE '%pg_liveness:heartbeat %'), false),
			-- the reap round waits in its lease acquisition (or, had it got the lease
			-- before the lock, in its cleanup)
			coalesce(bool_or(query LIKE '%pg_liveness:cleanup %' OR query LIKE '%pg_liveness:lease_acquire %'), false)
			FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&beat, &reap); err != nil {
			t.Fatal(err)
		}
		return beat && reap
	})

	start := time.Now()
	stop()
	const slack = 3 * time.Second // scheduling on a loaded machine
	select {
	case err := <-done:
		t.Logf("Run: %v", err) // the row's deletion times out, as intended
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
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	first := agentConfig(db, pool)
	first.Reaper = false
	a1 := newAgent(t, first)
	runAgent(t, a1) // holds its lock and beat

	second := first
	second.ServiceName = "impostor"
	second.DuplicateTimeout = 2 * time.Second
	a2 := newAgent(t, second)
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
	t.Parallel()
	db := pgtest.NewDB(t)
	pool := db.Pool(t, 3)
	cfg := liveness.AgentConfig{Pool: pool, DirectDSN: db.DSN, InstanceID: uuid.New(), ServiceName: "no-schema"}
	agent := newAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := agent.Run(ctx)
	if !errors.Is(err, liveness.ErrSchemaNotReady) || !strings.Contains(err.Error(), "migrations.Apply") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Run without the schema = %v; want one line with ErrSchemaNotReady naming migrations.Apply", err)
	}

	cfg.WaitForSchema = true
	waiting := newAgent(t, cfg)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- waiting.Run(runCtx) }()
	// An agent that did not wait would start its workers on a missing schema: its beats
	// would fail (Failures, as Beats counts only writes that succeeded) and its claims too.
	if !testutil.Never(t, time.Second, "the agent tried to beat or claim before the schema existed", func() bool {
		s := waiting.Snapshot()
		return s.Heartbeat.Beats != 0 || s.Heartbeat.Failures != 0 || s.AliveLock.Claims != 0 || s.AliveLock.Held
	}) {
		t.Fatalf("snapshot: %+v", waiting.Snapshot())
	}
	if _, err := migrations.Apply(ctx, pool, defaults.Schema); err != nil {
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

// TestAgentHeartbeatTableOnly: the mode for a service that reaches PostgreSQL only
// through PgBouncer needs no direct DSN, holds no lock, and is heartbeat_only by the one
// verdict; it still campaigns, and leaves at once on shutdown.
func TestAgentHeartbeatTableOnly(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 3)
	cfg := agentConfig(db, pool)
	cfg.Mode, cfg.DirectDSN, cfg.Reaper = liveness.ModeHeartbeatTableOnly, "", false
	agent := newAgent(t, cfg)
	stop, done := runAgent(t, agent)
	reader, err := liveness.NewReader(liveness.ReaderConfig{DB: pool})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := reader.Instance(ctx, cfg.InstanceID)
	if err != nil || st.State != liveness.StateHeartbeatOnly || st.LockHeld || st.Mode != liveness.ModeHeartbeatTableOnly {
		t.Fatalf("Reader.Instance = %+v, %v; want heartbeat_only, no lock, the table-only mode", st, err)
	}
	var locks int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM liveness.bigint_advisory_locks l
		WHERE l.classid = liveness.lock_key_classid(liveness.instance_lock_key($1))
		  AND l.objid = liveness.lock_key_objid(liveness.instance_lock_key($1))`, cfg.InstanceID).Scan(&locks); err != nil || locks != 0 {
		t.Fatalf("%d advisory locks on the instance's key (%v); want none", locks, err)
	}
	if s := agent.Snapshot(); s.AliveLock != (liveness.AgentSnapshot{}).AliveLock || s.Heartbeat.Interval != cfg.Timing.HeartbeatInterval {
		t.Fatalf("Snapshot = %+v; want no alive lock and the fast cadence %s", s, cfg.Timing.HeartbeatInterval)
	}
	led := make(chan struct{})
	electCtx, endElect := context.WithCancel(ctx)
	defer endElect()
	go func() {
		_ = agent.Elect(electCtx, liveness.ElectorConfig{Lease: "table-only", OnStartedLeading: func(ctx context.Context, _ *liveness.Lease) {
			close(led)
			<-ctx.Done()
		}})
	}()
	select {
	case <-led:
	case <-time.After(10 * time.Second):
		t.Fatal("a table-only agent did not lead within 10s")
	}
	if leader, err := reader.Leader(ctx, "table-only"); err != nil || leader.InstanceID != cfg.InstanceID {
		t.Fatalf("Reader.Leader = %+v, %v; want this instance", leader, err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if alive, row := isAlive(t, pool, cfg.InstanceID); alive || row {
		t.Fatalf("after Run: alive=%v row=%v; want gone at once", alive, row)
	}
}
