package main

// The binary against the databases it meets: a wrong password, the least privileges
// docs/security.md documents and one missing, a schema a newer release migrated, an
// unsupported PostgreSQL major. It serves what it can and says why in /metrics and one log line.

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/migrationstest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// A wrong password is not retried on every scrape: with 10 scrapers for 6 seconds the
// server sees a handful of failed logins (one attempt shared by concurrent scrapes, then
// a doubling backoff), and /metrics says why pg_liveness_up is 0.
func TestWrongPasswordBacksOff(t *testing.T) {
	t.Parallel()
	srv, db := ownServer(t)
	newRole(t, srv, db, "wrongpw", "the-right-one")
	const pw = "not-the-password"
	dsn := roleDSN(srv, db, "wrongpw", pw)
	p := startExporter(t, []string{"DATA_SOURCE_NAME=" + dsn}, "--no-agent")
	p.waitFor(t, `(?m)^pg_liveness_database_down_reason\{reason="auth"\} 1$`, 30*time.Second)

	failedLogins := func() int {
		b, err := os.ReadFile(srv.LogFile())
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(b), `password authentication failed for user "wrongpw"`)
	}
	before := failedLogins()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	scrapes := 0
	for range 10 {
		wg.Go(func() {
			for ctx.Err() == nil {
				body := p.scrape(t)
				mu.Lock()
				if body != "" {
					scrapes++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	during := failedLogins() - before
	t.Logf("%d scrapes, %d failed logins", scrapes, during)
	if scrapes < 20 {
		t.Fatalf("only %d scrapes in 6 s: the test cannot tell", scrapes)
	}
	// Backoff 1 s, 2 s, 4 s, … : at most a few attempts in 6 s, whatever the scrape rate.
	if during > 6 {
		t.Errorf("%d failed logins during %d scrapes in 6 s, want at most 6", during, scrapes)
	}
	body := p.scrape(t)
	for _, want := range []string{"pg_liveness_up 0", `pg_liveness_database_down_reason{reason="auth"} 1`,
		`pg_liveness_database_down_reason{reason="connection"} 0`} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("no %q in /metrics", want)
		}
	}
	if strings.Contains(body, pw) || strings.Contains(p.Logs(), pw) {
		t.Error("the password was printed")
	}
}

// The grants docs/security.md documents under "Least privileges" are enough: an observer
// and an agent running with exactly those grants get every collector and the whole agent
// working.
func TestLeastPrivileges(t *testing.T) {
	t.Parallel()
	srv, db := ownServer(t)
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
	// docs/security.md's grants, verbatim in substance, to both roles (the agent's on top).
	for _, role := range []string{"liveness_observer", "liveness_agent"} {
		db.Exec(t, fmt.Sprintf(`GRANT CONNECT ON DATABASE %s TO %s;
			GRANT USAGE ON SCHEMA liveness TO %[2]s;
			GRANT SELECT ON liveness.instances, liveness.leases, liveness.schema_migrations,
			                liveness.instance_alive_locks, liveness.bigint_advisory_locks, liveness.history TO %[2]s;
			GRANT pg_read_all_stats TO %[2]s`, db.Name, role))
	}
	db.Exec(t, `GRANT INSERT, UPDATE, DELETE ON liveness.instances TO liveness_agent;
		GRANT EXECUTE ON FUNCTION liveness.lease_take(text, text, float8, uuid, text),
		    liveness.lease_extend(text, text, bigint, float8),
		    liveness.lease_extend_many(text[], text[], bigint[], float8),
		    liveness.lease_let_go(text, text, bigint), liveness.lease_abandon(text, text),
		    liveness.lease_detach(text, text, bigint),
		    liveness.watch_alive_locks(text), liveness.notify_dead_instances(uuid[]),
		    liveness.history_prune(interval, integer) TO liveness_agent`)

	dsnFor := func(role string) string { return roleDSN(srv, db, role, pw) }
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
		t.Errorf("agent with least privileges hit a permission error (the exporter logs follow)")
	}
	checkCollectors(t, "agent with least privileges", body, "instances", "leases", "advisory_locks", "statements", "agent")
	checkLeaseWritesOnlyByHolder(ctx, t, pgtest.Pool(t, dsnFor("liveness_agent"), 1))

	observer := startExporter(t, []string{"DATA_SOURCE_NAME=" + dsnFor("liveness_observer")}, "--no-agent", "--no-migrations.apply")
	body = observer.waitFor(t, `(?m)^pg_liveness_up 1$`, 30*time.Second)
	checkCollectors(t, "observer with least privileges", body, "instances", "leases", "advisory_locks", "statements")
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
		t.Errorf("agent with least privileges and migrations on hit a permission error (the exporter logs follow)")
	}
}

// An agent that lacks a privilege it needs does not retry forever: it logs one line,
// keeps serving as an observer and says in pg_liveness_agent_joined that it has not
// joined, while pg_liveness_up stays about the database alone.
func TestMissingPrivilegeIsNotRetriedAndShows(t *testing.T) {
	t.Parallel()
	srv, db := ownServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// A schema one migration behind, which this role may not migrate.
	old := migrationstest.Future(t, 1)[:migrations.Latest()-1]
	if _, err := old.Apply(ctx, db.Pool(t, 1), "liveness"); err != nil {
		t.Fatal(err)
	}
	const pw = "no-create-pw"
	dsn := newRole(t, srv, db, "weak", pw)
	db.Exec(t, fmt.Sprintf(`REVOKE CREATE ON DATABASE %s FROM PUBLIC;
		GRANT USAGE ON SCHEMA liveness TO weak;
		GRANT SELECT ON ALL TABLES IN SCHEMA liveness TO weak`, db.Name))
	p := startExporter(t, []string{"DATA_SOURCE_NAME=" + dsn})
	p.waitFor(t, `(?m)^pg_liveness_agent_joined 0$`, 30*time.Second)
	waitLog(t, p, "serving as an observer only")
	testutil.Never(t, 3*time.Second, "a permission error retried (a second observer line, or a retry)", func() bool {
		logs := p.Logs()
		return strings.Count(logs, "serving as an observer only") > 1 || strings.Contains(logs, "retrying")
	})
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

// A rolling upgrade: a later release has migrated the schema one version past this
// binary. When that migration still serves this binary's version, the binary runs
// normally; when it does not, the binary keeps serving as an observer, says why in
// /metrics, and writes nothing (no instance row). It never exits.
func TestOlderBinaryAgainstNewerSchema(t *testing.T) {
	t.Parallel()
	latest := migrations.Latest()
	// A newer schema serves at most what every migration in it serves.
	served := 1
	for _, m := range migrations.All() {
		served = max(served, m.CompatibleFrom)
	}
	for _, tc := range []struct {
		name       string
		compatFrom int
		want       []string
	}{
		{"compatible", 1, []string{
			"pg_liveness_schema_compatible 1", "pg_liveness_agent_joined 1", "pg_liveness_agent_alive_lock_held 1",
			fmt.Sprintf("pg_liveness_schema_compatible_from %d", served),
		}},
		{"incompatible", latest + 1, []string{
			"pg_liveness_schema_compatible 0", "pg_liveness_agent_joined 0", "pg_liveness_up 1",
			fmt.Sprintf("pg_liveness_schema_compatible_from %d", latest+1),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := pgtest.NewDB(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if _, err := migrationstest.Future(t, tc.compatFrom).Apply(ctx, db.Pool(t, 1), "liveness"); err != nil {
				t.Fatal(err)
			}
			const id = "5d0c3a8e-6f1b-4e8a-9d55-0b7c2f4e1a99"
			p := startExporter(t, []string{"DATA_SOURCE_NAME=" + db.DSN}, "--agent.instance-id="+id,
				"--agent.heartbeat-interval=300ms", "--agent.heartbeat-slow-interval=600ms",
				"--agent.stale-threshold=2s", "--agent.definitive-dead-cutoff=5s")
			p.waitFor(t, `(?m)^`+tc.want[0]+`$`, 30*time.Second)
			if tc.compatFrom > latest {
				// The agent would have beaten by now (a beat each 300 ms).
				testutil.Never(t, 2*time.Second, "the agent wrote its instance row on a schema it does not serve", func() bool {
					return db.QueryInt(t, `SELECT count(*) FROM liveness.instances WHERE instance_id = $1`, id) != 0
				})
			}
			body := p.waitFor(t, `(?m)^`+tc.want[1]+`$`, 30*time.Second)
			for _, want := range append(tc.want, fmt.Sprintf("pg_liveness_schema_version %d", latest+1),
				fmt.Sprintf("pg_liveness_schema_binary_version %d", latest)) {
				if !strings.Contains(body, want+"\n") {
					t.Errorf("no %q in /metrics", want)
				}
			}
			var rows int
			if err := db.Conn(t).QueryRow(ctx, `SELECT count(*) FROM liveness.instances WHERE instance_id = $1`, id).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{true: 1, false: 0}[tc.compatFrom <= latest]; rows != want {
				t.Errorf("%d instance rows for the agent, want %d", rows, want)
			}
			p.checkRunning(t, "the end of the test")
			if tc.compatFrom > latest && !strings.Contains(p.Logs(), "upgrade pg_liveness_exporter") {
				t.Errorf("no log line says to upgrade (the exporter logs follow)")
			}
			if t.Failed() {
				t.Logf("/metrics:\n%s", body)
			}
		})
	}
}

// On a real PostgreSQL 13, outside the supported range, the exporter says so in one line
// and keeps serving what it can: pg_liveness_up, the advisory-locks and leases
// collectors. (Its migrations need 14, so the agent does not join, and the instances and
// statements collectors fail, which their success metrics report.)
func TestUnsupportedMajorIsOneLineAndServes(t *testing.T) {
	t.Parallel()
	_, db := ownServer(t, pgtest.WithMajor(13))
	db.Exec(t, `CREATE EXTENSION pg_stat_statements`)
	p := startExporter(t, []string{"DATA_SOURCE_NAME=" + db.DSN})
	p.waitFor(t, `(?m)^pg_liveness_scrape_collector_success\{collector="advisory_locks"\} 1$`, 30*time.Second)
	body := p.waitFor(t, `(?m)^pg_liveness_up 1$`, 30*time.Second)
	for _, want := range []string{
		`pg_liveness_scrape_collector_success{collector="leases"} 1`,
		`pg_liveness_scrape_collector_success{collector="statements"} 0`,
		`pg_liveness_agent_joined 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	p.scrape(t) // more connections and scrapes: still one line
	if n := strings.Count(p.Logs(), "is not supported: the oldest supported major is 14"); n != 1 {
		t.Errorf("%d lines name the unsupported major, want 1", n)
	}
	if !strings.Contains(p.Logs(), "server_version=13.") {
		t.Errorf("the line does not name the server's version")
	}
}

// checkLeaseWritesOnlyByHolder: the agent's role, which the running agent's reaper lease
// was taken with, can neither write the leases table nor release, renew, detach or
// abandon that lease through the functions with what it can read of it (the holder
// column keeps the token's hash): only the acquisition holding the token can.
func checkLeaseWritesOnlyByHolder(ctx context.Context, t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var name, stored string
	var epoch int64
	if err := pool.QueryRow(ctx, `SELECT name, holder, epoch FROM liveness.leases WHERE expires_at > now() LIMIT 1`).
		Scan(&name, &stored, &epoch); err != nil {
		t.Fatalf("the reaper's lease: %v", err)
	}
	for _, sql := range []string{
		`DELETE FROM liveness.leases WHERE name = $1`,
		`UPDATE liveness.leases SET expires_at = now() WHERE name = $1`,
		`INSERT INTO liveness.leases (name, holder, epoch, taken_at, expires_at) VALUES ($1 || '-mine', 'x', 1, now(), now())`,
	} {
		if _, err := pool.Exec(ctx, sql, name); err == nil || !strings.Contains(err.Error(), "permission denied") {
			t.Errorf("%s: err %v, want permission denied", sql, err)
		}
	}
	var gone, detached, abandoned int64
	if err := pool.QueryRow(ctx, `SELECT liveness.lease_let_go($1, $2, $3), liveness.lease_detach($1, $2, $3),
	                                     liveness.lease_abandon($1, $2)`, name, stored, epoch).
		Scan(&gone, &detached, &abandoned); err != nil {
		t.Fatal(err)
	}
	var extended int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM liveness.lease_extend($1, $2, $3, 3600)`, name, stored, epoch).
		Scan(&extended); err != nil {
		t.Fatal(err)
	}
	if gone+detached+abandoned != 0 || extended != 0 {
		t.Errorf("with the stored holder, another acquisition released %d, detached %d, abandoned %d and extended %d of lease %q",
			gone, detached, abandoned, extended, name)
	}
	var still bool
	if err := pool.QueryRow(ctx, `SELECT count(*) = 1 FROM liveness.leases
	                                WHERE name = $1 AND epoch = $2 AND holder_instance_id IS NOT NULL
	                                  AND expires_at < now() + interval '1 hour'`, name, epoch).Scan(&still); err != nil || !still {
		t.Errorf("lease %q under epoch %d no longer as its holder left it (err %v)", name, epoch, err)
	}
	// Its own token works: a fresh acquisition of another name, renewed and let go.
	var mine int64
	if err := pool.QueryRow(ctx, `SELECT epoch FROM liveness.lease_take('least-priv-own', 'own-token', 30, NULL, 'h')`).
		Scan(&mine); err != nil {
		t.Fatalf("lease_take with the agent's grants: %v", err)
	}
	if err := pool.QueryRow(ctx, `SELECT liveness.lease_let_go('least-priv-own', 'own-token', $1)`, mine).Scan(&gone); err != nil || gone != 1 {
		t.Errorf("lease_let_go of its own acquisition: %d rows, err %v", gone, err)
	}
}
