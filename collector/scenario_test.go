package collector

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// scenarioSchema needs quoting, so the test also shows the schema only ever enters SQL as
// a quoted identifier.
const scenarioSchema = "Live Ness"

var schemaIdent = pgx.Identifier{scenarioSchema}.Sanitize()

func id(s string) uuid.UUID { return uuid.MustParse("00000000-0000-0000-0000-0000000000" + s) }

func exec(t *testing.T, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := c.Exec(testutil.Context(t, 30*time.Second), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// newScenario makes a database with instances in every state, leases, advisory locks
// held by idle and active backends, a waiter, and tagged statements in
// pg_stat_statements.
func newScenario(t *testing.T) *pgtest.DB {
	t.Helper()
	db := pgtest.NewDB(t)
	testdb.Migrate(t, db.DSN, scenarioSchema)
	setup := db.ConnAs(t, "setup")
	// pg_stat_statements may live in any schema; the collector has to find it.
	exec(t, setup, `CREATE SCHEMA stats; CREATE EXTENSION pg_stat_statements SCHEMA stats`)

	insert := `INSERT INTO ` + schemaIdent + `.instances (instance_id, service_name, last_heartbeat_at, liveness_mode)
	           VALUES ($1, $2, now() - make_interval(secs => $3), $4)`
	for _, in := range []struct {
		id      string
		service string
		age     float64
		mode    liveness.Mode
	}{
		{"a1", "api", 10, liveness.ModeAdvisoryLockWhenAvailable},    // alive
		{"a2", "api", 120, liveness.ModeAdvisoryLockWhenAvailable},   // lock_only
		{"a3", "api", 600, liveness.ModeAdvisoryLockWhenAvailable},   // zombie
		{"a4", "api", 5, liveness.ModeAdvisoryLockWhenAvailable},     // heartbeat_only
		{"a5", "api", 200, liveness.ModeAdvisoryLockWhenAvailable},   // stale
		{"a6", "api", 100, liveness.ModeAdvisoryLockWhenAvailable},   // stale: a two-int4 lock on its key halves is not its alive lock
		{"b1", "worker", 10, liveness.ModeAdvisoryLockWhenAvailable}, // alive
		{"b2", "worker", 5, liveness.ModeHeartbeatTableOnly},         // heartbeat_only
	} {
		exec(t, setup, insert, id(in.id), in.service, in.age, string(in.mode))
	}
	// Two instances whose rows say they hold their alive lock, but no session holds it: a7
	// within its grace (lock_lost, proving life), a8 seen missing a minute ago with no beat
	// since (stale: dead although its heartbeat is fresh).
	exec(t, setup, insert, id("a7"), "api", 10.0, string(liveness.ModeAdvisoryLockWhenAvailable))
	exec(t, setup, insert, id("a8"), "api", 10.0, string(liveness.ModeAdvisoryLockWhenAvailable))
	exec(t, setup, `UPDATE `+schemaIdent+`.instances SET (holds_alive_lock, lock_grace) = (true, interval '1 hour')
	                 WHERE instance_id = $1`, id("a7"))
	exec(t, setup, `UPDATE `+schemaIdent+`.instances SET holds_alive_lock = true WHERE instance_id = $1`, id("a8"))
	exec(t, setup, `INSERT INTO `+schemaIdent+`.alive_lock_absences (instance_id, missing_since, server_started_at)
	                 VALUES ($1, now() - interval '1 minute', pg_postmaster_start_time())`, id("a8"))

	leases := `INSERT INTO ` + schemaIdent + `.leases (name, holder, taken_at, expires_at)
	           VALUES ($1, $2, now() - make_interval(secs => $3), now() + make_interval(secs => $4))`
	exec(t, setup, leases, "cleanup", "host-a:123:0123456789abcdef", 30.0, 90.0)  // held, epoch 1
	exec(t, setup, leases, "alerts", "host-b:456:fedcba9876543210", 300.0, -60.0) // expired, epoch 2
	exec(t, setup, `UPDATE `+schemaIdent+`.leases SET (holder_instance_id, holder_host) = ($1, 'host-a')
	                 WHERE name = 'cleanup'`, id("a1"))

	// Tagged statements: 3 heartbeat-like updates of the 2 worker rows, 2 lease renewals,
	// and an untagged statement that matches nothing.
	for range 3 {
		exec(t, setup, `UPDATE /* `+store.TagPrefix+store.Heartbeat.Tag()+` */ `+schemaIdent+`.instances
		                 SET last_heartbeat_at = last_heartbeat_at WHERE service_name = $1`, "worker")
	}
	for range 2 {
		exec(t, setup, `UPDATE /* `+store.TagPrefix+store.LeaseRenew.Tag()+` */ `+schemaIdent+`.leases
		                 SET expires_at = expires_at WHERE name = $1`, "cleanup")
	}
	exec(t, setup, `SELECT count(*) FROM `+schemaIdent+`.leases`)
	_ = setup.Close(context.Background())

	// Alive locks: "svc-api" holds a1, a2, a3 and a two-int4 lock on a6's key halves;
	// "svc-worker" holds b1. Both then sit idle.
	api := db.ConnAs(t, "svc-api")
	for _, s := range []string{"a1", "a2", "a3"} {
		var ok bool
		if err := api.QueryRow(testutil.Context(t, 10*time.Second), `SELECT `+schemaIdent+`.claim_instance_alive_lock($1)`, id(s)).Scan(&ok); err != nil || !ok {
			t.Fatalf("claim %s: %v %v", s, ok, err)
		}
	}
	var key int64
	if err := api.QueryRow(testutil.Context(t, 10*time.Second), `SELECT `+schemaIdent+`.instance_lock_key($1)`, id("a6")).Scan(&key); err != nil {
		t.Fatal(err)
	}
	exec(t, api, `SELECT pg_advisory_lock($1::int4, $2::int4)`, int32(uint32(key>>32)), int32(uint32(key)))
	worker := db.ConnAs(t, "svc-worker")
	exec(t, worker, `SELECT `+schemaIdent+`.claim_instance_alive_lock($1)`, id("b1"))

	// An idle holder without application_name, an active holder ("jobs" sleeping while
	// holding 42) and a waiter ("jobs" blocked on 42).
	anon := db.ConnAs(t, "")
	exec(t, anon, `SELECT pg_advisory_lock(43)`)
	active := db.ConnAs(t, "jobs")
	exec(t, active, `SELECT pg_advisory_lock(42)`)
	waiter := db.ConnAs(t, "jobs")

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() }) // runs before the connections close
	wg.Go(func() { _, _ = active.Exec(ctx, `SELECT pg_sleep(60)`) })
	testutil.Eventually(t, 10*time.Second, "the active holder", func() bool {
		return db.QueryInt(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'jobs' AND state = 'active'`) == 1
	})
	wg.Go(func() { _, _ = waiter.Exec(ctx, `SELECT pg_advisory_lock(42)`) })
	testutil.Eventually(t, 10*time.Second, "the waiter", func() bool {
		return db.QueryInt(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`) == 1
	})
	// The setup connection and the pollers must be gone: 5 client backends remain. Asked
	// on one of the five, since a poller's own backend outlives its Close for a moment and
	// would be counted by the first scrape (as a sixth, nameless, backend).
	testutil.Eventually(t, 10*time.Second, "short-lived backends to exit", func() bool {
		var n int
		err := worker.QueryRow(testutil.Context(t, 10*time.Second), `SELECT count(*) FROM pg_stat_activity
		                      WHERE datname = current_database() AND backend_type = 'client backend'`).Scan(&n)
		return err == nil && n == 5
	})
	return db
}

// fixedAgent is a stand-in for the liveness agent: the agent collector only reads its
// snapshot and never touches the database.
type fixedAgent liveness.AgentSnapshot

func (a fixedAgent) Snapshot() liveness.AgentSnapshot { return liveness.AgentSnapshot(a) }

var testAgent = func() fixedAgent {
	s := liveness.AgentSnapshot{
		InstanceID:  id("ee"),
		ServiceName: "pg_liveness_exporter",
		Mode:        liveness.ModeAdvisoryLockWhenAvailable,
		Timing:      liveness.Timing{HeartbeatInterval: 30 * time.Second, HeartbeatSlowInterval: time.Minute},
		Leases: []liveness.LeaseStats{
			{Name: "pg_liveness_reaper", Held: true, Epoch: 7, Lost: map[string]uint64{"expired": 0, "taken": 2, "error": 0, "not_alive": 0},
				FencedRefused: 1},
		},
		Reaped: 7,
		Shards: []liveness.ShardSetStats{{Set: "orders", Members: 4, Shards: 64, Owned: 16, Acquired: 20, Released: 3, Lost: 1}},
	}
	s.AliveLock.Held, s.AliveLock.Claims, s.AliveLock.Losses, s.AliveLock.Reconnects = true, 2, 1, 1
	s.Heartbeat.Interval, s.Heartbeat.Beats, s.Heartbeat.Failures = time.Minute, 42, 3
	s.Heartbeat.LastBeat = time.Unix(1_800_000_000, 500_000_000)
	return fixedAgent(s)
}()

// scenarioRules are the bounds of the samples that depend on when the scrape runs.
var scenarioRules = []approx{
	{name: "pg_liveness_scrape_collector_duration_seconds", lo: 0, hi: 10},
	{name: "pg_liveness_instance_heartbeat_age_seconds", lo: 0, hi: 60},
	{name: "pg_liveness_instance_oldest_heartbeat_age_seconds", lo: 0, hi: 60},
	{name: "pg_liveness_lease_expires_in_seconds", lo: -60, hi: 0},
	{name: "pg_liveness_lease_held_for_seconds", lo: 0, hi: 60},
	// Idle holders have been idle a little while; the others' 0 is exact.
	{name: "pg_liveness_advisory_lock_idle_holder_max_seconds", lo: 1e-6, hi: 60, labels: []string{"application_name", "svc-api"}},
	{name: "pg_liveness_advisory_lock_idle_holder_max_seconds", lo: 1e-6, hi: 60, labels: []string{"application_name", "svc-worker"}},
	{name: "pg_liveness_advisory_lock_idle_holder_max_seconds", lo: 1e-6, hi: 60, labels: []string{"application_name", "unknown"}},
	{name: "pg_liveness_statement_seconds_total", lo: 1e-9, hi: 5, labels: []string{"statement", "heartbeat"}},
	{name: "pg_liveness_statement_seconds_total", lo: 1e-9, hi: 5, labels: []string{"statement", "lease_renew"}},
	{name: "pg_liveness_statement_seconds_total", lo: 1e-9, hi: 5, labels: []string{"statement", "schema_state"}},
	// The collectors' own reads: none, one or (on the second scrape) two of each so far.
	{name: "pg_liveness_statement_calls_total", lo: 0, hi: 2, labels: []string{"statement", "instances"}},
	{name: "pg_liveness_statement_calls_total", lo: 0, hi: 2, labels: []string{"statement", "leases"}},
	// The database's identity, read once after the first scrape's answer.
	{name: "pg_liveness_statement_calls_total", lo: 0, hi: 1, labels: []string{"statement", "database_identity"}},
	{name: "pg_liveness_statement_rows_total", lo: 0, hi: 1, labels: []string{"statement", "database_identity"}},
	{name: "pg_liveness_statement_seconds_total", lo: 0, hi: 5, labels: []string{"statement", "database_identity"}},
	{name: "pg_liveness_statement_calls_total", lo: 0, hi: 2, labels: []string{"statement", "advisory_locks"}},
	{name: "pg_liveness_statement_rows_total", lo: 0, hi: 2 * 13, labels: []string{"statement", "instances"}},
	{name: "pg_liveness_statement_rows_total", lo: 0, hi: 2 * 3, labels: []string{"statement", "leases"}},
	{name: "pg_liveness_statement_rows_total", lo: 0, hi: 2 * 8, labels: []string{"statement", "advisory_locks"}},
	{name: "pg_liveness_statement_seconds_total", lo: 0, hi: 5, labels: []string{"statement", "instances"}},
	{name: "pg_liveness_statement_seconds_total", lo: 0, hi: 5, labels: []string{"statement", "leases"}},
	{name: "pg_liveness_statement_seconds_total", lo: 0, hi: 5, labels: []string{"statement", "advisory_locks"}},
	// The history collector's reads: its start (the newest id), then each scrape's rows
	// since and leases nobody leads; the rows it saw: the one newest id, and the lease
	// that expired.
	{name: "pg_liveness_statement_calls_total", lo: 0, hi: 5, labels: []string{"statement", "history_since"}},
	{name: "pg_liveness_statement_rows_total", lo: 0, hi: 5, labels: []string{"statement", "history_since"}},
	{name: "pg_liveness_statement_seconds_total", lo: 0, hi: 5, labels: []string{"statement", "history_since"}},
	// The instances collector stamps the lock that vanished while the history collector
	// starts: the stamp's row is counted when it lands after the start.
	{name: "pg_liveness_history_events_total", lo: 0, hi: 1, labels: []string{"kind", "lock_vanished"}},
	// The lease expired a minute before the scenario's scrape.
	{name: "pg_liveness_lease_leaderless_for_seconds", lo: 0, hi: 60},
}

// fixedStatus stands in for the binary's start-up step: a schema migrated by a newer
// release that still serves this binary, and a started agent.
type fixedStatus store.BinaryStatus

func (s fixedStatus) Status() store.BinaryStatus { return store.BinaryStatus(s) }

func scenarioConfig() Config {
	cfg := DefaultConfig()
	cfg.Source = mustSource(store.SourceConfig{Schema: scenarioSchema})
	cfg.NodeAgent.Source = fixedNodeAgent{Socket: "/run/pg-liveness/agent.sock", SessionUp: true, Listening: true,
		Attached: 3, LocksHeld: 3, Claims: 4, Proofs: 120, ProveAsked: 96, Reconnects: 1, Refused: 2, AcceptErrors: 0,
		ProtocolErrors: 5, Impostors: 1, Unauthenticated: 2}
	cfg.Status = fixedStatus{SchemaRead: true, SchemaVersion: 5, SchemaCompatibleFrom: 2, BinaryVersion: 4,
		SchemaCompatible: true, AgentStarted: true}
	return cfg
}

// anonymizeIdentity checks pg_liveness_database_info's labels (the server's system
// identifier and the database's oid, the database's name) and replaces them with the
// placeholders of testdata/scenario.prom, SYSID:OID and DATNAME.
func anonymizeIdentity(t *testing.T, mfs map[string]*dto.MetricFamily, datname string) {
	t.Helper()
	mf := mfs["pg_liveness_database_info"]
	if mf == nil || len(mf.Metric) != 1 {
		t.Fatalf("want one pg_liveness_database_info, got %v", mf)
	}
	for _, l := range mf.Metric[0].Label {
		switch l.GetName() {
		case "database_id":
			if !regexp.MustCompile(`^[1-9][0-9]*:[1-9][0-9]*$`).MatchString(l.GetValue()) {
				t.Errorf("database_id %q is not SYSID:OID", l.GetValue())
			}
			l.Value = new("SYSID:OID")
		case "datname":
			if l.GetValue() != datname {
				t.Errorf("datname %q, want %q", l.GetValue(), datname)
			}
			l.Value = new("DATNAME")
		}
	}
}

func TestScenario(t *testing.T) {
	db := newScenario(t)
	// One connection: everything must work with --db.max-conns=1, and the exporter's
	// own backend is then exactly one, active while it reads pg_stat_activity.
	pool := exporterPool(t, db.DSN, 1, nil)
	e := newExporter(t, scenarioConfig(), pool, testAgent, nil)

	// Twice: the first scrape classifies the statements, the second uses the cache and
	// must export the same counts (the exporter's own reads within the bounds of
	// scenarioRules).
	for i := range 2 {
		got := scrapeFamilies(t, e)
		anonymizeIdentity(t, got, db.Name)
		compareExposition(t, got, readTestdata(t, "scenario.prom"), scenarioRules...)
		if t.Failed() {
			t.Fatalf("scrape %d differs", i+1)
		}
	}

	problems, err := promlint.New(scrapeResponse(t, e, "").Body).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

func TestScenarioFoldsApplications(t *testing.T) {
	db := newScenario(t)
	cfg := scenarioConfig()
	cfg.AdvisoryLocks.MaxApplications = 2
	e := newExporter(t, cfg, exporterPool(t, db.DSN, 1, nil), nil, nil)
	got := scrapeFamilies(t, e)
	// jobs (2 backends) and the first of the 1-backend names stay; svc-api, svc-worker and
	// unknown become "other".
	want := `
# TYPE pg_liveness_backends gauge
pg_liveness_backends{application_name="jobs"} 2
pg_liveness_backends{application_name="other"} 3
pg_liveness_backends{application_name="pg_liveness_exporter"} 1
# TYPE pg_liveness_advisory_lock_holders gauge
pg_liveness_advisory_lock_holders{application_name="jobs",backend_state="active"} 1
pg_liveness_advisory_lock_holders{application_name="other",backend_state="idle"} 3
pg_liveness_advisory_lock_holders{application_name="pg_liveness_exporter",backend_state="active"} 0
# TYPE pg_liveness_advisory_lock_waiters gauge
pg_liveness_advisory_lock_waiters{application_name="jobs"} 1
pg_liveness_advisory_lock_waiters{application_name="other"} 0
pg_liveness_advisory_lock_waiters{application_name="pg_liveness_exporter"} 0
`
	only := map[string]*dto.MetricFamily{}
	for _, n := range []string{"pg_liveness_backends", "pg_liveness_advisory_lock_holders", "pg_liveness_advisory_lock_waiters"} {
		only[n] = got[n]
	}
	compareExposition(t, only, want)
	if v := value(got, "pg_liveness_advisory_lock_idle_holder_max_seconds", "application_name", "other"); !(v > 0) {
		t.Errorf("idle holder max of other = %v, want > 0 (folded from idle holders)", v)
	}
}

// TestLeasesPlainTable reads a plain leases table without an epoch column, named
// as schema.table and as a bare table on the search_path.
func TestLeasesPlainTable(t *testing.T) {
	db := pgtest.NewDB(t)
	c := db.ConnAs(t, "setup")
	for _, tbl := range []string{`blog.leases`, `public."Job Leases"`} {
		if strings.HasPrefix(tbl, "blog") {
			exec(t, c, `CREATE SCHEMA blog`)
		}
		exec(t, c, `CREATE TABLE `+tbl+` (name text PRIMARY KEY, holder text NOT NULL,
		               taken_at timestamptz NOT NULL DEFAULT now(), expires_at timestamptz NOT NULL)`)
		exec(t, c, `INSERT INTO `+tbl+` VALUES ('uptime', 'node-1:77:00ff00ff00ff00ff', now() - interval '10 s', now() + interval '110 s'),
		                                        ('mail', 'node-2', now() - interval '200 s', now() - interval '80 s')`)
	}
	want := `
# TYPE pg_liveness_lease_expires_in_seconds gauge
pg_liveness_lease_expires_in_seconds{lease="mail"} -80
pg_liveness_lease_expires_in_seconds{lease="uptime"} 110
# TYPE pg_liveness_lease_held gauge
pg_liveness_lease_held{lease="mail"} 0
pg_liveness_lease_held{lease="uptime"} 1
# TYPE pg_liveness_lease_holder_info gauge
pg_liveness_lease_holder_info{holder_host="node-1",holder_instance_id="",lease="uptime"} 1
pg_liveness_lease_holder_info{holder_host="node-2",holder_instance_id="",lease="mail"} 1
# TYPE pg_liveness_lease_held_for_seconds gauge
pg_liveness_lease_held_for_seconds{lease="mail"} 200
pg_liveness_lease_held_for_seconds{lease="uptime"} 10
# TYPE pg_liveness_leases_folded gauge
pg_liveness_leases_folded 0
# TYPE pg_liveness_lease_row_anomalies gauge
pg_liveness_lease_row_anomalies{kind="duplicate_name"} 0
pg_liveness_lease_row_anomalies{kind="invalid_utf8"} 0
pg_liveness_lease_row_anomalies{kind="null_name"} 0
pg_liveness_lease_row_anomalies{kind="null_value"} 0
# TYPE pg_liveness_database_down_reason gauge
pg_liveness_database_down_reason{reason="auth"} 0
pg_liveness_database_down_reason{reason="connection"} 0
pg_liveness_database_down_reason{reason="timeout"} 0
pg_liveness_database_down_reason{reason="tls"} 0
pg_liveness_database_down_reason{reason="unavailable"} 0
# TYPE pg_liveness_database_info gauge
pg_liveness_database_info{database_id="SYSID:OID",datname="DATNAME"} 1
# TYPE pg_liveness_scrape_collector_duration_seconds gauge
pg_liveness_scrape_collector_duration_seconds{collector="leases"} 0
# TYPE pg_liveness_scrape_collector_success gauge
pg_liveness_scrape_collector_success{collector="leases"} 1
# TYPE pg_liveness_up gauge
pg_liveness_up 1
`
	for _, table := range []string{"blog.leases", "Job Leases"} {
		t.Run(table, func(t *testing.T) {
			cfg := Config{Leases: LeasesConfig{Enabled: true, Table: table, MaxSeries: 10},
				ScrapeDefaultTimeout: 10 * time.Second}
			e := newExporter(t, cfg, exporterPool(t, db.DSN, 1, nil), nil, nil)
			got := scrapeFamilies(t, e)
			anonymizeIdentity(t, got, db.Name)
			compareExposition(t, got, want,
				approx{name: "pg_liveness_scrape_collector_duration_seconds", lo: 0, hi: 10},
				approx{name: "pg_liveness_lease_expires_in_seconds", lo: -60, hi: 0},
				approx{name: "pg_liveness_lease_held_for_seconds", lo: 0, hi: 60})
		})
	}
}
