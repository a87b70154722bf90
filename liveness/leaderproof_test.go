package liveness_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/netfault"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// TestCutOffLeaderStepsDownBeforeServerRestartFreesItsLock: a leader cut off by a
// half-open partition cannot see its alive lock vanish when the server restarts, while
// the fleet calls it dead one lock grace after the restart and a competitor takes the
// lease early. The leader must have stopped its job before the competitor begins: it
// trusts its lock only for a fraction of the lock grace after its last proof was sent.
//
// Default settings (ttl 15 s, lock grace 1 s, verification every 10 s when not leading,
// keepalive about 20 s) except: no reaper (it would only add a lease of its own). The
// partition is real (the proxy stops relaying, closes nothing) and so is the restart.
func TestCutOffLeaderStepsDownBeforeServerRestartFreesItsLock(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t)
	db := pgtest.NewDBOn(t, srv)
	testdb.Migrate(t, db.DSN, defaults.Schema)
	ctx := testutil.Context(t, 2*time.Minute)

	config := func(service, dsn string) liveness.AgentConfig {
		return liveness.AgentConfig{Pool: pgtest.Pool(t, dsn, 4), DirectDSN: dsn, InstanceID: uuid.New(), ServiceName: service}
	}
	proxy := netfault.NewProxy(t, db.DSN, 0)
	holder := newAgent(t, config("holder", proxy.DSN()))
	runAgent(t, holder)
	t.Cleanup(proxy.Close) // first, so that the holder's statements fail instead of hanging
	competitorCfg := config("competitor", db.DSN)
	competitorPool := competitorCfg.Pool
	competitor := newAgent(t, competitorCfg)
	runAgent(t, competitor)

	var mu sync.Mutex
	var holderBegan, holderEnded, competitorBegan time.Time
	var holderStops []error
	holderLeads, competitorLeads := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	electCtx, stopElect := context.WithCancel(ctx)
	defer stopElect()
	var holderOnce, competitorOnce sync.Once
	wg.Go(func() {
		_ = holder.Elect(electCtx, liveness.ElectorConfig{Lease: "job",
			OnStartedLeading: func(ctx context.Context, _ *liveness.Lease) {
				mu.Lock()
				holderBegan = time.Now()
				mu.Unlock()
				holderOnce.Do(func() { close(holderLeads) })
				<-ctx.Done()
				mu.Lock()
				if holderEnded.IsZero() {
					holderEnded = time.Now() // just before returning
				}
				mu.Unlock()
			},
			OnStoppedLeading: func(reason error) {
				mu.Lock()
				holderStops = append(holderStops, reason)
				mu.Unlock()
			}})
	})
	select {
	case <-holderLeads:
	case <-time.After(30 * time.Second):
		t.Fatal("the holder does not lead within 30 s")
	}
	seen := make(chan liveness.Leader, 16)
	wg.Go(func() {
		_ = competitor.Elect(electCtx, liveness.ElectorConfig{Lease: "job",
			OnNewLeader: func(l liveness.Leader) {
				select {
				case seen <- l:
				default:
				}
			},
			OnStartedLeading: func(ctx context.Context, _ *liveness.Lease) {
				mu.Lock()
				if competitorBegan.IsZero() {
					competitorBegan = time.Now()
				}
				mu.Unlock()
				competitorOnce.Do(func() { close(competitorLeads) })
				<-ctx.Done()
			}})
	})
	for l := range seen {
		if l.InstanceID == holder.Snapshot().InstanceID {
			break // the competitor follows the holder
		}
	}
	// The holder has led for a while, as in production: its lease renewed once (ttl/4).
	expiresAt := func() (at time.Time) {
		if err := competitorPool.QueryRow(ctx, `SELECT expires_at FROM liveness.leases WHERE name = 'job'`).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	firstExpiry := expiresAt()
	testutil.Eventually(t, 30*time.Second, "the holder's lease renewed", func() bool { return expiresAt().After(firstExpiry) })

	frozen := time.Now()
	proxy.Freeze()
	if err := srv.StopMode("fast"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	select {
	case <-competitorLeads:
	case <-time.After(60 * time.Second):
		t.Fatal("the competitor does not take over within 60 s of the restart")
	}
	mu.Lock()
	began, ended, taken := holderBegan, holderEnded, competitorBegan
	mu.Unlock()
	t.Logf("holder led from %s before the freeze; restart done %s after it; competitor began %s after it",
		frozen.Sub(began), restarted.Sub(frozen), taken.Sub(frozen))
	if ended.IsZero() {
		t.Fatalf("the competitor began its job %s after the freeze while the holder's job still ran: two job runners",
			taken.Sub(frozen))
	}
	if !ended.Before(taken) {
		t.Fatalf("the holder's job ended %s after the freeze, after the competitor's began (%s): two job runners",
			ended.Sub(frozen), taken.Sub(frozen))
	}
	t.Logf("holder's job ended %s after the freeze, %s before the competitor's began", ended.Sub(frozen), taken.Sub(ended))
	stopElect()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(holderStops) == 0 || !errors.Is(holderStops[0], liveness.ErrLeaseLost) {
		t.Fatalf("the holder's OnStoppedLeading reasons %v; want a lost lease first", holderStops)
	}
	var lost *liveness.LeaseLostError
	if errors.As(holderStops[0], &lost) && lost.Reason != "not_alive" {
		t.Fatalf("the holder stopped because %s; want %s (its proof of holding its lock went stale)", lost.Reason, "not_alive")
	}
}

// TestLeaseNotTrustedOnAnOldLockProof: an agent whose alive lock vanished unseen (its lock
// session cut off by a half-open network, its backend then terminated by the server)
// still counts itself alive, since nothing told it otherwise and it leads nothing, and
// takes a free lease. It must not start the job: the lease is trusted only once a
// verification sent after the acquisition finds the lock held, which never comes, so the
// lease is given back. Meanwhile the fleet calls it dead and a competitor leads.
//
// Default settings, except: the holder's pool reaches the server directly (only its lock
// session is cut off, so that its acquisition gets through), and it takes no part in the
// watchers' campaigns (a watcher lease would make it verify often and step down before it
// tries, which is not what this test is about).
func TestLeaseNotTrustedOnAnOldLockProof(t *testing.T) {
	t.Parallel()
	db, direct := testdb.MigratedPool(t, 2)
	ctx := testutil.Context(t, 2*time.Minute)
	proxy := netfault.NewProxy(t, db.DSN, 0)
	holderCfg := liveness.AgentConfig{Pool: pgtest.Pool(t, db.DSN, 4), DirectDSN: proxy.DSN(), InstanceID: uuid.New(),
		ServiceName: "holder", DisableWatcher: true}
	holder := newAgent(t, holderCfg)
	runAgent(t, holder)
	t.Cleanup(proxy.Close)
	competitor := newAgent(t, liveness.AgentConfig{Pool: pgtest.Pool(t, db.DSN, 4), DirectDSN: db.DSN, InstanceID: uuid.New(),
		ServiceName: "competitor"})
	runAgent(t, competitor)

	proxy.Freeze()
	var terminated int
	if err := direct.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
	                                 WHERE application_name = 'holder:alive-lock' AND datname = current_database()`).Scan(&terminated); err != nil || terminated != 1 {
		t.Fatalf("terminated %d lock backends of the holder (%v); want 1", terminated, err)
	}
	cutAt := time.Now()

	var mu sync.Mutex
	var holderBegan time.Time
	competitorLeads := make(chan time.Time, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	electCtx, stopElect := context.WithCancel(ctx)
	defer stopElect()
	wg.Go(func() {
		_ = holder.Elect(electCtx, liveness.ElectorConfig{Lease: "job",
			OnStartedLeading: func(ctx context.Context, _ *liveness.Lease) {
				mu.Lock()
				holderBegan = time.Now()
				mu.Unlock()
				<-ctx.Done()
			}})
	})
	// The holder's first try takes the free lease and gives it back one lock grace later.
	testutil.Eventually(t, 10*time.Second, "the holder's acquisition (an epoch taken)", func() bool {
		var n int
		if err := direct.QueryRow(ctx, `SELECT count(*) FROM liveness.leases WHERE name = 'job'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	wg.Go(func() {
		_ = competitor.Elect(electCtx, liveness.ElectorConfig{Lease: "job",
			OnStartedLeading: func(ctx context.Context, _ *liveness.Lease) {
				select {
				case competitorLeads <- time.Now():
				default:
				}
				<-ctx.Done()
			}})
	})
	select {
	case at := <-competitorLeads:
		t.Logf("the competitor leads %s after the holder's lock vanished", at.Sub(cutAt))
	case <-time.After(60 * time.Second):
		t.Fatal("the competitor does not lead within 60 s of the holder's lock vanishing")
	}
	mu.Lock()
	defer mu.Unlock()
	if !holderBegan.IsZero() {
		t.Fatalf("the holder started its job %s after its lock vanished, on a proof older than that", holderBegan.Sub(cutAt))
	}
}

// TestCutOffLeaderStepsDownDuringARenewal: the cut comes just before a renewal is sent,
// so that the renewal hangs on the partition for its whole attempt (ttl/5, 3 s). The
// leader must still step down about 750 ms after its last lock proof, not once the stuck
// renewal gives up: a server restart during the partition would let the fleet call it
// dead a lock grace after the restart. Default settings; no restart is needed to see the
// delay, only the cut.
func TestCutOffLeaderStepsDownDuringARenewal(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	ctx := testutil.Context(t, 2*time.Minute)
	proxy := netfault.NewProxy(t, db.DSN, 0)
	holder := newAgent(t, liveness.AgentConfig{Pool: pgtest.Pool(t, proxy.DSN(), 4), DirectDSN: proxy.DSN(),
		InstanceID: uuid.New(), ServiceName: "holder"})
	runAgent(t, holder)
	t.Cleanup(proxy.Close) // first, so that the holder's statements fail instead of hanging

	var mu sync.Mutex
	var ended time.Time
	leads := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	defer wg.Wait()
	electCtx, stopElect := context.WithCancel(ctx)
	defer stopElect()
	wg.Go(func() {
		_ = holder.Elect(electCtx, liveness.ElectorConfig{Lease: "job",
			OnStartedLeading: func(ctx context.Context, _ *liveness.Lease) {
				once.Do(func() { close(leads) })
				<-ctx.Done()
				mu.Lock()
				if ended.IsZero() {
					ended = time.Now()
				}
				mu.Unlock()
			}})
	})
	select {
	case <-leads:
	case <-time.After(30 * time.Second):
		t.Fatal("the holder does not lead within 30 s")
	}
	// A renewal's time is its expires_at minus the ttl (the server's clock, this host's);
	// the next comes ttl/4 after it.
	ttl := defaults.ElectorTTL
	renewedAt := func() (at time.Time) {
		if err := pool.QueryRow(ctx, `SELECT expires_at - make_interval(secs => $1) FROM liveness.leases WHERE name = 'job'`,
			ttl.Seconds()).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	first := renewedAt()
	var renewed time.Time
	testutil.Eventually(t, 30*time.Second, "the holder's lease renewed", func() bool {
		renewed = renewedAt()
		return renewed.After(first)
	})
	time.Sleep(time.Until(renewed.Add(ttl/4 - 250*time.Millisecond)))
	frozen := time.Now()
	proxy.Freeze()
	testutil.Eventually(t, 20*time.Second, "the holder's job ended", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !ended.IsZero()
	})
	mu.Lock()
	stopped := ended.Sub(frozen)
	mu.Unlock()
	t.Logf("the holder's job ended %s after the cut", stopped)
	if stopped > 1500*time.Millisecond {
		t.Fatalf("the holder's job ended %s after the cut; want about 750 ms (its last lock proof plus 3/4 of the lock grace), "+
			"not when the renewal stuck on the partition gave up", stopped)
	}
}

// TestLeaderLeadsAgainSoonAfterADatabaseRestart: a leader whose database restarts loses
// its lock, so it steps down (not alive), and its release fails while the server is away.
// Its row would then stand until it expired, a ttl after its last renewal, and nobody
// could take the lease meanwhile: its holder instance is alive again as soon as the
// server answers. The elector sends the release again until it succeeds, so the lease is
// led again within seconds of the server answering. The ttl is a minute here, so that a
// row left to expire cannot pass for that (the expiry is at least 45 s away).
func TestLeaderLeadsAgainSoonAfterADatabaseRestart(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t)
	db := pgtest.NewDBOn(t, srv)
	testdb.Migrate(t, db.DSN, defaults.Schema)
	ctx := testutil.Context(t, 2*time.Minute)
	// The agent's log, debug included, is printed when the test fails: it says whether the
	// lock, the release or the next campaign was slow.
	logger, logs := logbuf.Logger()
	pool := pgtest.Pool(t, db.DSN, 4)
	id := uuid.New()
	agent := newAgent(t, liveness.AgentConfig{Pool: pool, DirectDSN: db.DSN,
		InstanceID: id, ServiceName: "leader", Logger: logger})
	runAgent(t, agent)
	// Until a beat records the lock in the instance's row, the fleet judges the instance
	// by its heartbeat alone, and so does the leader: a lock lost then ends no leadership
	// (the instance stays alive for the stale threshold), and the lease survives the
	// restart. The first beat may have been sent before the first claim.
	testutil.Eventually(t, 30*time.Second, "the instance's row records its alive lock", func() bool {
		var holds bool
		err := pool.QueryRow(ctx, `SELECT holds_alive_lock FROM liveness.instances WHERE instance_id = $1`, id).Scan(&holds)
		return err == nil && holds
	})

	epochs := make(chan int64, 16)
	var wg sync.WaitGroup
	defer wg.Wait()
	electCtx, stopElect := context.WithCancel(ctx)
	defer stopElect()
	const ttl = time.Minute
	wg.Go(func() {
		_ = agent.Elect(electCtx, liveness.ElectorConfig{Lease: "job", TTL: ttl,
			OnStartedLeading: func(ctx context.Context, l *liveness.Lease) {
				epochs <- l.Epoch
				<-ctx.Done()
			}})
	})
	var first int64
	select {
	case first = <-epochs:
	case <-time.After(30 * time.Second):
		t.Fatal("the agent does not lead within 30 s")
	}
	if err := srv.StopMode("fast"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // away long enough for the lock to go and the release to fail
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	answered := time.Now()
	var answeredAt time.Time // on the server's clock
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&answeredAt); err != nil {
		t.Fatal(err)
	}
	// A leader cannot keep its lease across the restart: its last proof of the lock came
	// before the stop, and its trust ended three quarters of the grace after it, for good,
	// whatever beat or claim came later (the lock was gone for a second). A lease still
	// its own and renewed after the restart (a renewal puts the expiry at least a TTL past
	// the server's answer; the last one before the stop, more than a second short of it)
	// is a leadership kept across a gap in which the fleet may have called it dead.
	keptLeading := func() bool {
		var held bool
		err := pool.QueryRow(ctx, `SELECT epoch = $1 AND expires_at > $2::timestamptz + $3::interval
		                            FROM liveness.leases WHERE name = 'job'`, first, answeredAt, ttl-500*time.Millisecond).Scan(&held)
		return err == nil && held
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	deadline := time.After(40 * time.Second)
	for {
		select {
		case again := <-epochs:
			took := time.Since(answered)
			t.Logf("led again (epoch %d after %d) %s after the server answered", again, first, took.Round(time.Millisecond))
			if took > 20*time.Second {
				t.Fatalf("led again %s after the server answered; want within seconds (the relock, a release, a retry), not when the row expired\nthe agent's log:\n%s", took, logs)
			}
			return
		case <-tick.C:
			if keptLeading() {
				t.Fatalf("kept leading across the restart (epoch %d, renewed after it): its trust should have ended three "+
					"quarters of the lock grace after its last proof, before the stop\nthe agent's log:\n%s", first, logs)
			}
		case <-deadline:
			t.Fatalf("not led again within 40 s of the server answering: the lost lease's row was left to expire (ttl 1 min)\nthe agent's log:\n%s", logs)
		}
	}
}

// TestLeaderStepsDownWhenItsLockLossIsNoticedLate: the safety review's scenario, with real
// agents and a real server. Just after a verification of the leader's alive lock reaches
// the server (Q), both of the leader's links stall (Q + 40 ms: its lock session and its
// pool each go through a proxy); at Q + 60 ms the server ends the lock's backend, and the
// competitor's watcher stamps the absence at its next look; the end of the session
// reaches the leader late (the proxy delivers the FIN at Q + 0.5, 0.7 or 0.74 grace: a
// FIN held back by retransmission, a process paused just after reading it). The fleet may
// call the leader dead one grace after the loss (its pool's link still frozen, no beat
// proves its life), and the competitor then starts its job: the leader's must have
// stopped before, whenever it noticed the loss, since its trust counts from its last
// proof (Q), not from the notice. The lock's link refuses new connections for a while, so
// that the leader cannot claim its lock again in time. Default settings but the grace,
// which is also 4 s (where the old gate overlapped by most of a second).
func TestLeaderStepsDownWhenItsLockLossIsNoticedLate(t *testing.T) {
	for _, grace := range []time.Duration{defaults.LockGrace, 4 * time.Second} {
		for _, late := range []float64{0.5, 0.7, 0.74} {
			t.Run(fmt.Sprintf("grace=%s/notice=%.2fgrace", grace, late), func(t *testing.T) {
				t.Parallel()
				leaderLossNoticedLate(t, grace, late)
			})
		}
	}
}

func leaderLossNoticedLate(t *testing.T, grace time.Duration, late float64) {
	db := testdb.Migrated(t)
	ctx := testutil.Context(t, 2*time.Minute)
	admin := pgtest.Pool(t, db.DSN, 2)
	timing := liveness.Timing{LockGrace: grace}
	lockLink, poolLink := netfault.NewProxy(t, db.DSN, 0), netfault.NewProxy(t, db.DSN, 0)
	lockLink.HoldCloses = true
	leaderCfg := liveness.AgentConfig{Pool: pgtest.Pool(t, poolLink.DSN(), 4), DirectDSN: lockLink.DSN(),
		InstanceID: uuid.New(), ServiceName: "leader", Timing: timing}
	leader := newAgent(t, leaderCfg)
	runAgent(t, leader)
	t.Cleanup(lockLink.Close) // first, so that the leader's statements fail instead of hanging
	t.Cleanup(poolLink.Close)
	competitor := newAgent(t, liveness.AgentConfig{Pool: pgtest.Pool(t, db.DSN, 4), DirectDSN: db.DSN,
		InstanceID: uuid.New(), ServiceName: "competitor", Timing: timing})
	runAgent(t, competitor)

	var mu sync.Mutex
	var leaderEnded, competitorBegan time.Time
	var leaderStop error
	leads, takes, stopped := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var leadsOnce, takesOnce sync.Once
	var wg sync.WaitGroup
	defer wg.Wait()
	electCtx, stopElect := context.WithCancel(ctx)
	defer stopElect()
	wg.Go(func() {
		_ = leader.Elect(electCtx, liveness.ElectorConfig{Lease: "job",
			OnStartedLeading: func(ctx context.Context, _ *liveness.Lease) {
				leadsOnce.Do(func() { close(leads) })
				<-ctx.Done()
				mu.Lock()
				if leaderEnded.IsZero() {
					leaderEnded = time.Now()
				}
				mu.Unlock()
			},
			OnStoppedLeading: func(reason error) {
				mu.Lock()
				if leaderStop == nil {
					leaderStop = reason
					close(stopped)
				}
				mu.Unlock()
			}})
	})
	select {
	case <-leads:
	case <-time.After(30 * time.Second):
		t.Fatal("the leader does not lead within 30 s")
	}
	following := make(chan struct{})
	var followOnce sync.Once
	wg.Go(func() {
		_ = competitor.Elect(electCtx, liveness.ElectorConfig{Lease: "job",
			OnNewLeader: func(l liveness.Leader) {
				if l.InstanceID == leaderCfg.InstanceID {
					followOnce.Do(func() { close(following) })
				}
			},
			OnStartedLeading: func(ctx context.Context, _ *liveness.Lease) {
				mu.Lock()
				if competitorBegan.IsZero() {
					competitorBegan = time.Now()
				}
				mu.Unlock()
				takesOnce.Do(func() { close(takes) })
				<-ctx.Done()
			}})
	})
	select {
	case <-following:
	case <-time.After(30 * time.Second):
		t.Fatal("the competitor does not see the leader within 30 s")
	}

	// Q: a verification of the leader's lock reaching the server, seen as its backend's
	// query_start moving (the leader verifies every quarter grace).
	var lockPID int32
	if err := admin.QueryRow(ctx, `SELECT lock_pid FROM liveness.instances WHERE instance_id = $1`,
		leaderCfg.InstanceID).Scan(&lockPID); err != nil || lockPID == 0 {
		t.Fatalf("the leader's lock backend: %d, %v", lockPID, err)
	}
	conn, err := admin.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	queryStart := func() (at time.Time) {
		if err := conn.QueryRow(ctx, `SELECT query_start FROM pg_stat_activity WHERE pid = $1`, lockPID).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	first := queryStart()
	for queryStart().Equal(first) {
		time.Sleep(time.Millisecond)
	}
	q := time.Now()
	time.Sleep(time.Until(q.Add(40 * time.Millisecond)))
	// The lock's link stays bad for new connections until well past the competitor's
	// takeover, so that the leader cannot claim its lock again in time: it must step down
	// (a leader that does claim it again before its deadline is never dead by the rule,
	// and rightly leads on). Its pool's link stays frozen until then too, so that no beat
	// proves its life after the loss: the fleet calls it dead one grace after the stamp.
	lockLink.RefuseNewUntil(q.Add(3 * grace))
	lockLink.Freeze()
	poolLink.Freeze()
	time.Sleep(time.Until(q.Add(60 * time.Millisecond)))
	var ended bool
	if err := conn.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, lockPID).Scan(&ended); err != nil || !ended {
		t.Fatalf("pg_terminate_backend(%d): %v, %v", lockPID, ended, err)
	}
	time.Sleep(time.Until(q.Add(time.Duration(late * float64(grace)))))
	lockLink.Thaw()

	select {
	case <-takes:
	case <-time.After(60 * time.Second):
		t.Fatal("the competitor does not take over within 60 s")
	}
	poolLink.Thaw()
	select {
	case <-stopped: // once its release has gone through the thawed pool, or failed
	case <-time.After(30 * time.Second):
		t.Fatal("the leader's OnStoppedLeading does not run within 30 s of the thaw")
	}
	mu.Lock()
	endedAt, began, stop := leaderEnded, competitorBegan, leaderStop
	mu.Unlock()
	if endedAt.IsZero() || !endedAt.Before(began) {
		t.Fatalf("the competitor began its job %s after Q while the leader's still ran (ended: %s after Q): two job runners",
			began.Sub(q), endedAt.Sub(q))
	}
	t.Logf("the leader's job ended %s after Q (its last proof), the competitor's began %s after Q: %s apart",
		endedAt.Sub(q).Round(time.Millisecond), began.Sub(q).Round(time.Millisecond), began.Sub(endedAt).Round(time.Millisecond))
	if want := q.Add(grace * 3 / 4); endedAt.After(want.Add(grace / 4)) {
		t.Errorf("the leader's job ended %s after Q; want about three quarters of the grace (%s), whatever the notice",
			endedAt.Sub(q), grace*3/4)
	}
	var lost *liveness.LeaseLostError
	if !errors.As(stop, &lost) || lost.Reason != "not_alive" {
		t.Errorf("the leader stopped because %v; want %s", stop, "not_alive")
	}
}
