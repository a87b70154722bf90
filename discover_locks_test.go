package main

// Discovery within a server reads pg_locks once per scrape and server: three databases
// of one server, each with instances that hold alive locks, others whose locks vanished,
// other advisory locks held and waited for; one database's schema predates migration
// 0012. Each discovered database's instance states and advisory-lock metrics are those
// its own read gives (/probe of the same database, which reads pg_locks itself), and
// over N scrapes of /metrics the server saw N server_advisory_locks and no per-database
// statement reading pg_locks, but for the old schema's verdict.

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// lockSeries are the series of body that the server's snapshot feeds, of one database
// (its database label removed, or none: /probe's), those of the test's own sessions
// (application_name="locker") only for the per-application families: the exporter's own
// sessions stand differently at the snapshot than during a database's own statement.
func lockSeries(body, database string) []string {
	var out []string
	families := regexp.MustCompile(`^pg_liveness_(instances|advisory_locks|advisory_lock_holders|advisory_lock_waiters|backends)\{`)
	for _, line := range strings.Split(body, "\n") {
		if !families.MatchString(line) {
			continue
		}
		if database != "" {
			l := `database="` + database + `"`
			if !strings.Contains(line, l) {
				continue
			}
			line = strings.NewReplacer(l+",", "", ","+l, "", l, "").Replace(line)
		}
		if strings.Contains(line, "application_name=") && !strings.Contains(line, `application_name="locker"`) {
			continue
		}
		out = append(out, line)
	}
	slices.Sort(out)
	return out
}

// lockedDB is a database with instances in several states and advisory locks.
func lockedDB(t *testing.T, s *pgtest.Server, upTo int) *pgtest.DB {
	t.Helper()
	db := pgtest.NewDBOn(t, s)
	ctx := testutil.Context(t, time.Minute)
	pool := db.Pool(t, 2)
	if _, err := migrations.Set(migrations.All()[:upTo]).Apply(ctx, pool, "liveness"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		svc, age string
		locked   bool
	}{{"fresh", "1 second", true}, {"fresh", "1 second", true}, {"slow", "2 minutes", true}, {"hung", "10 minutes", true},
		{"lost", "1 second", false}, {"gone", "3 minutes", false}} {
		id := uuid.New()
		db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock, lock_grace) VALUES ($1, $2, true, '1 hour')`, id, c.svc)
		if c.locked {
			if _, err := db.ConnAs(t, "locker").Exec(ctx, `SELECT liveness.claim_instance_alive_lock($1)`, id); err != nil {
				t.Fatal(err)
			}
		}
		db.Exec(t, `UPDATE liveness.instances SET last_heartbeat_at = now() - $2::interval WHERE instance_id = $1`, id, c.age)
	}
	// Other advisory locks: on a bigint key, on two int4 keys, and one waited for.
	holder := db.ConnAs(t, "locker")
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock(42), pg_advisory_lock(1, 2), pg_advisory_lock_shared(43)`); err != nil {
		t.Fatal(err)
	}
	waiter := db.ConnAs(t, "locker")
	waited := make(chan error, 1)
	go func() { _, err := waiter.Exec(ctx, `SELECT pg_advisory_lock(42)`); waited <- err }()
	t.Cleanup(func() {
		_ = holder.Close(context.Background()) // frees the waiter
		<-waited
	})
	testutil.Eventually(t, 10*time.Second, "the waiter waiting", func() bool {
		return db.QueryInt(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) == 1
	})
	return db
}

// statementCalls are the top-level calls of pg_stat_statements' entries on s, by
// database and tag, and the texts of those tagged instances by database.
func statementCalls(t *testing.T, s *pgtest.Server, admin *pgtest.DB) (calls map[string]map[string]int64, instancesTexts map[string][]string) {
	t.Helper()
	ctx := testutil.Context(t, 30*time.Second)
	rows, err := admin.Pool(t, 1).Query(ctx, `SELECT d.datname::text, s.query, s.calls FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE s.toplevel`)
	if err != nil {
		t.Fatal(err)
	}
	calls, instancesTexts = map[string]map[string]int64{}, map[string][]string{}
	tag := regexp.MustCompile(regexp.QuoteMeta(store.TagPrefix) + `([a-z_]+)`)
	for rows.Next() {
		var db, query string
		var n int64
		if err := rows.Scan(&db, &query, &n); err != nil {
			t.Fatal(err)
		}
		m := tag.FindStringSubmatch(query)
		if m == nil {
			continue
		}
		if calls[db] == nil {
			calls[db] = map[string]int64{}
		}
		calls[db][m[1]] += n
		if m[1] == store.Instances.Name() {
			instancesTexts[db] = append(instancesTexts[db], query)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return calls, instancesTexts
}

func TestDiscoveryReadsPgLocksOncePerScrapeAndServer(t *testing.T) {
	t.Parallel()
	s := pgtest.NewServer(t)
	dbs := []*pgtest.DB{lockedDB(t, s, migrations.Latest()), lockedDB(t, s, migrations.Latest()), lockedDB(t, s, store.VerdictOfLocksMigration-1)}
	admin := pgtest.NewDBOn(t, s) // no schema: not discovered
	admin.Exec(t, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	var ts []testTarget
	for i, db := range dbs {
		ts = append(ts, testTarget{name: fmt.Sprintf("t%d", i), srv: s, db: db})
	}
	dir := t.TempDir()
	cfg := targetsConfig(t, dir, ts)
	writeFile(t, dir, "targets.yml", string(must(os.ReadFile(cfg)))+fmt.Sprintf("discover:\n  s1: {host: 127.0.0.1, port: %d, credentials: server-%d, interval: 1m}\n", s.Port, s.Port))
	p := startExporter(t, nil, "--no-agent", "--config.file="+cfg, "--probe.max-conns=12", "--probe.max-conns-per-target=2")
	label := func(db *pgtest.DB) string { return "s1/" + db.Name }
	var body string
	testutil.Eventually(t, 30*time.Second, "every database found and up", func() bool {
		body, _ = p.metrics(t, "5")
		return !slices.ContainsFunc(dbs, func(db *pgtest.DB) bool { return upOf(body, label(db)) != "1" })
	})

	// (a) Each database's series are those of its own read of pg_locks (/probe).
	for i, db := range dbs {
		_, own, _ := p.probe(t, "target="+ts[i].name, "5")
		shared, mine := lockSeries(body, label(db)), lockSeries(own, "")
		if len(mine) < 10 || !slices.Equal(shared, mine) {
			t.Errorf("%s: the series of the server's snapshot differ from its own read's:\n%s\nown:\n%s",
				label(db), strings.Join(shared, "\n"), strings.Join(mine, "\n"))
		}
	}
	for _, want := range []string{`pg_liveness_instances{service="lost",state="lock_lost"} 1`, `pg_liveness_instances{service="hung",state="zombie"} 1`,
		`pg_liveness_advisory_locks{granted="false",kind="other"} 1`, `pg_liveness_advisory_locks{granted="true",kind="alive_lock"} 4`} {
		if !slices.Contains(lockSeries(body, label(dbs[0])), want) {
			t.Errorf("%s: no %s:\n%s", label(dbs[0]), want, strings.Join(lockSeries(body, label(dbs[0])), "\n"))
		}
	}

	// (b) Over N scrapes: N reads of the server's locks, and none of pg_locks by a
	// database's own statements, but the verdict of the schema older than 0012.
	admin.Exec(t, `SELECT pg_stat_statements_reset()`)
	const scrapes = 4
	for range scrapes {
		if body, _ := p.metrics(t, "5"); slices.ContainsFunc(dbs, func(db *pgtest.DB) bool { return upOf(body, label(db)) != "1" }) {
			t.Fatalf("a database down:\n%s", body)
		}
	}
	calls, texts := statementCalls(t, s, admin)
	var snapshots int64
	for _, byTag := range calls {
		snapshots += byTag[store.ServerAdvisoryLocks.Name()]
	}
	if snapshots != scrapes {
		t.Errorf("server_advisory_locks sent %d times in %d scrapes, want once per scrape: %v", snapshots, scrapes, calls)
	}
	for i, db := range dbs {
		c := calls[db.Name]
		if c[store.AdvisoryLocks.Name()] != 0 || c[store.AdvisoryLocksOfSnapshot.Name()] != scrapes || c[store.Instances.Name()] != scrapes {
			t.Errorf("%s: %v, want %d instances and advisory_locks_of_snapshot, no advisory_locks", label(db), c, scrapes)
		}
		for _, q := range texts[db.Name] {
			ofLocks := strings.Contains(q, "instance_state_verdicts_of_locks")
			if old := i == 2; ofLocks == old {
				t.Errorf("%s (schema older than 0012: %v): its instances statement is %.300q", label(db), old, q)
			}
		}
	}
	// (d) The old schema is logged once, not per scrape.
	if n := strings.Count(p.Logs(), "predates migration 0012"); n != 1 {
		t.Errorf("the schema older than 0012 logged %d times, want once:\n%s", n, p.Logs())
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
