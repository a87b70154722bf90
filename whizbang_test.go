package main

// The binary on a Whizbang database (--source=whizbang, internal/cli): read as it is, by
// every reader alike, and its flags' errors.

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/whizbangtest"
)

// The binary pointed at a Whizbang database, as a role with only SELECT on Whizbang's
// table and pg_read_all_stats (and read-only sessions), reports Whizbang's instances by
// our states, matches its alive locks, flags keys two instances share, and writes
// nothing.
func TestWhizbangSource(t *testing.T) {
	t.Parallel()
	_, db := ownServer(t)
	db.Exec(t, `CREATE EXTENSION pg_stat_statements`)
	f := whizbangtest.NewFixture(t, db)
	src := f.Source
	alive, lockOnly, hbOnly, stale, zombie := uuid.New(), uuid.New(), uuid.New(), uuid.New(), uuid.New()
	f.Register(t, alive, "orders", 0)
	f.Register(t, lockOnly, "orders", src.Timing.StaleThreshold+time.Second)
	f.Register(t, hbOnly, "billing", time.Second)
	f.Register(t, stale, "billing", src.Timing.StaleThreshold+time.Second)
	f.Register(t, zombie, "billing", src.Timing.DefinitiveDeadCutoff+time.Second)
	for _, id := range []uuid.UUID{alive, lockOnly, zombie} {
		if !f.Claim(t, id) {
			t.Fatal("claim failed")
		}
	}
	twinA, twinB := f.CollidingIDs(t)
	f.Register(t, twinA, "twins", 0)
	f.Register(t, twinB, "twins", 0)
	if !f.Claim(t, twinA) {
		t.Fatal("claim failed")
	}
	var writesBefore int64
	counted := func() int64 {
		var n int64
		if err := db.Pool(t, 1).QueryRow(context.Background(), `SELECT n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables
			WHERE relname = 'wh_service_instances'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	writesBefore = counted()

	e := startExporter(t, []string{"DATA_SOURCE_NAME=" + f.ObserverDSN}, "--no-agent", "--source=whizbang")
	body := e.waitFor(t, `(?m)^pg_liveness_scrape_collector_success\{collector="instances"\} 1`, 30*time.Second)
	for _, want := range []string{
		`pg_liveness_instances{service="orders",state="alive"} 1`,
		`pg_liveness_instances{service="orders",state="lock_only"} 1`,
		`pg_liveness_instances{service="billing",state="heartbeat_only"} 1`,
		`pg_liveness_instances{service="billing",state="stale"} 1`,
		`pg_liveness_instances{service="billing",state="zombie"} 1`,
		// The twins share a key: both judged by their fresh heartbeats.
		`pg_liveness_instances{service="twins",state="heartbeat_only"} 2`,
		`pg_liveness_instances_sharing_lock_key 2`,
		`pg_liveness_advisory_locks{granted="true",kind="alive_lock"} 4`,
		`pg_liveness_scrape_collector_success{collector="advisory_locks"} 1`,
		`pg_liveness_scrape_collector_success{collector="statements"} 1`,
		`pg_liveness_up 1`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("missing %s", want)
		}
	}
	// No leases table was given, and the schema of ours does not exist here.
	for _, absent := range []string{`collector="leases"`, `pg_liveness_schema_`} {
		if strings.Contains(body, absent) {
			t.Errorf("a Whizbang source exported %s", absent)
		}
	}
	if t.Failed() {
		t.Fatalf("scrape:\n%s", body)
	}
	// The status page reads the same source: every instance with its state, no errors.
	var page struct {
		Errors    []string `json:"errors"`
		Schema    any      `json:"schema"`
		Instances struct {
			Total int `json:"total"`
			Rows  []struct {
				InstanceID string `json:"instance_id"`
				State      string `json:"state"`
			} `json:"rows"`
		} `json:"instances"`
		AdvisoryLocks any `json:"advisory_locks"`
	}
	e.statusPage(t, &page)
	states := map[string]string{}
	for _, r := range page.Instances.Rows {
		states[r.InstanceID] = r.State
	}
	wantStates := map[uuid.UUID]string{alive: "alive", lockOnly: "lock_only", hbOnly: "heartbeat_only", stale: "stale",
		zombie: "zombie", twinA: "heartbeat_only", twinB: "heartbeat_only"}
	for id, want := range wantStates {
		if states[id.String()] != want {
			t.Errorf("/status.json: %s is %q, want %s", id, states[id.String()], want)
		}
	}
	if len(page.Errors) > 0 || page.Schema != nil || page.AdvisoryLocks == nil || page.Instances.Total != len(wantStates) {
		t.Errorf("/status.json: errors %v, schema %v, advisory locks %v, %d instances; want no errors, no schema, locks, %d",
			page.Errors, page.Schema, page.AdvisoryLocks, page.Instances.Total, len(wantStates))
	}
	if n := counted(); n != writesBefore {
		t.Fatalf("the table saw %d row writes while the exporter observed it", n-writesBefore)
	}
	if logs := e.Logs(); regexp.MustCompile(`level=(ERROR|WARN)`).MatchString(logs) {
		t.Fatalf("the observer logged a warning or an error:\n%s", logs)
	}
}

func TestWhizbangSourceErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--source=whizbang"}, "add --no-agent"},
		{[]string{"--source=whizbang", "--no-agent", "--source.whizbang.stale-threshold=30s"}, "--source.whizbang.stale-threshold"},
		{[]string{"--source=whizbang", "--no-agent", "--source.whizbang.lock-key-prefix="}, "--source.whizbang.lock-key-prefix"},
		{[]string{"--source=other"}, "--source"},
	} {
		code, out := runToExit(t, []string{"DATA_SOURCE_NAME=host=127.0.0.1 port=1 password=secret-pw"}, c.args...)
		if code == 0 || !strings.Contains(out, c.want) || strings.Contains(out, "secret-pw") {
			t.Errorf("%v: exit %d, output %q; want a failure naming %s and no password", c.args, code, out, c.want)
		}
	}
}

// A missing table is one clear log line that names the flags to check.
func TestWhizbangSourceMissingTable(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	e := startExporter(t, []string{"DATA_SOURCE_NAME=" + db.DSN}, "--no-agent", "--source=whizbang", "--source.whizbang.prefix=nope_")
	waitLog(t, e, "nope_service_instances does not exist")
	if !strings.Contains(e.Logs(), "--source.whizbang.prefix") {
		t.Fatalf("the log line does not name the flag (the exporter logs follow)")
	}
}

// --source.whizbang.prefix= (empty) means no prefix for every reader: the collectors and
// the status page both read public.service_instances, never the default
// wh_service_instances beside it.
func TestWhizbangEmptyPrefixOneTableForEveryReader(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	for _, table := range []string{"service_instances", "wh_service_instances"} {
		db.Exec(t, `CREATE TABLE public.`+table+` (
			instance_id uuid PRIMARY KEY, service_name text NOT NULL, host_name text NOT NULL, process_id integer NOT NULL,
			started_at timestamptz NOT NULL DEFAULT now(), last_heartbeat_at timestamptz NOT NULL DEFAULT now(), metadata jsonb)`)
		db.Exec(t, `INSERT INTO public.`+table+` (instance_id, service_name, host_name, process_id) VALUES ($1, $2, 'h', 1)`,
			uuid.New(), "from_"+table)
	}
	e := startExporter(t, []string{"DATA_SOURCE_NAME=" + db.DSN}, "--no-agent", "--source=whizbang", "--source.whizbang.prefix=")
	body := e.waitFor(t, `(?m)^pg_liveness_scrape_collector_success\{collector="instances"\} 1`, 30*time.Second)
	if !strings.Contains(body, `pg_liveness_instances{service="from_service_instances",state="heartbeat_only"} 1`) ||
		strings.Contains(body, "from_wh_service_instances") {
		t.Errorf("the collectors did not read public.service_instances alone:\n%s", body)
	}
	var page struct {
		Errors   []string `json:"errors"`
		Services []struct {
			Name string `json:"name"`
		} `json:"services"`
	}
	e.statusPage(t, &page)
	if len(page.Errors) > 0 || len(page.Services) != 1 || page.Services[0].Name != "from_service_instances" {
		t.Errorf("the status page read %+v (errors %v); want the service of public.service_instances alone", page.Services, page.Errors)
	}
}
