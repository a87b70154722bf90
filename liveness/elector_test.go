package liveness_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/netfault"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// leadership records, for one campaign, when each leadership started and ended.
type leadership struct {
	mu    sync.Mutex
	spans []span
	stops []error
}

type span struct {
	epoch      int64
	start, end time.Time
}

func (l *leadership) config(lease string, ttl time.Duration) liveness.ElectorConfig {
	return liveness.ElectorConfig{
		Lease: lease, TTL: ttl, RetryPeriod: 100 * time.Millisecond,
		OnStartedLeading: func(ctx context.Context, self *liveness.Lease) {
			l.mu.Lock()
			i := len(l.spans)
			l.spans = append(l.spans, span{epoch: self.Epoch, start: time.Now()})
			l.mu.Unlock()
			<-ctx.Done()
			l.mu.Lock()
			l.spans[i].end = time.Now()
			l.mu.Unlock()
		},
		OnStoppedLeading: func(reason error) {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.stops = append(l.stops, reason)
		},
	}
}

func (l *leadership) snapshot() ([]span, []error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]span(nil), l.spans...), append([]error(nil), l.stops...)
}

// startAgent runs an agent whose every connection (pool and alive lock) goes through a
// proxy that the test can cut, like a process that dies: the server ends its sessions at
// once and it can reach nothing any more. It returns the agent and the proxy.
func startCuttableAgent(t *testing.T, db *pgtest.DB, service string) (*liveness.Agent, *netfault.Proxy) {
	t.Helper()
	proxy := netfault.NewProxy(t, db.DSN, 0)
	t.Cleanup(proxy.Close)
	pool := pgtest.Pool(t, proxy.DSN(), 3)
	cfg := agentConfig(db, pool)
	cfg.DirectDSN = proxy.DSN()
	cfg.ServiceName = service
	cfg.Reaper = false
	cfg.Timing = liveness.Timing{HeartbeatInterval: time.Second, HeartbeatSlowInterval: 2 * time.Second,
		StaleThreshold: 30 * time.Second, DefinitiveDeadCutoff: time.Minute}
	a := newAgent(t, cfg)
	runAgent(t, a) // holds its lock and beat
	return a, proxy
}

// TestElectorTakesOverFromADeadLeaderBeforeTheTTL: a leader whose process dies (every
// connection cut) stops leading on its own within its lock grace, and another process
// leads well before the 30 s ttl, once the leader is dead by the one verdict; the two
// leaderships never overlap and their epochs increase.
func TestElectorTakesOverFromADeadLeaderBeforeTheTTL(t *testing.T) {
	t.Parallel()
	db, migratedPool := testdb.MigratedPool(t, 2)
	a1, cut := startCuttableAgent(t, db, "elector-a")
	a2, _ := startCuttableAgent(t, db, "elector-b")

	const ttl = 30 * time.Second
	var l1, l2 leadership
	ctx, stop := context.WithTimeout(context.Background(), time.Minute)
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() { _ = a1.Elect(ctx, l1.config("job", ttl)) })
	testutil.Eventually(t, 10*time.Second, "a1 leads", func() bool { s, _ := l1.snapshot(); return len(s) == 1 })
	var seen []liveness.Leader
	var seenMu sync.Mutex
	c2 := l2.config("job", ttl)
	c2.OnNewLeader = func(l liveness.Leader) { seenMu.Lock(); seen = append(seen, l); seenMu.Unlock() }
	wg.Go(func() { _ = a2.Elect(ctx, c2) })
	testutil.Eventually(t, 5*time.Second, "a2 sees a1 leading", func() bool {
		seenMu.Lock()
		defer seenMu.Unlock()
		return len(seen) > 0 && seen[0].InstanceID == a1.Snapshot().InstanceID
	})

	reader, err := liveness.NewReader(liveness.ReaderConfig{DB: migratedPool})
	if err != nil {
		t.Fatal(err)
	}
	if leader, err := reader.Leader(ctx, "job"); err != nil || leader.InstanceID != a1.Snapshot().InstanceID {
		t.Fatalf("Reader.Leader = %+v, %v; want a1 (%s)", leader, err, a1.Snapshot().InstanceID)
	}

	cutAt := time.Now()
	cut.Close() // a1's process "dies": its sessions end, it reaches nothing
	testutil.Eventually(t, 15*time.Second, "a2 leads", func() bool { s, _ := l2.snapshot(); return len(s) == 1 })
	s1, stops1 := l1.snapshot()
	s2, _ := l2.snapshot()
	if s1[0].end.IsZero() {
		t.Fatal("a2 leads while a1 still leads: two leaders")
	}
	if !s1[0].end.Before(s2[0].start) {
		t.Fatalf("a1 stopped leading at %s, after a2 started at %s: two leaders",
			s1[0].end.Sub(cutAt), s2[0].start.Sub(cutAt))
	}
	if took := s2[0].start.Sub(cutAt); took > ttl/3 {
		t.Fatalf("takeover took %s; want far below the %s ttl", took, ttl)
	}
	if s2[0].epoch <= s1[0].epoch {
		t.Fatalf("epochs %d then %d: want increasing", s1[0].epoch, s2[0].epoch)
	}
	if len(stops1) != 1 || !errors.Is(stops1[0], liveness.ErrLeaseLost) {
		t.Fatalf("a1's OnStoppedLeading reasons %v; want one lost lease", stops1)
	}
	var lost *liveness.LeaseLostError
	if errors.As(stops1[0], &lost) && lost.Reason != "not_alive" {
		t.Fatalf("a1 stopped because %s; want %s (it could not prove life)", lost.Reason, "not_alive")
	}
	if leader, err := reader.Leader(ctx, "job"); err != nil || leader.InstanceID != a2.Snapshot().InstanceID || leader.Epoch != s2[0].epoch {
		t.Fatalf("Reader.Leader = %+v, %v; want a2 at epoch %d", leader, err, s2[0].epoch)
	}
	t.Logf("a1 stopped leading %s after the cut; a2 led %s after it", s1[0].end.Sub(cutAt).Round(time.Millisecond),
		s2[0].start.Sub(cutAt).Round(time.Millisecond))
	stop()
	wg.Wait()
	// Stopping the campaign releases the lease: nobody leads.
	if _, err := reader.Leader(context.Background(), "job"); !errors.Is(err, liveness.ErrNoLeader) {
		t.Fatalf("after the campaigns ended Reader.Leader says %v; want ErrNoLeader", err)
	}
}

// TestElectorConfigErrorsNameTheField: a library has no flags, so its errors name the
// configuration field. Elect refuses such a configuration before it campaigns, so the
// agent need not run.
func TestElectorConfigErrorsNameTheField(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 2)
	agent := newAgent(t, defaultAgentConfig(db, pool, "elector-config"))
	ctx := testutil.Context(t, 10*time.Second)
	noop := func(context.Context, *liveness.Lease) {}
	for _, tc := range []struct {
		cfg   liveness.ElectorConfig
		field string
	}{
		{liveness.ElectorConfig{OnStartedLeading: noop}, "ElectorConfig.Lease"},
		{liveness.ElectorConfig{Lease: "x"}, "ElectorConfig.OnStartedLeading"},
		{liveness.ElectorConfig{Lease: "x", OnStartedLeading: noop, TTL: time.Millisecond}, "ElectorConfig.TTL"},
		{liveness.ElectorConfig{Lease: "x", OnStartedLeading: noop, RetryPeriod: -1}, "ElectorConfig.RetryPeriod"},
	} {
		var ce *liveness.ConfigError
		if err := agent.Elect(ctx, tc.cfg); !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("Elect(%+v) = %v; want a *ConfigError for %s", tc.cfg, err, tc.field)
		}
	}
}

// TestLostLeaseIsNotACancellation: when a lease is lost while its job runs, Leases.Run's
// error is the loss, recognisable with errors.Is(err, ErrLeaseLost), and not
// context.Canceled, even when the job returned its cancelled context's error; so the
// common `!errors.Is(err, context.Canceled)` filter never hides a lost lease.
func TestLostLeaseIsNotACancellation(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 3)
	leases, err := liveness.NewLeases(liveness.LeasesConfig{Pool: pool, Schema: defaults.Schema})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ran, err := leases.Run(ctx, "job", 2*time.Second, func(ctx context.Context, l *liveness.Lease) error {
		// Another process takes the row over; the next renewal finds it gone.
		db.Exec(t, `UPDATE liveness.leases SET holder = 'someone-else', epoch = nextval('liveness.lease_epoch_seq') WHERE name = 'job'`)
		<-ctx.Done()
		return ctx.Err()
	})
	if !ran {
		t.Fatal("the job did not run")
	}
	if !errors.Is(err, liveness.ErrLeaseLost) || errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v; want the lost lease, not context.Canceled", err)
	}
}

// TestAgentRecordsMetadata: what the Agent is given ends up in its row.
func TestAgentRecordsMetadata(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 3)
	cfg := agentConfig(db, pool)
	cfg.Reaper = false
	cfg.Metadata = map[string]any{"version": "1.2.3"}
	a := newAgent(t, cfg)
	runAgent(t, a)
	var meta string
	if err := pool.QueryRow(context.Background(), `SELECT metadata->>'version' FROM liveness.instances WHERE instance_id = $1`,
		cfg.InstanceID).Scan(&meta); err != nil || meta != "1.2.3" {
		t.Fatalf("metadata version = %q, %v; want 1.2.3", meta, err)
	}
}

// TestAcquireWhoseAnswerIsLostLeavesNoRow: the acquisition commits, but its answer comes
// too late for the caller; the row it inserted is deleted at once instead of blocking
// the lease for its whole ttl.
func TestAcquireWhoseAnswerIsLostLeavesNoRow(t *testing.T) {
	t.Parallel()
	db, direct := testdb.MigratedPool(t, 2)
	proxy := netfault.NewProxy(t, db.DSN, 700*time.Millisecond) // every answer 0.7 s late
	t.Cleanup(proxy.Close)
	pool := pgtest.Pool(t, proxy.DSN(), 1)
	leases, err := liveness.NewLeases(liveness.LeasesConfig{Pool: pool, Schema: defaults.Schema})
	if err != nil {
		t.Fatal(err)
	}
	// Warm up: the connection exists and the statement is prepared, so that the next
	// acquisition is sent and committed at once and only its answer is late.
	warm, cancelWarm := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelWarm()
	first := mustAcquire(t, warm, leases, "warm-up", time.Minute)
	if err := first.Release(warm); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond) // gives up before the answer
	defer cancel()
	if le, err := leases.TryAcquire(ctx, "job", time.Minute); err == nil || le != nil {
		t.Fatalf("TryAcquire = %v, %v; want an error: the answer came too late", le, err)
	}
	testutil.Eventually(t, 10*time.Second, "the abandoned row deleted", func() bool {
		var n int
		if err := direct.QueryRow(context.Background(), `SELECT count(*) FROM liveness.leases WHERE name = 'job'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
}

// jobLog records, from the jobs' own begin and end, who ran when, across campaigns.
type jobLog struct {
	mu   sync.Mutex
	runs []jobRun
}

type jobRun struct {
	who        string
	epoch      int64
	begin, end time.Time
}

// job runs until its context ends, then needs windDown to finish (the work it must not
// cut short: a payment batch, a mail), and reports its start on started.
func (l *jobLog) job(who string, windDown time.Duration, started chan<- string) func(context.Context, *liveness.Lease) {
	return func(ctx context.Context, self *liveness.Lease) {
		l.mu.Lock()
		i := len(l.runs)
		l.runs = append(l.runs, jobRun{who: who, epoch: self.Epoch, begin: time.Now()})
		l.mu.Unlock()
		started <- who
		<-ctx.Done()
		time.Sleep(windDown) // the job's own wind-down, not the test's waiting
		l.mu.Lock()
		l.runs[i].end = time.Now()
		l.mu.Unlock()
	}
}

// overlaps returns the first two runs that overlap, from their own records; a run that
// has not ended runs until now.
func (l *jobLog) overlaps() (a, b jobRun, found bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, x := range l.runs {
		for _, y := range l.runs[i+1:] {
			xEnd, yEnd := x.end, y.end
			if xEnd.IsZero() {
				xEnd = time.Now()
			}
			if yEnd.IsZero() {
				yEnd = time.Now()
			}
			if x.begin.Before(yEnd) && y.begin.Before(xEnd) {
				return x, y, true
			}
		}
	}
	return jobRun{}, jobRun{}, false
}

func (l *jobLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, r := range l.runs {
		fmt.Fprintf(&b, "\n  %s epoch %d: %s … %s", r.who, r.epoch, r.begin.Format("15:04:05.000"), r.end.Format("15:04:05.000"))
	}
	return b.String()
}

// TestElectorNeverRunsTwoJobsAtOnce: a job that takes over a second to wind down, and
// other processes campaigning for its lease. When the leader's agent stops (SIGTERM)
// and when its campaign alone ends, the next leader's job begins only after the
// previous one's own end record, and each handover happens.
func TestElectorNeverRunsTwoJobsAtOnce(t *testing.T) {
	t.Parallel()
	db, _ := testdb.MigratedPool(t, 2)
	const windDown = 1500 * time.Millisecond
	var log jobLog
	started := make(chan string, 10)
	type campaigner struct {
		agent       *liveness.Agent
		stopAgent   context.CancelFunc
		agentDone   <-chan error
		endCampaign context.CancelFunc
		electDone   chan struct{} // closed once Elect has returned electErr
		electErr    error
		leaders     *leaderSeen
	}
	start := func(who string) *campaigner {
		pool := db.Pool(t, 3)
		cfg := agentConfig(db, pool)
		cfg.ServiceName, cfg.Reaper = who, false
		a := newAgent(t, cfg)
		c := &campaigner{agent: a, electDone: make(chan struct{}), leaders: &leaderSeen{}}
		c.stopAgent, c.agentDone = runAgent(t, a)
		ctx, end := context.WithCancel(context.Background())
		c.endCampaign = end
		go func() {
			defer close(c.electDone)
			c.electErr = a.Elect(ctx, liveness.ElectorConfig{Lease: "billing", TTL: 5 * time.Second,
				RetryPeriod: 100 * time.Millisecond, OnStartedLeading: log.job(who, windDown, started),
				OnNewLeader: c.leaders.add})
		}()
		t.Cleanup(func() { end(); <-c.electDone })
		return c
	}
	next := func(want ...string) string {
		t.Helper()
		select {
		case who := <-started:
			if !slices.Contains(want, who) {
				t.Fatalf("%s started leading; want one of %v%s", who, want, log.String())
			}
			return who
		case <-time.After(20 * time.Second):
			t.Fatalf("none of %v led within 20s%s", want, log.String())
			return ""
		}
	}

	procs := map[string]*campaigner{"a": start("a")}
	first := next("a")
	procs["b"], procs["c"] = start("b"), start("c")

	// SIGTERM: the leader's agent stops, and with it its campaign.
	procs[first].stopAgent()
	second := next("b", "c")
	if <-procs[first].electDone; procs[first].electErr != nil {
		t.Fatalf("the stopped leader's Elect = %v; want nil", procs[first].electErr)
	}
	if err := <-procs[first].agentDone; err != nil {
		t.Fatalf("the stopped leader's Run = %v; want nil", err)
	}

	// The campaign alone ends; the agent stays.
	procs[second].endCampaign()
	third := next(slices.DeleteFunc([]string{"b", "c"}, func(s string) bool { return s == second })...)
	if a, b, found := log.overlaps(); found {
		t.Fatalf("two jobs ran at once: %s (epoch %d) until %s, %s (epoch %d) from %s%s", a.who, a.epoch,
			a.end.Format("15:04:05.000"), b.who, b.epoch, b.begin.Format("15:04:05.000"), log.String())
	}
	t.Logf("runs:%s", log.String())

	// Every process saw the leaders in the order they led, itself included, and the one
	// that stepped down saw no leader once its own leadership had ended.
	for who, c := range procs {
		got := c.leaders.ids()
		switch who {
		case first:
			want := []uuid.UUID{procs[first].agent.Snapshot().InstanceID, uuid.Nil}
			if !slices.Equal(got, want) {
				t.Errorf("%s (the first leader) saw leaders %v; want itself, then none", who, got)
			}
		case second:
			// It may also have seen the gap between the first's leadership and its own.
			self := c.agent.Snapshot().InstanceID
			i, j := slices.Index(got, procs[first].agent.Snapshot().InstanceID), slices.Index(got, self)
			if i < 0 || j < i || j+1 >= len(got) || (got[j+1] != uuid.Nil && got[j+1] != procs[third].agent.Snapshot().InstanceID) {
				t.Errorf("%s (the second leader) saw leaders %v; want the first, itself, then none or the third", who, got)
			}
		case third:
			if len(got) == 0 || got[len(got)-1] != c.agent.Snapshot().InstanceID {
				t.Errorf("%s (the third leader) saw leaders %v; want itself last", who, got)
			}
		}
	}
}

// leaderSeen records what OnNewLeader reported.
type leaderSeen struct {
	mu   sync.Mutex
	seen []liveness.Leader
}

func (l *leaderSeen) add(leader liveness.Leader) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen = append(l.seen, leader)
}

func (l *leaderSeen) ids() []uuid.UUID {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []uuid.UUID
	for _, s := range l.seen {
		out = append(out, s.InstanceID)
	}
	return out
}

func (l *leaderSeen) all() []liveness.Leader {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.seen)
}

// TestOnNewLeaderReportsItselfAndTheGap: a process that becomes leader hears of it
// through OnNewLeader too, before its job starts, and when its job returns on its own
// it reports no leader (the gap it has seen) before it leads again under a new epoch.
func TestOnNewLeaderReportsItselfAndTheGap(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 3)
	cfg := agentConfig(db, pool)
	cfg.Reaper = false
	a := newAgent(t, cfg)
	runAgent(t, a)
	var seen leaderSeen
	var rounds sync.WaitGroup
	rounds.Add(2)
	var mu sync.Mutex
	var epochs []int64
	ctx, end := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- a.Elect(ctx, liveness.ElectorConfig{Lease: "report", RetryPeriod: 100 * time.Millisecond,
			OnNewLeader: seen.add,
			OnStartedLeading: func(_ context.Context, self *liveness.Lease) {
				mu.Lock()
				defer mu.Unlock()
				// What OnNewLeader said last, before this job started, is this very leadership.
				if all := seen.all(); len(all) == 0 || all[len(all)-1].Epoch != self.Epoch ||
					all[len(all)-1].InstanceID != cfg.InstanceID {
					t.Errorf("leading epoch %d, but OnNewLeader last said %+v", self.Epoch, all)
				}
				if len(epochs) < 2 {
					epochs = append(epochs, self.Epoch)
					rounds.Done()
				}
			}, // returns at once: steps down
		})
	}()
	rounds.Wait()
	end()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	all := seen.all()
	if len(all) < 3 || all[0].Epoch != epochs[0] || all[1].InstanceID != uuid.Nil || all[1].Epoch != 0 ||
		all[2].Epoch != epochs[1] || all[1].Lease != "report" {
		t.Fatalf("OnNewLeader said %+v; want epoch %d (itself), no leader, then epoch %d", all, epochs[0], epochs[1])
	}
}

// statementCounter counts the statements a pool sends, per tag and first argument when it
// is a string ("lease_acquire:<lease>").
type statementCounter struct {
	mu   sync.Mutex
	n    map[string]int
	done map[string]int // the statements answered
}

// counterTag carries a statement's tag from its start to its end.
type counterTag struct{}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if _, rest, ok := strings.Cut(data.SQL, "/* pg_liveness:"); ok {
		tag, _, _ := strings.Cut(rest, " ")
		if len(data.Args) > 0 {
			if name, ok := data.Args[0].(string); ok {
				tag += ":" + name // the lease, for lease statements
			}
		}
		c.mu.Lock()
		c.n[tag]++
		c.mu.Unlock()
		return context.WithValue(ctx, counterTag{}, tag)
	}
	return ctx
}

func (c *statementCounter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if tag, ok := ctx.Value(counterTag{}).(string); ok {
		c.mu.Lock()
		c.done[tag]++
		c.mu.Unlock()
	}
}

func (c *statementCounter) count(tag string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[tag]
}

// answered counts the statements of tag whose answers have come.
func (c *statementCounter) answered(tag string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done[tag]
}

// countingPool is a pool of maxConns connections to dsn whose statements the returned
// counter counts, closed when the test ends.
func countingPool(t testing.TB, dsn string, maxConns int32) (*pgxpool.Pool, *statementCounter) {
	t.Helper()
	counter := &statementCounter{n: map[string]int{}, done: map[string]int{}}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = maxConns
	pcfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, counter
}

// TestFollowersWaitForNotificationsNotTheClock: a follower whose Agent listens to the
// schema's events does not try the lease every RetryPeriod (it would be a try a second per
// follower, the fleet's O(N) share of the database), and still takes the lease at once
// when the leader steps down, woken by the notification.
func TestFollowersWaitForNotificationsNotTheClock(t *testing.T) {
	t.Parallel()
	db, _ := testdb.MigratedPool(t, 2)
	lead := newAgent(t, agentConfig(db, db.Pool(t, 3)))
	runAgent(t, lead)

	pool, counter := countingPool(t, db.DSN, 3)
	follower := newAgent(t, agentConfig(db, pool))
	runAgent(t, follower)

	ctx, stop := context.WithTimeout(context.Background(), time.Minute)
	defer stop()
	stepDown := make(chan struct{})
	var l2 leadership
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	c1 := liveness.ElectorConfig{Lease: "quiet-job", RetryPeriod: 50 * time.Millisecond,
		OnStartedLeading: func(ctx context.Context, _ *liveness.Lease) {
			select {
			case <-ctx.Done():
			case <-stepDown:
			}
		}}
	wg.Go(func() { _ = lead.Elect(ctx, c1) })
	reader, err := liveness.NewReader(liveness.ReaderConfig{DB: pool})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the first agent leads", func() bool {
		l, err := reader.Leader(ctx, "quiet-job")
		return err == nil && l.InstanceID == lead.Snapshot().InstanceID
	})
	c2 := l2.config("quiet-job", 0)
	c2.RetryPeriod = 50 * time.Millisecond
	wg.Go(func() { _ = follower.Elect(ctx, c2) })
	testutil.Eventually(t, 10*time.Second, "the follower's first try", func() bool { return counter.count("lease_acquire:quiet-job") > 0 })
	// Until its lock has been held for 2 s, a refusal may be the fleet's verdict on the
	// follower itself, so it still polls at RetryPeriod: that span is waited out.
	testutil.Eventually(t, 10*time.Second, "the follower holding its lock", func() bool { return follower.Snapshot().AliveLock.Held })
	time.Sleep(2500 * time.Millisecond)

	// Twenty RetryPeriods: a clock-driven follower tries about twenty times.
	before := counter.count("lease_acquire:quiet-job")
	time.Sleep(20 * c2.RetryPeriod)
	if tries := counter.count("lease_acquire:quiet-job") - before; tries > 3 {
		t.Fatalf("the listening follower tried %d times in 20 retry periods; want it to wait for a notification", tries)
	}

	steppedDown := time.Now()
	close(stepDown)
	testutil.Eventually(t, 5*time.Second, "the follower leads", func() bool { s, _ := l2.snapshot(); return len(s) == 1 })
	s, _ := l2.snapshot()
	if took := s[0].start.Sub(steppedDown); took > 2*time.Second {
		t.Fatalf("the follower took over %s after the step-down; want it woken by the release's notification", took)
	}
}

// A follower refused because of its own instance, not another live leader (here: a row
// still its own, from a leadership whose release was lost), is told of nothing when that
// ends; it must go on polling at RetryPeriod, not wait out a QuietPeriod. The row then
// expires, which nobody notifies (no watcher runs), and the follower must lead within
// seconds.
func TestFollowerRefusedByItsOwnRowKeepsPolling(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 3)
	cfg := agentConfig(db, pool)
	cfg.DisableWatcher, cfg.Reaper = true, false
	a := newAgent(t, cfg)
	runAgent(t, a)
	ctx := testutil.Context(t, time.Minute)
	id := a.Snapshot().InstanceID
	if _, err := pool.Exec(ctx, `INSERT INTO liveness.leases (name, holder, holder_instance_id, holder_host, epoch, taken_at, expires_at)
		VALUES ('own-row', 'an earlier leadership', $1, 'host', 999, now(), now() + interval '1 minute')`, id); err != nil {
		t.Fatal(err)
	}
	var l leadership
	c := l.config("own-row", 0)
	c.QuietPeriod = time.Minute
	electCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	wg.Go(func() { _ = a.Elect(electCtx, c) })
	// Past the 2 s after which a refusal by another live leader would quiet the follower.
	time.Sleep(2500 * time.Millisecond)
	if _, err := pool.Exec(ctx, `UPDATE liveness.leases SET expires_at = now() - interval '1 second' WHERE name = 'own-row'`); err != nil {
		t.Fatal(err)
	}
	expired := time.Now()
	testutil.Eventually(t, 10*time.Second, "the follower leading once its own old row expired", func() bool {
		s, _ := l.snapshot()
		return len(s) == 1
	})
	if took := time.Since(expired); took > 5*time.Second {
		t.Fatalf("led %s after the row expired; want within a few RetryPeriods (%s)", took, c.RetryPeriod)
	}
}
