package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/pgtest"
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
			GRANT SELECT ON liveness.instances, liveness.leases,
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

	agent := startExporter(t, []string{"DATA_SOURCE_NAME=" + dsnFor("liveness_agent")}, "--no-migrations.apply",
		"--agent.heartbeat-interval=300ms", "--agent.heartbeat-slow-interval=600ms",
		"--agent.stale-threshold=2s", "--agent.definitive-dead-cutoff=5s", "--agent.reaper-interval=200ms")
	body := agent.waitFor(t, `(?m)^pg_liveness_agent_instances_reaped_total [1-9]`, 30*time.Second)
	for _, want := range []string{
		"pg_liveness_agent_alive_lock_held 1",
		"pg_liveness_agent_heartbeat_failures_total 0",
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("agent with least privileges: no %q", want)
		}
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
}

func checkCollectors(t *testing.T, who, body string, names ...string) {
	t.Helper()
	for _, c := range names {
		if !strings.Contains(body, `pg_liveness_scrape_collector_success{collector="`+c+`"} 1`) {
			t.Errorf("%s with least privileges: collector %s failed", who, c)
		}
	}
}
