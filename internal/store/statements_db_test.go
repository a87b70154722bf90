package store_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pg-liveness/pg_liveness_exporter/collector"
	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/status"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/whizbangtest"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// stmtEntry is one pg_stat_statements entry of the test's database.
type stmtEntry struct {
	queryID  int64
	topLevel bool
	calls    int64
	query    string
}

// TestEveryStatementIsClassifiedAndCounted drives everything that talks to PostgreSQL at
// run time (two agents with their alive locks, heartbeats, reaper and an elector each,
// the Reader, the collectors, the status page, a Whizbang source and the schema's state)
// against the server of the run's major, then reads pg_stat_statements. Every entry that
// carries a tag must be classified by DefaultStatementPatterns as that tag, every entry
// sent at top level that names our schema must carry one, every tag must have been seen
// (so no two tags share a shape, and so one query id), and the statements collector must
// count each tag's calls exactly. The migrations' DDL, run once before, is not counted;
// the statements inside our functions (nested entries, their text the functions' bodies)
// need no tag.
func TestEveryStatementIsClassifiedAndCounted(t *testing.T) {
	db := pgtest.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pool := db.Pool(t, 4)
	db.Exec(t, `CREATE EXTENSION pg_stat_statements`)
	if _, err := migrations.Apply(ctx, pool, defaults.Schema); err != nil {
		t.Fatal(err)
	}
	wb := whizbangtest.NewFixture(t, db)
	wbAlive := uuid.New()
	wb.Register(t, wbAlive, "wh-orders", time.Second)
	if !wb.Claim(t, wbAlive) {
		t.Fatal("whizbang claim failed")
	}
	var version string
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version')`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL %s", version)
	// An instance that will crash: its row says it holds its alive lock, which a session
	// of the test's holds (set up before the statistics are reset: these statements are
	// the test's own).
	crashed := uuid.New()
	crashConn := db.Conn(t)
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock, lock_grace)
	            VALUES ($1, 'tagged-crash', true, '1 s')`, crashed)
	if _, err := crashConn.Exec(ctx, `SELECT liveness.claim_instance_alive_lock($1)`, crashed); err != nil {
		t.Fatal(err)
	}
	db.Exec(t, `SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0)`)

	// The agents: alive locks, heartbeats, the reaper under its lease, and one elector
	// each for the same job, so that one leads (acquire, renew) and one follows (leader);
	// one of them watches the service's members.
	var agents []*liveness.Agent
	var agentPools []*pgxpool.Pool
	var wg sync.WaitGroup
	runCtx, stopAgents := context.WithCancel(ctx)
	t.Cleanup(func() { stopAgents(); wg.Wait() })
	errs := make(chan error, 4)
	for range 2 {
		// Named, so that the test can wait for the agents' sessions to end.
		agentPool := pgtest.Pool(t, db.DSN+" application_name=tagged:pool", 4)
		agentPools = append(agentPools, agentPool)
		a, err := liveness.NewAgent(liveness.AgentConfig{
			Pool: agentPool, DirectDSN: db.DSN, InstanceID: uuid.New(), ServiceName: "tagged",
			Timing: liveness.Timing{HeartbeatInterval: 300 * time.Millisecond, HeartbeatSlowInterval: 600 * time.Millisecond,
				StaleThreshold: 3 * time.Second, DefinitiveDeadCutoff: 10 * time.Second},
			VerifyInterval: 100 * time.Millisecond,
			Reaper:         true, ReaperInterval: 200 * time.Millisecond, ReaperLeaseTTL: 2 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		agents = append(agents, a)
		wg.Go(func() { errs <- a.Run(runCtx) })
		wg.Go(func() {
			_ = a.Elect(runCtx, liveness.ElectorConfig{
				Lease: "tagged-job", TTL: 2 * time.Second, RetryPeriod: 100 * time.Millisecond,
				OnStartedLeading: func(ctx context.Context, self *liveness.Lease) {
					fenceOnce(ctx, t, pool, self) // the leader's fence, in a transaction of its own
					<-ctx.Done()
				},
				OnNewLeader: func(liveness.Leader) {}, // so that the follower reads who leads
			})
		})
	}
	// A process that waits for membership listens to the members channel.
	wg.Go(func() { _ = agents[0].WatchAlive(runCtx, "tagged", 0, func([]liveness.InstanceStatus) {}) })
	// The crashing instance's session ends once a watcher has seen its lock: the watcher
	// stamps it and, a grace later, notifies its death.
	testutil.Eventually(t, 10*time.Second, "a watcher leading", func() bool {
		for _, a := range agents {
			for _, l := range a.Snapshot().Leases {
				if strings.HasPrefix(l.Name, "pg_liveness.watcher.") && l.Held {
					return true
				}
			}
		}
		return false
	})
	time.Sleep(500 * time.Millisecond)
	if err := crashConn.Close(ctx); err != nil {
		t.Fatal(err)
	}

	var missing []string
	if !testutil.Poll(60*time.Second, func() bool {
		seen := tagsIn(readEntries(t, pool))
		missing = missing[:0]
		for _, tag := range []string{store.Heartbeat.Tag(), store.AliveLockClaim.Tag(), store.AliveLockVerify.Tag(),
			store.LeaseAcquire.Tag(), store.LeaseRenew.Tag(), store.LeaseLeader.Tag(), store.LeaseFence.Tag(), store.Cleanup.Tag(),
			store.WatchAliveLocks.Tag(), store.NotifyDeadInstances.Tag(), store.EventsListen.Tag(), store.MembersListen.Tag()} {
			if !seen[tag] {
				missing = append(missing, tag)
			}
		}
		return len(missing) == 0
	}) {
		t.Fatalf("the agents sent none of %v within 60s", missing)
	}

	// watch_fresh is sent by an agent's sentry only while it leads no watcher; with two
	// agents each leads one (at most one an agent), so the test sends it, as the agent does
	// (TestCrashBothWatchers in tools/faults runs it for real).
	var age float64
	var lockCount *int32
	if err := pool.QueryRow(ctx, store.WatchFresh.In(defaults.Schema).SQL).Scan(&age, &lockCount); err != nil {
		t.Fatal(err)
	}
	// alive_lock_holder is sent only after a refused claim (a duplicate, or a stranger on
	// the key); the test asks about the first agent, whose lock is its own.
	var holderPID int32
	var claimed bool
	if err := pool.QueryRow(ctx, store.AliveLockHolder.In(defaults.Schema).SQL,
		agents[0].Snapshot().InstanceID.String()).Scan(&holderPID, &claimed); err != nil || !claimed {
		t.Fatalf("alive_lock_holder of a running agent: pid %d, claimed %v, %v; want its own claim", holderPID, claimed, err)
	}
	// The node agent's: which database a session is on, and letting one instance's lock
	// go (here one this session does not hold: false).
	var database string
	var released bool
	if err := pool.QueryRow(ctx, store.LockDatabase.In(defaults.Schema).SQL).Scan(&database); err != nil || database == "" {
		t.Fatalf("lock_database: %q, %v", database, err)
	}
	if err := pool.QueryRow(ctx, store.AliveLockRelease.In(defaults.Schema).SQL, uuid.New().String()).Scan(&released); err != nil || released {
		t.Fatalf("alive_lock_release of a lock the session does not hold: %v, %v; want false", released, err)
	}
	// Which of some instances are dead: an unknown one is.
	unknown := uuid.New()
	var dead uuid.UUID
	if err := pool.QueryRow(ctx, store.NodeAgentDeadInstances.In(defaults.Schema).SQL, []string{unknown.String()}).Scan(&dead); err != nil || dead != unknown {
		t.Fatalf("node_agent_dead_instances of an unknown instance: %v, %v; want it", dead, err)
	}
	// How many of some instances' rows claim their locks: the running agents' rows do.
	var claiming int
	if err := pool.QueryRow(ctx, store.NodeAgentRowsClaimingLocks.In(defaults.Schema).SQL,
		[]string{agents[0].Snapshot().InstanceID.String(), unknown.String()}).Scan(&claiming); err != nil || claiming != 1 {
		t.Fatalf("node_agent_rows_claiming_locks of a running agent and an unknown instance: %d, %v; want 1", claiming, err)
	}
	// A shard set's: renewing many leases at once (none here), and reading its members.
	if _, err := pool.Exec(ctx, store.LeaseRenewMany.In(defaults.Schema).SQL, []string{"set/0"}, []string{"h"}, []int64{1}, 15.0); err != nil {
		t.Fatalf("lease_renew_many: %v", err)
	}
	for _, st := range []struct {
		s    store.Statement
		args []any
	}{
		{store.LeaseAcquireMany, []any{[]string{"set/0"}, []string{"h"}, 15.0, nil, "host"}},
		{store.LeaseAbandonMany, []any{[]string{"set/0"}, []string{"h"}}},
		{store.LeaseReleaseMany, []any{[]string{"set/1"}, []string{"h"}, []int64{1}}},
		{store.LeaseDetachMany, []any{[]string{"set/1"}, []string{"h"}, []int64{1}}},
		{store.ShardFree, []any{[]string{"set/0", "set/1"}}},
	} {
		if _, err := pool.Exec(ctx, st.s.In(defaults.Schema).SQL, st.args...); err != nil {
			t.Fatalf("%s: %v", st.s.Name(), err)
		}
	}
	if _, err := pool.Exec(ctx, store.ShardMembers.In(defaults.Schema).SQL, "set/member/", "set/member0"); err != nil {
		t.Fatalf("shard_members: %v", err)
	}

	// The Reader, the status page and the collectors, on our schema.
	reader, err := liveness.NewReader(liveness.ReaderConfig{DB: pool})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reader.Instance(ctx, agents[0].Snapshot().InstanceID); err != nil {
		t.Fatal(err)
	}
	if _, err := reader.Instances(ctx, "tagged"); err != nil {
		t.Fatal(err)
	}
	if _, err := reader.Leader(ctx, "tagged-job"); err != nil {
		t.Fatal(err)
	}
	if _, err := reader.Fleet(ctx, liveness.FleetQuery{Limit: 10, LeaseLimit: 10}); err != nil {
		t.Fatal(err)
	}
	page, err := status.New(status.Config{DB: pool})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	page.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/status.json", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/status.json: %d %s", rec.Code, rec.Body)
	}
	cfg := collector.DefaultConfig()
	cfg.Leases.Enabled = true
	scrape(t, cfg, pool, agents[0])
	// As a database that discovery found: the server's locks read once
	// (server_advisory_locks), its part judged without pg_locks (the instances statement
	// of given locks, advisory_locks_of_snapshot: the agents hold alive locks).
	scrape(t, withServerLocks(cfg, pool, db.Name), pool, agents[0])
	if _, err := migrations.ReadState(ctx, pool, defaults.Schema); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Version(ctx, pool, defaults.Schema); err != nil {
		t.Fatal(err)
	}
	// Discovery's reads (package targets), as its round sends them.
	dq, sq := store.DiscoverDatabases.In(""), store.DiscoverSource.In("")
	if _, err := pool.Exec(ctx, dq.SQL, dq.Args()...); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, sq.SQL, sq.Args((*store.Source)(nil).InstancesTable())...); err != nil {
		t.Fatal(err)
	}

	// The same reads of a Whizbang source, as its read-only observer.
	wsrc := wb.Reads(t)
	if err := wsrc.CheckTable(ctx, wb.Observer, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	wr, err := liveness.NewReader(liveness.ReaderConfig{DB: wb.Observer, Whizbang: &liveness.WhizbangSource{}}) // the fixture's: Whizbang's defaults
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wr.Instances(ctx, "wh-orders"); err != nil {
		t.Fatal(err)
	}
	if _, err := wr.Fleet(ctx, liveness.FleetQuery{Limit: 10}); err != nil {
		t.Fatal(err)
	}
	wcfg := collector.DefaultConfig()
	wcfg.Source = wsrc
	wcfg.Statements.Enabled = false
	scrape(t, wcfg, wb.Observer, nil)
	scrape(t, withServerLocks(wcfg, wb.Observer, db.Name), wb.Observer, nil)

	// Shut the agents down: they delete their rows and release their leases.
	stopAgents()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("agent: %v", err)
		}
	}
	// A statement whose context the shutdown cancelled may still run on the server, and
	// count, after the agent returned: count once the agents' sessions have ended.
	for _, a := range agentPools {
		a.Close()
	}
	testutil.Eventually(t, 30*time.Second, "the agents' sessions ended", func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		                            WHERE datname = current_database() AND application_name LIKE 'tagged:%'`).Scan(&n)
		return err == nil && n == 0
	})

	entries := readEntries(t, pool)
	patterns := defaultPatterns(t)
	want := map[string]int64{} // calls by tag name, from pg_stat_statements
	ourSchema := regexp.MustCompile(`(?i)\bliveness\s*\.|"liveness"\s*\.`)
	for _, e := range entries {
		tag := firstTag(e.query)
		if tag == "" {
			if e.topLevel && ourSchema.MatchString(e.query) {
				t.Errorf("query id %d touches our schema but carries no tag: %q", e.queryID, e.query)
			}
			continue
		}
		if got := classify(patterns, e.query); got != tag {
			t.Errorf("query id %d carries %s but is classified as %q: %q", e.queryID, tag, got, e.query)
		}
		want[tag] += e.calls
	}
	for _, tag := range store.Tags() {
		if want[tag] == 0 {
			t.Errorf("no pg_stat_statements entry carries %s: not sent, or merged into another tag's entry (same shape)", tag)
		}
	}

	// The statements collector alone (no other collector adds calls meanwhile), in a new
	// exporter: its first scrape counts every classified entry in full.
	only := collector.DefaultConfig()
	only.Instances.Enabled, only.Leases.Enabled, only.AdvisoryLocks.Enabled, only.Agent.Enabled = false, false, false, false
	only.History.Enabled = false
	got := scrape(t, only, pool, nil)
	for _, name := range store.Tags() {
		if got[name] != float64(want[name]) {
			t.Errorf("pg_liveness_statement_calls_total{statement=%q} = %v, want %d (pg_stat_statements)", name, got[name], want[name])
		}
	}
	if t.Failed() {
		for _, e := range entries {
			t.Logf("entry %d toplevel=%v calls=%d %q", e.queryID, e.topLevel, e.calls, e.query)
		}
	}
}

// withServerLocks is cfg for a database that discovery found on a server: its part of
// the server's locks, read on q.
func withServerLocks(cfg collector.Config, q *pgxpool.Pool, datname string) collector.Config {
	cfg.Locks = func(ctx context.Context) (*collector.DatabaseLocks, error) {
		all, err := collector.ReadServerLocks(ctx, q, []string{datname})
		if err != nil {
			return nil, err
		}
		if all[datname] == nil {
			return nil, fmt.Errorf("no locks nor backends read for %s", datname)
		}
		return all[datname], nil
	}
	return cfg
}

// fenceOnce runs the leader's fence in a transaction of its own, as a job fences its
// writes.
func fenceOnce(ctx context.Context, t *testing.T, pool *pgxpool.Pool, self *liveness.Lease) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tx, err := pool.Begin(qctx)
	if err != nil {
		t.Errorf("fence: begin: %v", err)
		return
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(qctx)) }()
	if err := self.Fence(qctx, tx); err != nil && ctx.Err() == nil {
		t.Errorf("fence: %v", err)
	}
}

var tagRE = regexp.MustCompile(regexp.QuoteMeta(store.TagPrefix) + `([a-z_]+)`)

// firstTag is the name of the first tag in a query's text, or "".
func firstTag(query string) string {
	if m := tagRE.FindStringSubmatch(query); m != nil {
		return m[1]
	}
	return ""
}

func tagsIn(entries []stmtEntry) map[string]bool {
	seen := map[string]bool{}
	for _, e := range entries {
		if tag := firstTag(e.query); tag != "" {
			seen[tag] = true
		}
	}
	return seen
}

type namedPattern struct {
	name string
	re   *regexp.Regexp
}

// defaultPatterns parses DefaultStatementPatterns as the collector does: name=regex,
// first match wins.
func defaultPatterns(t *testing.T) []namedPattern {
	var out []namedPattern
	for _, p := range collector.DefaultStatementPatterns {
		name, expr, ok := strings.Cut(p, "=")
		if !ok {
			t.Fatalf("default pattern %q: want name=regex", p)
		}
		out = append(out, namedPattern{name, regexp.MustCompile(expr)})
	}
	return out
}

func classify(patterns []namedPattern, query string) string {
	for _, p := range patterns {
		if p.re.MatchString(query) {
			return p.name
		}
	}
	return ""
}

func readEntries(t *testing.T, pool *pgxpool.Pool) []stmtEntry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := pool.Query(ctx, `SELECT queryid, toplevel, calls, query FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND queryid IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []stmtEntry
	for rows.Next() {
		var e stmtEntry
		if err := rows.Scan(&e.queryID, &e.topLevel, &e.calls, &e.query); err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// scrape runs one scrape of a new exporter and returns its statement calls by name.
func scrape(t *testing.T, cfg collector.Config, pool *pgxpool.Pool, agent collector.AgentSource) map[string]float64 {
	t.Helper()
	if agent == nil {
		cfg.Agent.Enabled = false
	}
	e, err := collector.New(cfg, pool, agent, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	e.Handler(nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: %d %s", rec.Code, rec.Body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mfs["pg_liveness_scrape_collector_success"].GetMetric() {
		if m.GetGauge().GetValue() != 1 {
			t.Fatalf("scrape: collector %s failed", fmt.Sprint(m.GetLabel()))
		}
	}
	calls := map[string]float64{}
	for _, m := range mfs["pg_liveness_statement_calls_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "statement" {
				calls[l.GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	return calls
}
