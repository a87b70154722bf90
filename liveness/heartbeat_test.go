package liveness

// These tests are in package liveness (not liveness_test) to drive the heartbeat with a
// fake clock and to reach the alive lock's own session. PostgreSQL is always real.

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/alivelock"
	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/netfault"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// fakeClock drives the heartbeat's timers by hand. Every After call is reported on
// requests, so a test sees the wait the worker chose after each beat.
type fakeClock struct {
	mu       sync.Mutex
	now      time.Time
	timers   []fakeTimer
	requests chan time.Duration
}

type fakeTimer struct {
	at time.Time
	ch chan time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), requests: make(chan time.Duration, 1000)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.mu.Lock()
	if d <= 0 {
		ch <- c.now
	} else {
		c.timers = append(c.timers, fakeTimer{at: c.now.Add(d), ch: ch})
	}
	c.mu.Unlock()
	c.requests <- d
	return ch
}

// Advance moves the clock and fires the timers that are due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	keep := c.timers[:0]
	for _, tm := range c.timers {
		if tm.at.After(c.now) {
			keep = append(keep, tm)
		} else {
			tm.ch <- c.now
		}
	}
	c.timers = keep
}

// next returns the duration of the worker's next wait, that is, what it chose after its
// latest beat.
func (c *fakeClock) next(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-c.requests:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("the heartbeat requested no timer within 10s")
		return 0
	}
}

// fakeLock is a LockSource without change notification: the worker only polls it.
type fakeLock struct{ held atomic.Bool }

func (l *fakeLock) Held() bool { return l.held.Load() }

// notifyingLock also notifies changes, as an alivelock.Lock does.
type notifyingLock struct {
	fakeLock
	mu sync.Mutex
	ch chan struct{}
}

func newNotifyingLock(held bool) *notifyingLock {
	l := &notifyingLock{ch: make(chan struct{})}
	l.held.Store(held)
	return l
}

func (l *notifyingLock) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ch
}

func (l *notifyingLock) set(v bool) {
	l.held.Store(v)
	l.mu.Lock()
	defer l.mu.Unlock()
	close(l.ch)
	l.ch = make(chan struct{})
}

// startOnFakeClock starts the worker on a fake clock of its own, which the test drives.
func startOnFakeClock(t *testing.T, cfg heartbeatConfig) (*heartbeatWorker, *fakeClock, func()) {
	t.Helper()
	clk := newFakeClock()
	cfg.clock = clk
	h, stop := startHeartbeat(t, cfg)
	return h, clk, stop
}

// TestHeartbeatCadence drives the worker with a fake clock against a real database and
// checks the wait it chooses after each beat: the cadence is resolved on every tick.
func TestHeartbeatCadence(t *testing.T) {
	t.Parallel()
	_, pool := testdb.MigratedPool(t, 4)
	const fast, slow = defaults.HeartbeatInterval, defaults.HeartbeatSlowInterval

	cases := []struct {
		name     string
		mode     Mode
		noLock   bool
		held     bool
		slowIntv time.Duration // Timing.HeartbeatSlowInterval, if not the default
		want     time.Duration // the wait after the first beat
		flipTo   *bool         // then set the lock, let the wait run out, and expect wantNext
		wantNext time.Duration
	}{
		{name: "held is slow", held: true, want: slow},
		{name: "not held is fast", held: false, want: fast},
		{name: "no lock source is fast", noLock: true, want: fast},
		{name: "table-only mode with the lock held is fast", mode: ModeHeartbeatTableOnly, held: true, want: fast},
		{name: "held then released is fast on the next tick", held: true, want: slow, flipTo: ptr(false), wantNext: fast},
		{name: "released then held is slow on the next tick", held: false, want: fast, flipTo: ptr(true), wantNext: slow},
		// stale 90s − fast 30s = 60s: the watchdog caps an 80s slow interval.
		{name: "the watchdog caps the slow interval", held: true, slowIntv: 80 * time.Second, want: 60 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lock := &fakeLock{}
			lock.held.Store(tc.held)
			cfg := testHeartbeatConfig(pool, lock)
			if tc.noLock {
				cfg.Lock = nil
			}
			if tc.mode != "" {
				cfg.Mode = tc.mode
			}
			if tc.slowIntv != 0 {
				cfg.Timing.HeartbeatSlowInterval = tc.slowIntv
			}
			h, clk, _ := startOnFakeClock(t, cfg)

			if got := clk.next(t); got != tc.want {
				t.Fatalf("after the first beat the worker waits %s, want %s", got, tc.want)
			}
			if s := h.Stats(); s.Beats != 1 || s.Interval != tc.want {
				t.Fatalf("Stats = %+v, want 1 beat at interval %s", s, tc.want)
			}
			if tc.flipTo == nil {
				return
			}
			lock.held.Store(*tc.flipTo)
			clk.Advance(tc.want)
			if got := clk.next(t); got != tc.wantNext {
				t.Fatalf("after the lock changed, the next beat chose %s, want %s", got, tc.wantNext)
			}
			if s := h.Stats(); s.Beats != 2 || s.Interval != tc.wantNext {
				t.Fatalf("Stats = %+v, want 2 beats at interval %s", s, tc.wantNext)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestHeartbeatBeatsAtOnceOnLockChange: a lock source that notifies changes makes a loss
// trigger a beat without waiting for the slow interval (the proof of life, recording
// holds_alive_lock = false), and a claim trigger one too (recording true, so that
// observers may trust the lock from then on).
func TestHeartbeatBeatsAtOnceOnLockChange(t *testing.T) {
	t.Parallel()
	ctx := testutil.Context(t, 90*time.Second)
	_, pool := testdb.MigratedPool(t, 4)
	lock := newNotifyingLock(true)
	cfg := testHeartbeatConfig(pool, lock)
	h, clk, _ := startOnFakeClock(t, cfg)
	rowHolds := func() bool {
		t.Helper()
		var b bool
		if err := pool.QueryRow(ctx, `SELECT holds_alive_lock FROM liveness.instances WHERE instance_id = $1`,
			cfg.InstanceID).Scan(&b); err != nil {
			t.Fatal(err)
		}
		return b
	}

	if got := clk.next(t); got != defaults.HeartbeatSlowInterval {
		t.Fatalf("held: the worker waits %s, want the slow %s", got, defaults.HeartbeatSlowInterval)
	}
	if !rowHolds() {
		t.Fatal("holds_alive_lock is false after a beat with the lock held")
	}
	lock.set(false) // the clock does not move: only the loss can cause a beat
	if got := clk.next(t); got != defaults.HeartbeatInterval {
		t.Fatalf("after the loss the worker waits %s, want the fast %s", got, defaults.HeartbeatInterval)
	}
	if s := h.Stats(); s.Beats != 2 {
		t.Fatalf("Beats = %d after the loss, want 2: the loss must trigger a beat at once", s.Beats)
	}
	if rowHolds() {
		t.Fatal("holds_alive_lock is still true after the loss's beat: no proof of life was recorded")
	}
	lock.set(true) // again without moving the clock
	if got := clk.next(t); got != defaults.HeartbeatSlowInterval {
		t.Fatalf("after the claim the worker waits %s, want the slow %s", got, defaults.HeartbeatSlowInterval)
	}
	if s := h.Stats(); s.Beats != 3 || !rowHolds() {
		t.Fatalf("Beats = %d, holds_alive_lock = %v after the claim; want 3 and true", s.Beats, rowHolds())
	}
}

// breakBeats makes every beat fail for real: the instances table is renamed away.
func breakBeats(t *testing.T, db *pgtest.DB) {
	t.Helper()
	db.Exec(t, `ALTER TABLE liveness.instances RENAME TO instances_away`)
}

// retriesUntilRepaired checks the waits the worker chooses after each failed beat, one
// by one, and gives the instances table back (undoing breakBeats) before the last wait
// runs out, so that the beat after it lands.
func retriesUntilRepaired(t *testing.T, db *pgtest.DB, clk *fakeClock, waits []time.Duration) {
	t.Helper()
	for i, want := range waits {
		if got := clk.next(t); got != want {
			t.Fatalf("retry %d after %s, want %s", i+1, got, want)
		}
		if i == len(waits)-1 {
			db.Exec(t, `ALTER TABLE liveness.instances_away RENAME TO instances`)
		}
		clk.Advance(want)
	}
}

// TestHeartbeatProofRetriesFast: when a beat that must prove life fails, it is retried
// every proofRetry, not after the ordinary back-off, because observers call the instance
// dead once its lock grace runs out.
func TestHeartbeatProofRetriesFast(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	lock := newNotifyingLock(true)
	cfg := testHeartbeatConfig(pool, lock)
	h, clk, _ := startOnFakeClock(t, cfg)
	if got := clk.next(t); got != defaults.HeartbeatSlowInterval {
		t.Fatalf("held: the worker waits %s, want the slow %s", got, defaults.HeartbeatSlowInterval)
	}
	breakBeats(t, db)
	lock.set(false)
	retriesUntilRepaired(t, db, clk, []time.Duration{proofRetry, proofRetry, proofRetry})
	if got := clk.next(t); got != defaults.HeartbeatInterval {
		t.Fatalf("after the proof landed the worker waits %s, want the fast %s", got, defaults.HeartbeatInterval)
	}
	if s := h.Stats(); s.Failures != 3 || s.Beats != 2 {
		t.Fatalf("Stats = %+v, want 3 failures and 2 beats", s)
	}
}

// TestHeartbeatRetriesFailedBeat breaks the upsert for real (the table is renamed away)
// and checks that retries come well before a full interval, backing off to a cap below
// the fast interval, and that the cadence resumes once the table is back.
func TestHeartbeatRetriesFailedBeat(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	breakBeats(t, db)
	lock := &fakeLock{}
	lock.held.Store(true)
	cfg := testHeartbeatConfig(pool, lock)
	h, clk, _ := startOnFakeClock(t, cfg)

	// fast 30s: the first retry after min(30s/4, 5s), doubling, capped at 30s/2.
	retriesUntilRepaired(t, db, clk, []time.Duration{5 * time.Second, 10 * time.Second, 15 * time.Second, 15 * time.Second})
	if got := clk.next(t); got != defaults.HeartbeatSlowInterval {
		t.Fatalf("after recovering the worker waits %s, want the slow %s", got, defaults.HeartbeatSlowInterval)
	}
	if s := h.Stats(); s.Failures != 4 || s.Beats != 1 {
		t.Fatalf("Stats = %+v, want 4 failures and 1 beat", s)
	}
}

// TestHeartbeatRow checks what a beat writes: the row's fields, started_at kept across
// beats, last_heartbeat_at from the database clock (the worker's own clock says 2000),
// and Remove deleting the row.
func TestHeartbeatRow(t *testing.T) {
	t.Parallel()
	ctx := testutil.Context(t, 90*time.Second)
	_, pool := testdb.MigratedPool(t, 4)
	cfg := testHeartbeatConfig(pool, nil)
	cfg.Mode = ModeHeartbeatTableOnly
	cfg.HostName, cfg.ProcessID = "host-a", 4242
	cfg.Metadata = map[string]any{"version": "1.2.3"}

	var before time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	h, clk, stop := startOnFakeClock(t, cfg)
	clk.next(t)
	clk.Advance(defaults.HeartbeatInterval)
	clk.next(t)
	stop()

	var (
		service, host, mode, meta string
		pid                       int
		started, last, after      time.Time
	)
	err := pool.QueryRow(ctx, `SELECT service_name, host_name, process_id, liveness_mode, metadata::text,
	                                  started_at, last_heartbeat_at, now()
	                             FROM liveness.instances WHERE instance_id = $1`, cfg.InstanceID).
		Scan(&service, &host, &pid, &mode, &meta, &started, &last, &after)
	if err != nil {
		t.Fatal(err)
	}
	if service != "svc" || host != "host-a" || pid != 4242 || mode != string(ModeHeartbeatTableOnly) || meta != `{"version": "1.2.3"}` {
		t.Fatalf("row = %q %q %d %q %s", service, host, pid, mode, meta)
	}
	s := h.Stats()
	if s.Beats != 2 || !s.LastBeat.Equal(last) {
		t.Fatalf("Stats = %+v; want 2 beats and LastBeat = the row's last_heartbeat_at %s", s, last)
	}
	if !started.Before(last) {
		t.Fatalf("started_at %s is not before last_heartbeat_at %s: the second beat overwrote it", started, last)
	}
	if last.Before(before) || last.After(after) {
		t.Fatalf("last_heartbeat_at %s is outside the database's [%s, %s]", last, before, after)
	}

	if err := h.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM liveness.instances`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows (%v) after Remove, want 0", n, err)
	}
}

// TestHeartbeatWritesPerHour simulates an hour at the agent's default timing, one
// instance per database and mode, both holding a real alive lock, and counts the
// heartbeat statements in pg_stat_statements: one write per slow interval with the lock
// in advisory-lock mode, one per fast interval in table-only mode.
func TestHeartbeatWritesPerHour(t *testing.T) {
	ctx := testutil.Context(t, 90*time.Second)
	writes := map[Mode]int64{}
	for _, mode := range []Mode{ModeAdvisoryLockWhenAvailable, ModeHeartbeatTableOnly} {
		db, pool := testdb.MigratedPool(t, 4)
		db.Exec(t, `CREATE EXTENSION pg_stat_statements`)
		lock := startAliveLock(t, alivelock.DirectConfig{DSN: db.DSN, InstanceID: uuid.New(), ServiceName: "svc"})
		testutil.Eventually(t, 5*time.Second, "the alive lock is held", lock.Held)

		cfg := testHeartbeatConfig(pool, lock)
		cfg.InstanceID = uuid.New()
		cfg.Mode = mode
		_, clk, stop := startOnFakeClock(t, cfg)
		for elapsed := time.Duration(0); ; {
			d := clk.next(t)
			if elapsed+d > time.Hour {
				break
			}
			elapsed += d
			clk.Advance(d)
		}
		stop()
		if !lock.Held() {
			t.Fatalf("%s: the alive lock was lost during the simulated hour", mode)
		}
		var n int64
		err := pool.QueryRow(ctx, `SELECT coalesce(sum(s.calls), 0)::bigint
		                             FROM pg_stat_statements s
		                            WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		                              AND s.query LIKE '%/* pg_liveness:heartbeat */%'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		writes[mode] = n
	}
	lockMode, tableOnly := writes[ModeAdvisoryLockWhenAvailable], writes[ModeHeartbeatTableOnly]
	t.Logf("heartbeat writes in a simulated hour: %d with the lock held, %d in table-only mode", lockMode, tableOnly)
	// The first beat at once, then one per slow interval with the lock held and one per
	// interval without it. The two differ, so a worker that ignores the lock fails.
	fast, slow := defaults.HeartbeatInterval, defaults.HeartbeatSlowInterval
	if slow <= fast {
		t.Fatalf("the default slow interval %s is not longer than the interval %s: this test shows nothing", slow, fast)
	}
	wantLock, wantTable := 1+int64(time.Hour/slow), 1+int64(time.Hour/fast)
	if lockMode != wantLock || tableOnly != wantTable {
		t.Fatalf("writes = %d (lock held) and %d (table-only), want %d and %d", lockMode, tableOnly, wantLock, wantTable)
	}
}

// TestTimingCheck: nonsense timing is refused, naming the field (as an Agent names it).
func TestTimingCheck(t *testing.T) {
	good := Timing{HeartbeatInterval: 30 * time.Second, HeartbeatSlowInterval: 60 * time.Second, StaleThreshold: 90 * time.Second}
	if err := checkTiming(timingWithDefaults(good), "AgentConfig.Timing"); err != nil {
		t.Fatalf("the default timing is refused: %v", err)
	}
	cases := []struct {
		name string
		edit func(*Timing)
		want string
	}{
		{"slow below fast", func(c *Timing) { c.HeartbeatSlowInterval = 10 * time.Second },
			"AgentConfig.Timing.HeartbeatSlowInterval (10s) must not be below AgentConfig.Timing.HeartbeatInterval (30s)"},
		{"negative interval", func(c *Timing) { c.HeartbeatInterval = -time.Second },
			"AgentConfig.Timing.HeartbeatInterval (-1s) must be positive"},
		{"negative slow interval", func(c *Timing) { c.HeartbeatSlowInterval = -time.Second },
			"AgentConfig.Timing.HeartbeatSlowInterval (-1s) must be positive"},
		{"stale below slow", func(c *Timing) { c.StaleThreshold = 50 * time.Second },
			"AgentConfig.Timing.StaleThreshold (50s) must not be below AgentConfig.Timing.HeartbeatSlowInterval (1m0s)"},
		{"stale equal to fast", func(c *Timing) {
			c.HeartbeatInterval, c.HeartbeatSlowInterval, c.StaleThreshold = 30*time.Second, 30*time.Second, 30*time.Second
		}, "AgentConfig.Timing.StaleThreshold (30s) must be above AgentConfig.Timing.HeartbeatInterval (30s)"},
		{"dead cutoff within slow plus stale", func(c *Timing) { c.DefinitiveDeadCutoff = 150 * time.Second },
			"AgentConfig.Timing.DefinitiveDeadCutoff (2m30s) must be above AgentConfig.Timing.HeartbeatSlowInterval (1m0s) plus AgentConfig.Timing.StaleThreshold (1m30s)"},
		{"negative lock grace", func(c *Timing) { c.LockGrace = -time.Second }, "AgentConfig.Timing.LockGrace (-1s)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.edit(&c)
			err := checkTiming(timingWithDefaults(c), "AgentConfig.Timing")
			if err == nil || !strings.HasPrefix(err.Error(), "liveness: "+tc.want) {
				t.Fatalf("check() = %v, want an error starting %q", err, tc.want)
			}
			if _, err := newHeartbeatWorker(heartbeatConfig{InstanceID: uuid.New(), ServiceName: "svc", Timing: c}); err == nil {
				t.Fatal("newHeartbeatWorker accepted what check refuses")
			}
		})
	}
	for name, edit := range map[string]func(*heartbeatConfig){
		"Mode":        func(c *heartbeatConfig) { c.Mode = "lock-only" },
		"InstanceID":  func(c *heartbeatConfig) { c.InstanceID = uuid.Nil },
		"ServiceName": func(c *heartbeatConfig) { c.ServiceName = " " },
	} {
		c := heartbeatConfig{InstanceID: uuid.New(), ServiceName: "svc", Timing: good}
		edit(&c)
		if err := c.validate(); err == nil || !strings.Contains(err.Error(), "heartbeatConfig."+name) {
			t.Errorf("validate() = %v, want an error naming heartbeatConfig.%s", err, name)
		}
	}
	if _, err := newHeartbeatWorker(heartbeatConfig{InstanceID: uuid.New(), ServiceName: "svc"}); err == nil || !strings.Contains(err.Error(), "Pool") {
		t.Fatalf("newHeartbeatWorker without a pool = %v, want an error naming Pool", err)
	}
}

// TestHeartbeatBeatGivenUpOnNeverLandsLater: a beat the worker gave up on (its answer
// did not come within its deadline) carries that deadline to the server, and writes
// nothing if it gets there later, so that it cannot put back what a newer beat corrected.
// Here the link is cut (new connections refused, so that pgx's cancel request is lost
// too) while a beat that records the lock as held is on its way; the worker gives it up,
// and the cut heals, delivering it to the server after its deadline. It must not write:
// a row that claims a lock the process may no longer hold makes it dead a grace later.
func TestHeartbeatBeatGivenUpOnNeverLandsLater(t *testing.T) {
	t.Parallel()
	db, _ := testdb.MigratedPool(t, 2)
	link := netfault.NewProxy(t, db.DSN, 0)
	t.Cleanup(link.Close)
	pool := pgtest.Pool(t, link.DSN(), 1)
	lock := newNotifyingLock(false)
	cfg := testHeartbeatConfig(pool, lock)
	cfg.Timing = Timing{HeartbeatInterval: time.Second} // a beat's deadline: 500 ms
	h, clk, _ := startOnFakeClock(t, cfg)
	clk.next(t) // the first beat landed: the worker knows the server's clock
	rowHolds := func() bool {
		return db.QueryInt(t, `SELECT holds_alive_lock::int FROM liveness.instances WHERE instance_id = $1`, cfg.InstanceID) == 1
	}
	if rowHolds() {
		t.Fatal("the first beat, without the lock, recorded it held")
	}
	link.Freeze()
	link.RefuseNewUntil(time.Now().Add(time.Hour))
	lock.set(true) // the claim's beat is held by the cut link
	testutil.Eventually(t, 10*time.Second, "the worker giving the beat up", func() bool { return h.Stats().Failures >= 1 })
	link.Thaw() // the held beat reaches the server, after its deadline
	// The session that carried it reads it, runs it, and then the close that followed it.
	testutil.Eventually(t, 10*time.Second, "the held beat delivered and its session ended", func() bool {
		return db.QueryInt(t, `SELECT count(*) FROM pg_stat_activity
		                        WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE '%pg_liveness:heartbeat%'`) == 0
	})
	if rowHolds() {
		t.Fatal("a beat the worker had given up on landed after its deadline")
	}
}

// TestHeartbeatProofGivesUpAStuckConnection: a beat that proves life (the lock is gone,
// the row still claims it) has a third of the lock grace, not the ordinary beat's
// deadline, and the next attempt follows at once: after a network cut heals, a pooled
// connection from before it can stay stuck in the kernel's retransmission back-off for
// seconds, while a new one gets through. Observers call the process dead a grace after
// its lock vanished; the proof must not wait out a stuck connection.
func TestHeartbeatProofGivesUpAStuckConnection(t *testing.T) {
	t.Parallel()
	db, _ := testdb.MigratedPool(t, 2)
	link := netfault.NewProxy(t, db.DSN, 0)
	t.Cleanup(link.Close)
	pool := pgtest.Pool(t, link.DSN(), 2)
	t.Cleanup(link.Thaw) // before the pool closes, so that the stuck connection's close goes through
	lock := newNotifyingLock(true)
	cfg := testHeartbeatConfig(pool, lock) // the defaults: a beat's deadline 10 s, the grace 1 s
	h, clk, _ := startOnFakeClock(t, cfg)
	if got := clk.next(t); got != defaults.HeartbeatSlowInterval {
		t.Fatalf("held: the worker waits %s, want the slow %s", got, defaults.HeartbeatSlowInterval)
	}
	link.FreezeEstablished() // the pool's connection is stuck; a new one gets through
	began := time.Now()
	lock.set(false)
	if got := clk.next(t); got != 0 {
		t.Fatalf("after the proof's attempt on the stuck connection the worker waits %s; want 0 (its deadline was the wait)", got)
	}
	if got := clk.next(t); got != defaults.HeartbeatInterval {
		t.Fatalf("after the proof the worker waits %s; want the fast %s (the proof landed)", got, defaults.HeartbeatInterval)
	}
	took := time.Since(began)
	t.Logf("the proof landed %s after the loss, one attempt given up", took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("the proof landed %s after the loss; want well within the ordinary beat's deadline (10 s)", took)
	}
	if s := h.Stats(); s.Failures != 1 || s.Beats != 2 {
		t.Errorf("Stats = %+v; want 1 failure (the stuck attempt) and 2 beats", s)
	}
	if db.QueryInt(t, `SELECT holds_alive_lock::int FROM liveness.instances WHERE instance_id = $1`, cfg.InstanceID) != 0 {
		t.Error("the row still claims the lock after the proof")
	}
}
