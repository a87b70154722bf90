package liveness_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// strangerSession is a session of a role with nothing but CONNECT (the database's
// default for PUBLIC), which takes an instance's alive-lock key by computing it from the
// instance id, as anyone who knows an id can: pg_try_advisory_lock needs no privilege.
func strangerSession(t *testing.T, ctx context.Context, db *pgtest.DB) *pgx.Conn {
	t.Helper()
	role := pgx.Identifier{"stranger_" + db.Name}.Sanitize()
	db.Exec(t, `CREATE ROLE `+role+` NOLOGIN`)
	conn := db.ConnAs(t, "stranger")
	if _, err := conn.Exec(ctx, `SET ROLE `+role); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT count(*) FROM liveness.instances`); err == nil {
		t.Fatal("the stranger's role can read the instances: the test's premise is wrong")
	}
	return conn
}

// takeKey tries the instance's key on conn, as a hand-written claim loop from before this
// library does (pg_try_advisory_lock on the key, no claim recorded), until it
// holds it or ctx ends.
func takeKey(ctx context.Context, conn *pgx.Conn, id uuid.UUID) error {
	for {
		var got bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended('pg_liveness.alive:' || $1::text, 0))`,
			id.String()).Scan(&got); err != nil {
			return err
		}
		if got {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// A stranger's session that takes a crashed instance's key the moment PostgreSQL frees
// it does not keep the instance alive: only the session that claimed the lock counts
// (the row records its backend), and the watcher sees the key change hands. Before,
// the victim stayed alive until its lease's ttl, or its heartbeat's limits.
func TestStrangerOnACrashedInstancesKeyDoesNotKeepItAlive(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	ctx := testutil.Context(t, time.Minute)
	a := newAgent(t, defaultAgentConfig(db, pool, "watching"))
	runAgent(t, a)
	watching(t, ctx, pool, a)

	victim := startCrashable(t, ctx, db, "victim")
	stranger := strangerSession(t, ctx, db)
	taken := make(chan error, 1)
	go func() { taken <- takeKey(ctx, stranger, victim.id) }()
	time.Sleep(2 * defaults.WatchInterval) // the watcher sees the victim's lock held
	crashed := victim.crash(t)
	if err := <-taken; err != nil {
		t.Fatalf("the stranger could not take the key: %v", err)
	}
	t.Logf("the stranger took the key %s after the crash", time.Since(crashed).Round(time.Millisecond))

	var alive bool
	var state string
	if !testutil.Poll(5*time.Second, func() bool {
		if err := pool.QueryRow(ctx, `SELECT liveness.is_instance_alive($1),
		        (SELECT s.state FROM liveness.instance_states() s WHERE s.instance_id = $1)`, victim.id).Scan(&alive, &state); err != nil {
			t.Fatal(err)
		}
		return !alive && state == "stale"
	}) {
		t.Fatalf("5 s after the crash, with a stranger on its key: is_instance_alive = %v, state %q; want dead (stale)", alive, state)
	}
	t.Logf("dead %s after the crash", time.Since(crashed).Round(time.Millisecond))
	if n := db.QueryInt(t, `SELECT count(*) FROM liveness.instance_alive_locks WHERE instance_id = $1`, victim.id); n != 0 {
		t.Errorf("instance_alive_locks lists the stranger's lock as the victim's")
	}
}

// An instance restarting with its id (its previous process killed: its row stays, its
// session is gone) whose key a stranger took meanwhile is not a duplicate of itself: it
// says so, goes on (judged by its heartbeat, heartbeat_only), and claims its lock once
// the stranger lets go. Before, it gave up as a duplicate instance after
// DuplicateTimeout, and so did every restart.
func TestAgentCarriesOnWhileAStrangerHoldsItsKey(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	ctx := testutil.Context(t, time.Minute)
	cfg := defaultAgentConfig(db, pool, "squatted")
	cfg.DuplicateTimeout = 2 * time.Second
	gone := db.Conn(t) // the previous process's session, which claimed the lock and ended
	if _, err := gone.Exec(ctx, `SELECT liveness.claim_instance_alive_lock($1)`, cfg.InstanceID); err != nil {
		t.Fatal(err)
	}
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock, last_heartbeat_at, lock_pid)
	            VALUES ($1, 'squatted', true, now() - interval '5 seconds', $2)`, cfg.InstanceID, gone.PgConn().PID())
	if err := gone.Close(ctx); err != nil {
		t.Fatal(err)
	}
	stranger := strangerSession(t, ctx, db)
	if err := takeKey(ctx, stranger, cfg.InstanceID); err != nil {
		t.Fatal(err)
	}
	a := newAgent(t, cfg)
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Error("the agent did not stop within a minute")
		}
	})
	testutil.Eventually(t, 15*time.Second, "the agent seeing a stranger on its key", func() bool {
		return a.Snapshot().AliveLock.Stranger
	})
	r, err := liveness.NewReader(liveness.ReaderConfig{DB: pool})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the instance heartbeat_only", func() bool {
		st, err := r.Instance(ctx, cfg.InstanceID)
		return err == nil && st.State == liveness.StateHeartbeatOnly && !st.LockHeld
	})
	select {
	case err := <-done:
		t.Fatalf("the agent stopped while a stranger held its key: %v", err)
	case <-time.After(cfg.DuplicateTimeout + time.Second):
	}
	if s := a.Snapshot(); s.AliveLock.Duplicate || s.Heartbeat.Duplicate {
		t.Fatalf("a stranger's lock taken for a duplicate of this instance: %+v", s.AliveLock)
	}

	if err := stranger.Close(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 15*time.Second, "the agent holding its own lock", func() bool {
		s := a.Snapshot().AliveLock
		return s.Held && !s.Stranger
	})
	testutil.Eventually(t, 10*time.Second, "the instance alive by its lock", func() bool {
		st, err := r.Instance(ctx, cfg.InstanceID)
		return err == nil && st.State == liveness.StateAlive && st.LockHeld
	})
	select {
	case err := <-done:
		t.Fatalf("the agent stopped: %v", err)
	default:
	}
}

// Notifications are hints that cost a bounded amount of work whatever their rate: a
// flood of free:<lease> on the events channel (here from a role that may read its name:
// a stranger cannot, below) makes a follower try the lease a few times at once and then
// once a second, not once per payload (before: hundreds of tries a second). A stranger, who knows only the
// channel names of older releases and may not read the private ones, wakes nobody.
func TestNotificationFloodCostsAFollowerAtMostATryASecond(t *testing.T) {
	t.Parallel()
	db, _ := testdb.MigratedPool(t, 2)
	ctx := testutil.Context(t, time.Minute)
	lead := newAgent(t, agentConfig(db, db.Pool(t, 3)))
	runAgent(t, lead)
	pool, counter := countingPool(t, db.DSN, 3)
	follower := newAgent(t, agentConfig(db, pool))
	runAgent(t, follower)

	campaigns, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	job := func(ctx context.Context, _ *liveness.Lease) { <-ctx.Done() }
	wg.Go(func() { _ = lead.Elect(campaigns, liveness.ElectorConfig{Lease: "flooded", OnStartedLeading: job}) })
	reader, err := liveness.NewReader(liveness.ReaderConfig{DB: pool})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the first agent leads", func() bool {
		l, err := reader.Leader(ctx, "flooded")
		return err == nil && l.InstanceID == lead.Snapshot().InstanceID
	})
	wg.Go(func() { _ = follower.Elect(campaigns, liveness.ElectorConfig{Lease: "flooded", OnStartedLeading: job}) })
	testutil.Eventually(t, 10*time.Second, "the follower's first try", func() bool { return counter.count("lease_acquire:flooded") > 0 })
	time.Sleep(2500 * time.Millisecond) // past steadyAfter: the follower now waits for notifications

	// The stranger's flood, on the names it can know.
	stranger := strangerSession(t, ctx, db)
	if _, err := stranger.Exec(ctx, `SELECT liveness.events_channel()`); err == nil {
		t.Fatal("the stranger could read the private channel's name")
	}
	before := counter.count("lease_acquire:flooded")
	for range 500 {
		if _, err := stranger.Exec(ctx, `SELECT pg_notify('liveness_events', 'free:flooded'), pg_notify('liveness_members', 'dead:x')`); err != nil {
			t.Fatal(err)
		}
	}
	// And large ones, which the sessions that prove the agents' locks would have had to
	// read before their proofs' answers: the leader stepped down for want of a proof.
	for range 20 {
		if _, err := stranger.Exec(ctx, `SELECT pg_notify(c, repeat('x', 7990) || g::text)
		        FROM generate_series(1, 100) g, unnest(ARRAY['liveness_events', 'liveness_members']) c`); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	if tries := counter.count("lease_acquire:flooded") - before; tries > 1 {
		t.Errorf("500 free:flooded from a stranger made the follower try %d times; want none (it cannot reach the channel)", tries)
	}
	for _, l := range lead.Snapshot().Leases {
		for reason, n := range l.Lost {
			if n > 0 {
				t.Errorf("the leader lost lease %s %d times (%s) during the stranger's flood", l.Name, n, reason)
			}
		}
	}

	// An insider's flood, on the private channel: a payload every few milliseconds for 3 s.
	insider := db.Conn(t)
	before = counter.count("lease_acquire:flooded")
	began := time.Now()
	sent := 0
	for time.Since(began) < 3*time.Second {
		if _, err := insider.Exec(ctx, `SELECT pg_notify(liveness.events_channel(), 'free:flooded')`); err != nil {
			t.Fatal(err)
		}
		sent++
	}
	time.Sleep(500 * time.Millisecond)
	tries := counter.count("lease_acquire:flooded") - before
	t.Logf("%d free:flooded in %s: %d tries", sent, time.Since(began).Round(time.Millisecond), tries)
	// A burst of four, then one a second.
	if limit := int(time.Since(began)/time.Second) + 5; tries > limit {
		t.Errorf("%d free:flooded made the follower try %d times in %s; want at most %d (a burst of four, then one a second)",
			sent, tries, time.Since(began).Round(time.Millisecond), limit)
	}
	if tries == 0 {
		t.Errorf("the follower never tried: the flood did not reach it, so the test shows nothing")
	}
}
