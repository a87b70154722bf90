package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/migrationstest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// The grants README.md documents under "Least privileges" are enough: an observer and an
// agent running with exactly those grants get every collector and the whole agent working.
func TestLeastPrivileges(t *testing.T) {
	srv := pgtest.NewServer(t)
	db := pgtest.NewDBOn(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := migrations.Apply(ctx, db.Pool(t, 1), "liveness"); err != nil {
		t.Fatal(err)
	}
	const pw = "least-priv-pw"
	db.Exec(t, `CREATE EXTENSION pg_stat_statements;
		CREATE ROLE liveness_observer LOGIN PASSWORD '`+pw+`';
		CREATE ROLE liveness_agent LOGIN PASSWORD '`+pw+`';
		CREATE ROLE someone_else LOGIN PASSWORD '`+pw+`'`)
	// The README's grants, verbatim in substance, to both roles (the agent's on top).
	for _, role := range []string{"liveness_observer", "liveness_agent"} {
		db.Exec(t, fmt.Sprintf(`GRANT CONNECT ON DATABASE %s TO %s;
			GRANT USAGE ON SCHEMA liveness TO %[2]s;
			GRANT SELECT ON liveness.instances, liveness.leases, liveness.schema_migrations,
			                liveness.instance_alive_locks, liveness.bigint_advisory_locks TO %[2]s;
			GRANT pg_read_all_stats TO %[2]s`, db.Name, role))
	}
	db.Exec(t, `GRANT INSERT, UPDATE, DELETE ON liveness.instances, liveness.leases TO liveness_agent;
		GRANT USAGE ON SEQUENCE liveness.lease_epoch_seq TO liveness_agent`)

	dsnFor := func(role string) string {
		return fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable", srv.Port, role, pw, db.Name)
	}
	// Another role's idle backend sits on an advisory lock: seeing its state needs
	// pg_read_all_stats.
	other := pgtest.Pool(t, dsnFor("someone_else")+" application_name=other-app", 1)
	if _, err := other.Exec(ctx, `SELECT pg_advisory_lock(4242)`); err != nil {
		t.Fatal(err)
	}
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, last_heartbeat_at)
		VALUES (gen_random_uuid(), 'gone', now() - interval '1 hour')`)

	// The timing is the default's: a beat's statement may take half an interval, so a
	// slow machine does not turn a late beat into a failure. The row to reap is an hour
	// old, so the reaper deletes it on its first round.
	agent := startExporter(t, []string{"DATA_SOURCE_NAME=" + dsnFor("liveness_agent")}, "--no-migrations.apply",
		"--agent.reaper-interval=200ms")
	body := agent.waitFor(t, `(?m)^pg_liveness_agent_instances_reaped_total [1-9]`, 30*time.Second)
	// What needs the grants is shown by what succeeded: the alive lock, a beat (INSERT or
	// UPDATE on instances) and a reap (DELETE); any statement refused names the grant in
	// the log. A beat that merely timed out is not about privileges, so failures are not
	// required to be zero.
	for _, want := range []string{
		`(?m)^pg_liveness_agent_alive_lock_held 1$`,
		`(?m)^pg_liveness_agent_heartbeats_total [1-9]`,
	} {
		if !regexp.MustCompile(want).MatchString(body) {
			t.Errorf("agent with least privileges: no %s", want)
		}
	}
	if strings.Contains(agent.Logs(), "permission denied") {
		t.Errorf("agent with least privileges hit a permission error:\n%s", agent.Logs())
	}
	checkCollectors(t, "agent", body, "instances", "leases", "advisory_locks", "statements", "agent")

	observer := startExporter(t, []string{"DATA_SOURCE_NAME=" + dsnFor("liveness_observer")}, "--no-agent", "--no-migrations.apply")
	body = observer.waitFor(t, `(?m)^pg_liveness_up 1$`, 30*time.Second)
	checkCollectors(t, "observer", body, "instances", "leases", "advisory_locks", "statements")
	for _, want := range []string{
		`pg_liveness_advisory_lock_holders{application_name="other-app",backend_state="idle"} 1`,
		`pg_liveness_stat_statements_available 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("observer with least privileges: no %q", want)
		}
	}
	if !strings.Contains(body, `state="alive"} 1`) {
		t.Errorf("observer does not see the agent alive")
	}
	if t.Failed() {
		t.Logf("observer scrape:\n%s", body)
	}

	// The same agent without --no-migrations.apply: the schema is current, so it needs
	// no CREATE privilege and joins.
	joiner := startExporter(t, []string{"DATA_SOURCE_NAME=" + dsnFor("liveness_agent")})
	body = joiner.waitFor(t, `(?m)^pg_liveness_agent_joined 1$`, 30*time.Second)
	for _, want := range []string{"pg_liveness_agent_alive_lock_held 1", "pg_liveness_schema_compatible 1", "pg_liveness_up 1"} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("agent with least privileges and migrations on: no %q", want)
		}
	}
	if strings.Contains(joiner.Logs(), "permission denied") {
		t.Errorf("agent with least privileges and migrations on hit a permission error:\n%s", joiner.Logs())
	}
}

// An agent that lacks a privilege it needs does not retry forever: it logs one line,
// keeps serving as an observer and says in pg_liveness_agent_joined that it has not
// joined, while pg_liveness_up stays about the database alone.
func TestMissingPrivilegeIsNotRetriedAndShows(t *testing.T) {
	srv := pgtest.NewServer(t)
	db := pgtest.NewDBOn(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// A schema one migration behind, which this role may not migrate.
	old := migrationstest.Future(t, 1)[:migrations.Latest()-1]
	if _, err := old.Apply(ctx, db.Pool(t, 1), "liveness"); err != nil {
		t.Fatal(err)
	}
	const pw = "no-create-pw"
	db.Exec(t, fmt.Sprintf(`CREATE ROLE weak LOGIN PASSWORD '%s';
		REVOKE CREATE ON DATABASE %s FROM PUBLIC;
		GRANT USAGE ON SCHEMA liveness TO weak;
		GRANT SELECT ON ALL TABLES IN SCHEMA liveness TO weak`, pw, db.Name))
	dsn := fmt.Sprintf("host=127.0.0.1 port=%d user=weak password=%s dbname=%s sslmode=disable", srv.Port, pw, db.Name)
	p := startExporter(t, []string{"DATA_SOURCE_NAME=" + dsn})
	p.waitFor(t, `(?m)^pg_liveness_agent_joined 0$`, 30*time.Second)
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(p.Logs(), "serving as an observer only") && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // a retry loop would log again within this
	logs := p.Logs()
	if n := strings.Count(logs, "serving as an observer only"); n != 1 {
		t.Fatalf("%d \"serving as an observer only\" lines, want 1:\n%s", n, logs)
	}
	if strings.Contains(logs, "retrying") {
		t.Errorf("a permission error was retried:\n%s", logs)
	}
	body := p.scrape(t)
	for _, want := range []string{"pg_liveness_agent_joined 0", "pg_liveness_up 1",
		fmt.Sprintf("pg_liveness_schema_version %d", migrations.Latest()-1)} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("no %q in:\n%s", want, body)
		}
	}
	if strings.Contains(logs, pw) || strings.Contains(body, pw) {
		t.Error("the password was printed")
	}
}

func checkCollectors(t *testing.T, who, body string, names ...string) {
	t.Helper()
	for _, c := range names {
		if !strings.Contains(body, `pg_liveness_scrape_collector_success{collector="`+c+`"} 1`) {
			t.Errorf("%s with least privileges: collector %s failed", who, c)
		}
	}
}
