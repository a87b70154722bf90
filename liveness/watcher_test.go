package liveness_test

import (
	"context"
	"slices"
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
)

// defaultAgentConfig is an agent at the library's defaults: no reaper (which would look
// at the verdict every ReaperInterval), the watcher on.
func defaultAgentConfig(db *pgtest.DB, pool *pgxpool.Pool, service string) liveness.AgentConfig {
	return liveness.AgentConfig{Pool: pool, DirectDSN: db.DSN, InstanceID: uuid.New(), ServiceName: service}
}

// crashable is an instance as a crashed process leaves it: its row says it held its
// alive lock, and the lock's session ends without a word (what kill -9 does; the
// session here is the test's own connection).
type crashable struct {
	id   uuid.UUID
	conn *pgx.Conn
	db   *pgtest.DB
}

func startCrashable(t *testing.T, ctx context.Context, db *pgtest.DB, service string) *crashable {
	t.Helper()
	c := &crashable{id: uuid.New(), conn: db.ConnAs(t, service+":alive-lock"), db: db}
	var ok bool
	if err := c.conn.QueryRow(ctx, `SELECT liveness.claim_instance_alive_lock($1)`, c.id).Scan(&ok); err != nil || !ok {
		t.Fatalf("claim = %v, %v", ok, err)
	}
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock, heartbeat_interval,
	            heartbeat_slow_interval, stale_threshold, definitive_dead_cutoff, lock_grace, lock_pid)
	            VALUES ($1, $2, true, '30 s', '60 s', '90 s', '5 min', '1 s', $3)`, c.id, service, c.conn.PgConn().PID())
	return c
}

// crash ends the lock's session and returns when PostgreSQL has freed the lock: the
// backend exits a moment after the client closes, not with the close.
func (c *crashable) crash(t *testing.T) time.Time {
	t.Helper()
	pid := c.conn.PgConn().PID()
	at := time.Now()
	if err := c.conn.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the crashed session's locks freed", func() bool {
		return c.db.QueryInt(t, `SELECT count(*) FROM pg_locks WHERE pid = $1`, int64(pid)) == 0
	})
	return at
}

// leadUntilStepDown starts a's campaign for lease and returns once a leads, with what
// makes it step down.
func leadUntilStepDown(t *testing.T, ctx context.Context, a *liveness.Agent, lease string, retry time.Duration) (stepDown func()) {
	t.Helper()
	step := make(chan struct{})
	leading := make(chan struct{}, 1)
	go func() {
		_ = a.Elect(ctx, liveness.ElectorConfig{Lease: lease, RetryPeriod: retry,
			OnStartedLeading: func(ctx context.Context, _ *liveness.Lease) {
				leading <- struct{}{}
				select {
				case <-step:
				case <-ctx.Done():
				}
			}})
	}()
	select {
	case <-leading:
	case <-ctx.Done():
		t.Fatalf("%s never led %s", a.Snapshot().ServiceName, lease)
	}
	return func() { close(step) }
}

// follow starts the campaign for lease of the follower, whose pool counter counts, and
// returns once its first try has been answered (refused: the lease is held), with the
// channel that gets the time it starts leading.
func follow(t *testing.T, ctx context.Context, follower *liveness.Agent, counter *statementCounter, lease string, retry time.Duration) <-chan time.Time {
	t.Helper()
	took := make(chan time.Time, 1)
	go func() {
		_ = follower.Elect(ctx, liveness.ElectorConfig{Lease: lease, RetryPeriod: retry,
			OnStartedLeading: func(ctx context.Context, _ *liveness.Lease) { took <- time.Now(); <-ctx.Done() }})
	}()
	testutil.Eventually(t, 10*time.Second, "the follower's first try of "+lease+" answered", func() bool {
		return counter.answered("lease_acquire:"+lease) > 0
	})
	return took
}

// watching waits until one of the two watcher leases is held by a.
func watching(t *testing.T, ctx context.Context, pool *pgxpool.Pool, a *liveness.Agent) {
	t.Helper()
	r, err := liveness.NewReader(liveness.ReaderConfig{DB: pool})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 15*time.Second, "the agent leading a watcher", func() bool {
		for _, name := range defaults.WatcherLeases {
			if l, err := r.Leader(ctx, name); err == nil && l.InstanceID == a.Snapshot().InstanceID {
				return true
			}
		}
		return false
	})
}

// After a crash and a silence in which nobody asks, the first look says dead: the
// watcher stamped the vanished lock when it vanished, so the grace ran from the crash,
// not from the look. With the watcher disabled the same look says alive (lock_lost),
// which is the defect this guards against.
func TestCrashIsDeadForTheFirstLookAfterSilence(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	ctx := testutil.Context(t, time.Minute)
	a := newAgent(t, defaultAgentConfig(db, pool, "watching"))
	runAgent(t, a)
	watching(t, ctx, pool, a)

	victim := startCrashable(t, ctx, db, "victim")
	// The watcher's digest changed with the new lock; let it see the fleet as it is.
	time.Sleep(2 * defaults.WatchInterval)
	crashed := victim.crash(t)
	// Nobody looks for 3 s: the agent's heartbeat reads no verdict, and it follows no
	// campaign but the second watcher's, which waits for its slot.
	time.Sleep(3 * time.Second)

	var alive, alive90 bool
	var state string
	if err := pool.QueryRow(ctx, `SELECT liveness.is_instance_alive($1), liveness.is_instance_alive($1, 90),
	        (SELECT s.state FROM liveness.instance_states() s WHERE s.instance_id = $1)`, victim.id).Scan(&alive, &alive90, &state); err != nil {
		t.Fatal(err)
	}
	if alive || alive90 || state != "stale" {
		t.Fatalf("first look 3 s after the crash: is_instance_alive = %v, (id, 90) = %v, instance_states = %q; want false, false, stale",
			alive, alive90, state)
	}
	var stampedAfter time.Duration
	if err := pool.QueryRow(ctx, `SELECT extract(epoch FROM missing_since - $2::timestamptz)::float8 * interval '1 s'
	        FROM liveness.alive_lock_absences WHERE instance_id = $1`, victim.id, crashed).Scan(&stampedAfter); err != nil {
		t.Fatal(err)
	}
	// Generous: one tick on a loaded machine.
	if stampedAfter > 2*time.Second {
		t.Errorf("the absence was stamped %s after the crash; want within a few ticks of %s", stampedAfter, defaults.WatchInterval)
	}
	t.Logf("stamped %s after the crash", stampedAfter)
}

// A tick when nothing changed reads pg_locks and nothing else, and writes only its own
// record of the tick (one row of alive_lock_watch, which lets refused lease tries judge
// from the stamps): no stamp, no other row. A tick after a lock appeared stamps nothing
// either when nothing vanished. pg_stat_xact_user_tables counts the rows the tick's
// transaction wrote, SECURITY DEFINER functions included.
func TestWatchTickWritesNothingWhenNothingChanges(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 2)
	ctx := testutil.Context(t, 30*time.Second)
	alive := startCrashable(t, ctx, db, "alive")
	_ = alive
	tick := func(prev *string) (digest string, others, watch int64, absences int) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		written := func() (others, watch int64) {
			t.Helper()
			if err := tx.QueryRow(ctx, `SELECT
			        coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del) FILTER (WHERE relname <> 'alive_lock_watch'), 0)::bigint,
			        coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del) FILTER (WHERE relname = 'alive_lock_watch'), 0)::bigint
			    FROM pg_stat_xact_user_tables WHERE schemaname = 'liveness'`).Scan(&others, &watch); err != nil {
				t.Fatal(err)
			}
			return others, watch
		}
		// Pending counts may carry over from the session's earlier transactions until
		// they are flushed: the difference is this tick's.
		othersBefore, watchBefore := written()
		rows, err := tx.Query(ctx, `SELECT digest, instance_id FROM liveness.watch_alive_locks($1)`, prev)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id *uuid.UUID
			if err := rows.Scan(&digest, &id); err != nil {
				t.Fatal(err)
			}
			if id != nil {
				absences++
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		others, watch = written()
		others, watch = others-othersBefore, watch-watchBefore
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return digest, others, watch, absences
	}
	first, others, watch, n := tick(nil)
	if others != 0 || watch != 1 || n != 0 {
		t.Errorf("first tick, no lock vanished: %d rows written, %d of the tick's record, %d absences; want only the record", others, watch, n)
	}
	again, others, watch, _ := tick(&first)
	if again != first || others != 0 || watch != 1 {
		t.Errorf("second tick, nothing changed: digest %q (was %q), %d rows written, %d of the record; want the same digest and only the record", again, first, others, watch)
	}
	other := startCrashable(t, ctx, db, "other")
	changed, others, _, _ := tick(&first)
	if changed == first || others != 0 {
		t.Errorf("tick after a lock appeared: digest %q (was %q), %d rows written; want a new digest and no stamp", changed, first, others)
	}
	other.crash(t)
	_, others, _, n = tick(&changed)
	if others == 0 || n != 1 {
		t.Errorf("tick after a lock vanished: %d rows written, %d absences; want the absence stamped", others, n)
	}
}

// A follower is woken by the notification of a release: with a RetryPeriod of 30 s it
// still takes the lease within a few seconds of the leader's return.
func TestFollowerIsWokenWhenTheLeaseIsReleased(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 8)
	ctx := testutil.Context(t, time.Minute)
	const retry = 30 * time.Second
	leader := newAgent(t, defaultAgentConfig(db, pool, "leader"))
	runAgent(t, leader)
	fpool, counter := countingPool(t, db.DSN, 4)
	follower := newAgent(t, defaultAgentConfig(db, fpool, "follower"))
	runAgent(t, follower)

	stepDown := leadUntilStepDown(t, ctx, leader, "woken", retry)
	// The follower listens on its alive lock's session; its first try has found the lease
	// held, and its next one is 15 to 30 s away: then the leader steps down.
	testutil.Eventually(t, 10*time.Second, "the follower listening", func() bool {
		return db.QueryInt(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'follower:alive-lock' AND datname = current_database()`) == 1
	})
	took := follow(t, ctx, follower, counter, "woken", retry)
	stepped := time.Now()
	stepDown()
	select {
	case at := <-took:
		if d := at.Sub(stepped); d > 5*time.Second {
			t.Fatalf("the follower took the lease %s after the release; want within a few round trips", d)
		} else {
			t.Logf("taken %s after the release", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the follower did not take the released lease within 10 s (its RetryPeriod is %s): not woken", retry)
	}
}

// The listening session is dropped for real (pg_terminate_backend): the follower's
// session reconnects and listens again, so the next release still wakes it; and a
// release sent while it was away is caught up by the poll.
func TestFollowerListensAgainAfterItsSessionIsTerminated(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 8)
	ctx := testutil.Context(t, 2*time.Minute)
	leader := newAgent(t, defaultAgentConfig(db, pool, "leader"))
	runAgent(t, leader)
	fpool, counter := countingPool(t, db.DSN, 4)
	follower := newAgent(t, defaultAgentConfig(db, fpool, "follower"))
	runAgent(t, follower)

	round := func(name string, retry time.Duration, between func()) time.Duration {
		t.Helper()
		lctx, stopLeader := context.WithCancel(ctx)
		defer stopLeader()
		stepDown := leadUntilStepDown(t, lctx, leader, name, time.Hour)
		fctx, stopFollower := context.WithCancel(ctx)
		defer stopFollower()
		took := follow(t, fctx, follower, counter, name, retry)
		between()
		stepped := time.Now()
		stepDown()
		select {
		case at := <-took:
			return at.Sub(stepped)
		case <-time.After(retry + 10*time.Second):
			t.Fatalf("%s: the follower did not take the lease within its RetryPeriod (%s) and 10 s", name, retry)
			return 0
		}
	}
	terminate := func() {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		        WHERE application_name = 'follower:alive-lock' AND datname = current_database()`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("terminated %d listening sessions (%v); want 1", n, err)
		}
	}
	// Terminated, reconnected, listening again: woken well before its 30 s RetryPeriod.
	d := round("after-reconnect", 30*time.Second, func() {
		before := follower.Snapshot().AliveLock.Reconnects
		terminate()
		testutil.Eventually(t, 10*time.Second, "the follower's lock session back", func() bool {
			s := follower.Snapshot().AliveLock
			return s.Reconnects > before && s.Held
		})
		time.Sleep(time.Second) // the LISTEN follows the claim
	})
	if d > 5*time.Second {
		t.Errorf("after its session was terminated and came back, the follower took the lease %s after the release; want it woken", d)
	}
	// Released while the session is down: the poll (or the resync when it listens
	// again) takes it within the RetryPeriod.
	d = round("while-away", 3*time.Second, terminate)
	t.Logf("released while the listening session was away: taken after %s", d)
}

// A follower behind PgBouncer (transaction mode, ModeHeartbeatTableOnly) has no
// listening session: it polls, and takes a released lease at its next try.
func TestFollowerBehindPgBouncerPolls(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 8)
	ctx := testutil.Context(t, time.Minute)
	bouncer := pgtest.NewPgBouncer(t, db.DSN)
	// pgx must not use named prepared statements through a transaction-mode PgBouncer.
	bpool, counter := countingPool(t, bouncer.DSN(db.Name)+" default_query_exec_mode=exec", 4)
	leader := newAgent(t, defaultAgentConfig(db, pool, "leader"))
	runAgent(t, leader)
	fcfg := defaultAgentConfig(db, bpool, "bounced")
	fcfg.DirectDSN, fcfg.Mode = "", liveness.ModeHeartbeatTableOnly
	follower := newAgent(t, fcfg)
	runAgent(t, follower)

	const retry = 2 * time.Second
	stepDown := leadUntilStepDown(t, ctx, leader, "bounced", time.Hour)
	took := follow(t, ctx, follower, counter, "bounced", retry)
	stepDown()
	select {
	case <-took:
	case <-time.After(retry + 10*time.Second):
		t.Fatalf("the follower behind PgBouncer did not take the released lease within its RetryPeriod (%s) and 10 s", retry)
	}
}

// WatchAlive reports the alive set at the start and on every change: an instance that
// joins, one that stops gracefully (left), one that crashes (dead, notified by the
// watcher a grace after its lock vanished), each well before the slow poll.
func TestWatchAliveReportsEveryChange(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 8)
	ctx := testutil.Context(t, 2*time.Minute)
	watcher := newAgent(t, defaultAgentConfig(db, pool, "shard"))
	runAgent(t, watcher)
	watching(t, ctx, pool, watcher)

	sets := make(chan []uuid.UUID, 16)
	wctx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan error, 1)
	go func() {
		watchDone <- watcher.WatchAlive(wctx, "shard", 0, func(alive []liveness.InstanceStatus) {
			ids := make([]uuid.UUID, len(alive))
			for i, s := range alive {
				ids[i] = s.InstanceID
			}
			sets <- ids
		})
	}()
	self := watcher.Snapshot().InstanceID
	next := func(what string, want ...uuid.UUID) {
		t.Helper()
		slices.SortFunc(want, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
		select {
		case got := <-sets:
			if !slices.Equal(got, want) {
				t.Fatalf("%s: alive set %v, want %v", what, got, want)
			}
		case <-time.After(defaults.WatchAlivePoll - time.Second):
			t.Fatalf("%s: no call within %s (before the slow poll): not woken", what, defaults.WatchAlivePoll-time.Second)
		}
	}
	next("at the start", self)

	joiner := newAgent(t, defaultAgentConfig(db, pool, "shard"))
	stopJoiner, joinerDone := runAgent(t, joiner)
	next("after a join", self, joiner.Snapshot().InstanceID)
	stopJoiner()
	if err := <-joinerDone; err != nil {
		t.Fatal(err)
	}
	next("after a graceful stop", self)

	victim := startCrashable(t, ctx, db, "shard")
	next("after the crashable instance joined", self, victim.id)
	victim.crash(t)
	// Dead a lock grace after the watcher saw the lock vanish; then notified.
	next("after a crash", self)

	stopWatch()
	if err := <-watchDone; err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-sets:
		t.Fatalf("a call after the end: %v", got)
	default:
	}
}

// Two agents run the two watchers, one each, from their start: the second agent's first
// try of the free watcher lease is not put off by its own other campaign's try (a
// follower's retry, 2.5 to 5 s later, would be).
func TestTwoAgentsRunOneWatcherEach(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 8)
	ctx := testutil.Context(t, time.Minute)
	first := newAgent(t, defaultAgentConfig(db, pool, "first"))
	runAgent(t, first)
	watching(t, ctx, pool, first)
	second := newAgent(t, defaultAgentConfig(db, pool, "second"))
	runAgent(t, second)
	r, err := liveness.NewReader(liveness.ReaderConfig{DB: pool})
	if err != nil {
		t.Fatal(err)
	}
	var holders []uuid.UUID
	if !testutil.Poll(2*time.Second, func() bool {
		holders = holders[:0]
		for _, name := range defaults.WatcherLeases {
			if l, err := r.Leader(ctx, name); err == nil {
				holders = append(holders, l.InstanceID)
			}
		}
		return len(holders) == 2
	}) {
		t.Fatalf("watcher leases held by %v 2 s after the second agent started; want both, by two agents", holders)
	}
	if holders[0] == holders[1] {
		t.Fatalf("both watcher leases are held by %s; want one agent each", holders[0])
	}
}

// When both watchers die at once, and with them whatever else they led, every other
// agent's sentry is what notices: it finds no recent tick, ticks in their place, and the
// crashes are dead, and their leases free, about a second after PostgreSQL freed the
// locks. Here two crashable instances lead the watcher leases and tick as a watcher does
// (the test ticks for them); the agent runs no reaper, so its sentry asks at the fleet's
// pace only; the watchers and a third instance crash together. Without the sentry the
// agent's watcher campaigns wait for a notification nobody sends, and poll 30 s later.
func TestSentryStandsInWhenBothWatchersDie(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	ctx := testutil.Context(t, time.Minute)
	watchers := [2]*crashable{startCrashable(t, ctx, db, "watcher"), startCrashable(t, ctx, db, "watcher")}
	for i, w := range watchers {
		db.Exec(t, `INSERT INTO liveness.leases (name, holder, holder_instance_id, expires_at)
		            VALUES ($1, 'test', $2, now() + interval '1 hour')`, defaults.WatcherLeases[i], w.id)
	}
	victim := startCrashable(t, ctx, db, "victim")
	tickCtx, stopTicking := context.WithCancel(ctx)
	ticking := make(chan struct{})
	go func() {
		defer close(ticking)
		for tickCtx.Err() == nil {
			_, _ = pool.Exec(tickCtx, `SELECT * FROM liveness.watch_alive_locks(NULL)`)
			time.Sleep(defaults.WatchInterval / 2)
		}
	}()
	defer stopTicking()

	deaths := db.ConnAs(t, "test:listener")
	if _, err := deaths.Exec(ctx, `SELECT liveness.members_listen()`); err != nil {
		t.Fatal(err)
	}
	a := newAgent(t, defaultAgentConfig(db, pool, "sentry"))
	runAgent(t, a)
	testutil.Eventually(t, 15*time.Second, "the agent holding its lock", func() bool { return a.Snapshot().AliveLock.Held })
	// The agent's campaigns were refused (both watchers alive): it leads nothing.
	time.Sleep(time.Second)

	stopTicking()
	<-ticking
	for _, c := range []*crashable{watchers[0], watchers[1], victim} {
		pid := c.conn.PgConn().PID()
		_ = c.conn.Close(context.Background())
		testutil.Eventually(t, 10*time.Second, "the crashed session's locks freed", func() bool {
			return db.QueryInt(t, `SELECT count(*) FROM pg_locks WHERE pid = $1`, int64(pid)) == 0
		})
	}
	crashed := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		n, err := deaths.WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("no dead:%s within 10 s of the crash of both watchers and the victim (%v): nobody stood in", victim.id, err)
		}
		if n.Payload == "dead:"+victim.id.String() {
			break
		}
	}
	took := time.Since(crashed)
	t.Logf("the victim was notified dead %s after the crash", took.Round(time.Millisecond))
	// Generous: the sentry's question, a tick, the grace and the notifying tick, on a
	// loaded machine. The fault suite measures it (TestCrashSilence).
	if took > 5*time.Second {
		t.Errorf("dead:%s came %s after the crash; want within a few seconds", victim.id, took)
	}
	// Then the watchers' leases are notified free and the agent leads one of them.
	watching(t, ctx, pool, a)
}
