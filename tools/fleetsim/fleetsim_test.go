package fleetsim_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
	"github.com/pg-liveness/pg_liveness_exporter/tools/fleetsim"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const stale = 2 * time.Second

// testConfig is a fleet with short timings: a fast beat of 200ms, a stale threshold of
// 2s, so that "at once" (well under a second) and "after the stale threshold" differ.
func testConfig(db *pgtest.DB, services ...string) fleetsim.Config {
	return fleetsim.Config{
		DSN: db.DSN, Schema: defaults.Schema, ApplyMigrations: true,
		Services:          services,
		HeartbeatInterval: 200 * time.Millisecond, HeartbeatSlowInterval: 500 * time.Millisecond,
		StaleThreshold: stale, VerifyInterval: 100 * time.Millisecond,
		LeaseTTL: time.Second, JobDuration: 200 * time.Millisecond, JobPause: 100 * time.Millisecond,
		MaxConns: 3,
	}
}

func start(t *testing.T, cfg fleetsim.Config) *fleetsim.Fleet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f, err := fleetsim.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Stop)
	return f
}

func statuses(t *testing.T, f *fleetsim.Fleet) []fleetsim.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := f.Statuses(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// queryOne runs a query of one value on pool and returns it.
func queryOne[T any](t *testing.T, pool *pgxpool.Pool, sql string, args ...any) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var v T
	if err := pool.QueryRow(ctx, sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

func TestKillAndHang(t *testing.T) {
	db := pgtest.NewDB(t)
	cfg := testConfig(db, "svc-a", "svc-b")
	cfg.Instances, cfg.HeartbeatOnly = 5, 1 // 0 heartbeat-only; 1, 2 stay alive; 3 hangs; 4 dies
	cfg.Leases = nil
	f := start(t, cfg)
	pool := db.Pool(t, 2)

	testutil.Eventually(t, 5*time.Second, "every instance has a row and every lock instance its lock", func() bool {
		for _, s := range statuses(t, f) {
			if !s.Row || s.LockHeld != s.AliveLock {
				return false
			}
		}
		return true
	})
	locks := queryOne[int](t, pool, `SELECT count(*) FROM liveness.instance_alive_locks`)
	if locks != 4 {
		t.Fatalf("instance_alive_locks has %d rows, want the 4 lock-holding instances", locks)
	}
	s0 := statuses(t, f)[0]
	if s0.Mode != liveness.ModeHeartbeatTableOnly || s0.LockHeld || !s0.Alive() {
		t.Fatalf("heartbeat-only instance: %+v, want alive by heartbeat, no lock", s0)
	}
	mode := ""
	if err := pool.QueryRow(context.Background(), `SELECT liveness_mode FROM liveness.instances WHERE instance_id = $1`, s0.ID).Scan(&mode); err != nil || mode != string(liveness.ModeHeartbeatTableOnly) {
		t.Fatalf("heartbeat-only instance's row: mode %q, err %v", mode, err)
	}

	// Kill: the lock goes at once, the row stays, and with no proof of life the instance
	// is dead once its lock grace has run out (the heartbeat is still fresh).
	if err := f.Kill(4); err != nil {
		t.Fatal(err)
	}
	killed := f.Instances()[4]
	testutil.Eventually(t, time.Second, "killed instance's lock released at once", func() bool {
		return !statuses(t, f)[4].LockHeld
	})
	if s := statuses(t, f)[4]; !s.Row || (s.Observed != liveness.StateLockLost && s.Observed != liveness.StateStale) {
		t.Fatalf("killed instance right after the kill: %+v; want lock_lost (within its grace) or stale, "+
			"never heartbeat_only: a dead process proves no life", s)
	}
	if err := f.Hang(3); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, stale+2*time.Second, "killed instance not alive after the stale threshold", func() bool {
		return !queryOne[bool](t, pool, `SELECT liveness.is_instance_alive($1, $2)`, killed.ID, int(stale.Seconds()))
	})

	// Hang: by now the hung instance's heartbeat has aged too, but its lock holds.
	testutil.Eventually(t, stale+2*time.Second, "hung instance's heartbeat past the stale threshold", func() bool {
		return statuses(t, f)[3].HeartbeatAge > stale
	})
	st := statuses(t, f)
	if h := st[3]; h.State != fleetsim.Hung || !h.LockHeld || !h.Alive() || h.Observed != liveness.StateLockOnly {
		t.Fatalf("hung instance: %+v; want lock held, alive by the lock, lock_only", h)
	}
	if k := st[4]; k.State != fleetsim.Killed || !k.Row || k.LockHeld || k.Alive() || k.Observed != liveness.StateStale {
		t.Fatalf("killed instance: %+v; want its row left behind, no lock, stale", k)
	}
	for _, i := range []int{0, 1, 2} {
		if s := st[i]; !s.Alive() || s.HeartbeatAge >= stale {
			t.Fatalf("instance %d should be untouched by the faults: %+v", i, s)
		}
	}
	if err := f.Kill(3); err == nil {
		t.Fatal("Kill of a hung instance succeeded; want an error: it is not running")
	}
	if err := f.Hang(9); err == nil {
		t.Fatal("Hang(9) on a fleet of 5 succeeded; want an error")
	}
}

// Every job run is recorded in the database with the lease's epoch, from its start to its
// end by the database clock; no two runs of one lease may overlap.
func TestLeasedJobsRunOnOneInstanceAtATime(t *testing.T) {
	db := pgtest.NewDB(t)
	db.Exec(t, `CREATE TABLE job_runs (lease text, epoch bigint, instance int,
		started_at timestamptz NOT NULL DEFAULT clock_timestamp(), ended_at timestamptz)`)
	jobs := db.Pool(t, 4)
	cfg := testConfig(db, "jobs")
	cfg.Instances, cfg.HeartbeatOnly = 4, 1
	cfg.Leases = []string{"cleanup", "alerts"}
	cfg.Job = func(ctx context.Context, inst fleetsim.Instance, self *liveness.Lease) error {
		if _, err := jobs.Exec(ctx, `INSERT INTO job_runs (lease, epoch, instance) VALUES ($1, $2, $3)`, self.Name, self.Epoch, inst.Index); err != nil {
			return err
		}
		time.Sleep(time.Duration(20+rand.IntN(80)) * time.Millisecond)
		_, err := jobs.Exec(ctx, `UPDATE job_runs SET ended_at = clock_timestamp()
			WHERE lease = $1 AND epoch = $2`, self.Name, self.Epoch)
		return err
	}
	f := start(t, cfg)
	pool := db.Pool(t, 2)
	testutil.Eventually(t, 15*time.Second, "each lease run at least 6 times, on at least 2 instances", func() bool {
		return queryOne[int](t, pool, `SELECT count(*) FROM (SELECT lease FROM job_runs WHERE ended_at IS NOT NULL
			GROUP BY lease HAVING count(*) >= 6 AND count(DISTINCT instance) >= 2) x`) == 2
	})
	f.Stop()

	if n := queryOne[int](t, pool, `SELECT count(*) FROM job_runs a JOIN job_runs b
		ON a.lease = b.lease AND a.ctid < b.ctid
		AND tstzrange(a.started_at, coalesce(a.ended_at, 'infinity')) && tstzrange(b.started_at, coalesce(b.ended_at, 'infinity'))`); n != 0 {
		t.Fatalf("%d pairs of runs of one lease overlapped", n)
	}
	if n := queryOne[int](t, pool, `SELECT count(*) FROM job_runs a JOIN job_runs b
		ON a.lease = b.lease AND a.epoch < b.epoch AND a.started_at > b.started_at`); n != 0 {
		t.Fatalf("%d pairs of runs where a later run has a smaller epoch", n)
	}
	if n := queryOne[int](t, pool, `SELECT count(*) FROM liveness.leases`); n != 0 {
		t.Fatalf("%d leases left after Stop; want every lease released", n)
	}
}

// lead is an instance's start of leadership of a lease.
type lead struct {
	index int
	self  *liveness.Lease
}

// startLeaders starts three instances holding their alive locks, campaigning for lease
// with a ttl, each leading until its leadership ends. It returns the fleet, the first
// leader, and the leaders that follow.
func startLeaders(t *testing.T, db *pgtest.DB, service, lease string, ttl time.Duration) (*fleetsim.Fleet, lead, <-chan lead) {
	t.Helper()
	cfg := testConfig(db, service)
	cfg.Instances, cfg.HeartbeatOnly = 3, 0
	cfg.Leases = []string{lease}
	cfg.LeaseTTL = ttl
	leads := make(chan lead, 16)
	cfg.Job = func(ctx context.Context, inst fleetsim.Instance, self *liveness.Lease) error {
		leads <- lead{inst.Index, self}
		<-ctx.Done()
		return nil
	}
	f := start(t, cfg)
	select {
	case first := <-leads:
		return f, first, leads
	case <-time.After(10 * time.Second):
		t.Fatal("no instance took the lease within 10s")
		return nil, lead{}, nil
	}
}

// nextLeader waits for the leader after first, which must be another instance with a
// higher epoch.
func nextLeader(t *testing.T, leads <-chan lead, first lead, within time.Duration) lead {
	t.Helper()
	select {
	case next := <-leads:
		if next.index == first.index || next.self.Epoch <= first.self.Epoch {
			t.Fatalf("takeover by instance %d with epoch %d; want another instance and an epoch above %d", next.index, next.self.Epoch, first.self.Epoch)
		}
		return next
	case <-time.After(within):
		t.Fatalf("nobody took the lease over within %s", within)
		return lead{}
	}
}

// A killed holder does not release its lease: its row stays, and another instance takes
// it over with a new epoch as soon as the holder is dead by the verdict (its lock gone,
// no proof of life within the grace), before the row would have expired.
func TestKilledHolderLeaseIsTakenOverBeforeItExpires(t *testing.T) {
	db := pgtest.NewDB(t)
	// A ttl far longer than the verdict needs.
	f, first, leads := startLeaders(t, db, "takeover", "uptime-runner", 20*time.Second)
	if err := f.Kill(first.index); err != nil {
		t.Fatal(err)
	}
	if n := queryOne[int](t, db.Pool(t, 2), `SELECT count(*) FROM liveness.leases WHERE name = 'uptime-runner' AND epoch = $1 AND expires_at > now()`, first.self.Epoch); n != 1 {
		t.Fatal("the killed holder's lease row is gone or expired right after the kill; want it left behind")
	}
	// Both times are the database's.
	if next := nextLeader(t, leads, first, 15*time.Second); !next.self.TakenAt.Before(first.self.ExpiresAt()) {
		t.Fatalf("taken over at %s, not before the killed holder's lease expired (%s)", next.self.TakenAt, first.self.ExpiresAt())
	}
}

// A hung holder's sessions stay open, so it stays alive by the verdict (its lock is
// held) and nobody may take its lease before the row expires; once it has, another
// instance takes over with a new epoch.
func TestHungHolderLeaseIsTakenOverOnceItExpires(t *testing.T) {
	db := pgtest.NewDB(t)
	const ttl = 3 * time.Second
	f, first, leads := startLeaders(t, db, "hung-holder", "cleanup", ttl)
	if err := f.Hang(first.index); err != nil {
		t.Fatal(err)
	}
	// Nothing the hung holder sends reaches the server any more: this expiry is final.
	var expires time.Time
	if err := db.Pool(t, 2).QueryRow(context.Background(), `SELECT expires_at FROM liveness.leases WHERE name = 'cleanup' AND epoch = $1`,
		first.self.Epoch).Scan(&expires); err != nil {
		t.Fatalf("the hung holder's lease row: %v", err)
	}
	if next := nextLeader(t, leads, first, ttl+10*time.Second); next.self.TakenAt.Before(expires) {
		t.Fatalf("taken over at %s, before the hung holder's lease expired (%s): it was alive by its lock", next.self.TakenAt, expires)
	}
	if s := statuses(t, f)[first.index]; !s.LockHeld || !s.Alive() {
		t.Fatalf("hung holder: %+v; want its lock still held and alive by it", s)
	}
}

// Stop removes the rows of instances that did not die (a hung one included), and leaves
// no connection behind;
// while running, each instance uses at most its pool plus its alive lock's connection,
// and the fleet its own pool.
func TestStopLeavesNoConnections(t *testing.T) {
	db := pgtest.NewDB(t)
	service := "conns-" + uuid.NewString()[:8]
	cfg := testConfig(db, service)
	cfg.Instances, cfg.HeartbeatOnly = 4, 1
	cfg.Leases = []string{"cleanup", "alerts", "mail-checks", "uptime-runner"}
	f := start(t, cfg)
	pool := db.Pool(t, 1)
	const conns = `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = ANY($1)`
	names := []string{fleetsim.PoolApplicationName, service + ":alive-lock"}

	testutil.Eventually(t, 5*time.Second, "three alive locks", func() bool {
		return queryOne[int](t, pool, `SELECT count(*) FROM liveness.instance_alive_locks`) == 3
	})
	if err := f.Kill(3); err != nil {
		t.Fatal(err)
	}
	// Three live instances' pools, two alive locks (instance 0 has none), the fleet's pool.
	want := 3*int(cfg.MaxConns) + 2 + int(cfg.MaxConns)
	n := 0
	if !testutil.Never(t, 500*time.Millisecond, fmt.Sprintf("more than %d connections: 3 instances' pools of %d, 2 alive locks and the fleet's pool", want, cfg.MaxConns),
		func() bool { n = queryOne[int](t, pool, conns, names); return n > want }) {
		t.Fatalf("the fleet has %d connections", n)
	}
	// A hung instance's frozen sessions are closed too, and it removes its row.
	if err := f.Hang(2); err != nil {
		t.Fatal(err)
	}
	// Hung through a few of its fast beats (200 ms), so that Stop meets sessions frozen
	// in the middle of their work.
	time.Sleep(500 * time.Millisecond)
	f.Stop()
	testutil.Eventually(t, 10*time.Second, "no connection of the fleet left", func() bool {
		return queryOne[int](t, pool, conns, names) == 0
	})
	killed := f.Instances()[3].ID
	if n := queryOne[int](t, pool, `SELECT count(*) FROM liveness.instances WHERE instance_id <> $1`, killed); n != 0 {
		t.Fatalf("%d rows of stopped instances left; want them removed", n)
	}
	if n := queryOne[int](t, pool, `SELECT count(*) FROM liveness.instances WHERE instance_id = $1`, killed); n != 1 {
		t.Fatal("the killed instance's row is gone; want it left for the reaper")
	}
	f.Stop() // a second Stop is a no-op
}
