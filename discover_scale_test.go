package main

// Discovery at scale: the databases of one server, scraped with /metrics at
// --probe.max-conns' default (20), within the scrape's deadline, every one up, the
// exporter's sessions never over the cap, and a dropped database gone within about one
// interval. make test runs it at 40 databases (its checks, at a scale a loaded 2-core
// machine meets whatever else runs); make bench-discovery at the 150 its defaults promise
// (docs/many-databases.md's figures), with PG_LIVENESS_DISCOVERY_DATABASES=150.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// scaleDatabases is the test's number of discovered databases: 40, or
// PG_LIVENESS_DISCOVERY_DATABASES (make bench-discovery: 150). At least 40: 25 of them are
// locked below, more than a server's turns.
func scaleDatabases(t *testing.T) int {
	v := os.Getenv("PG_LIVENESS_DISCOVERY_DATABASES")
	if v == "" {
		return 40
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 40 {
		t.Fatalf("PG_LIVENESS_DISCOVERY_DATABASES=%q: want a number of databases, at least 40", v)
	}
	return n
}

// scaleServer starts a server with n copies (d000, d001, …) of a migrated database that
// records one live instance, and returns it with the copies' names.
func scaleServer(t *testing.T, n int) (*pgtest.Server, []string) {
	t.Helper()
	s := pgtest.NewServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := s.Exec(ctx, "CREATE DATABASE tmpl"); err != nil {
		t.Fatal(err)
	}
	testdb.Migrate(t, s.DSN("tmpl"), "liveness")
	seed, err := pgx.Connect(ctx, s.DSN("tmpl"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = seed.Exec(ctx, `INSERT INTO liveness.instances (instance_id, service_name, last_heartbeat_at) VALUES (gen_random_uuid(), 'svc', now())`)
	_ = seed.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A template: discovery leaves it out.
	if err := s.Exec(ctx, "ALTER DATABASE tmpl IS_TEMPLATE true"); err != nil {
		t.Fatal(err)
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("d%03d", i)
		if err := s.Exec(ctx, "CREATE DATABASE "+names[i]+" TEMPLATE tmpl"); err != nil {
			t.Fatal(err)
		}
	}
	return s, names
}

// sessionPeak samples the exporter's sessions on the server (pg_stat_activity) every
// 20 ms until stop is called, which returns the most seen at once.
func sessionPeak(t *testing.T, s *pgtest.Server) (stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, s.AdminDSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	var peak atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		defer conn.Close(context.Background())
		for ctx.Err() == nil {
			var n int64
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_liveness_exporter:probe'`).Scan(&n); err == nil && n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	return func() int {
		cancel()
		wg.Wait()
		return int(peak.Load())
	}
}

func TestDiscoveryScrapesManyDatabasesWithinTheDeadline(t *testing.T) {
	t0 := time.Now()
	scale := scaleDatabases(t)
	s, names := scaleServer(t, scale)
	t.Logf("%d databases made in %s", len(names), time.Since(t0))
	dir := t.TempDir()
	cfg := writeFile(t, dir, "targets.yml", fmt.Sprintf("credentials:\n  c: {user: %s, password_file: %s, sslmode: disable}\n"+
		"discover:\n  s: {host: 127.0.0.1, port: %d, credentials: c, interval: 5s, max_databases: %d}\n",
		pgtest.Superuser, writeFile(t, dir, "pw", s.Password+"\n"), s.Port, scale))
	p := startExporter(t, nil, "--no-agent", "--config.file="+cfg) // --probe.max-conns 20, the default
	// down lists the databases not up 1, in one pass (upOf would scan the body once each).
	down := func(body string) []string {
		up := map[string]bool{}
		for l := range strings.Lines(body) {
			if rest, ok := strings.CutPrefix(l, `pg_liveness_up{database="s/`); ok {
				name, v, _ := strings.Cut(rest, `"} `)
				up[name] = strings.TrimSpace(v) == "1"
			}
		}
		var out []string
		for _, n := range names {
			if !up[n] {
				out = append(out, n)
			}
		}
		return out
	}
	testutil.Eventually(t, 90*time.Second, "the databases found", func() bool {
		body, _ := p.metrics(t, "10")
		return upOf(body, "s/"+names[len(names)-1]) != ""
	})
	t.Logf("found after %s", time.Since(t0))

	// Scrapes at Prometheus' default timeout (10 s, the deadline 9.5 s): every database
	// up in every answer, each answer well within the deadline, and the sessions never
	// over the cap.
	peak := sessionPeak(t, s)
	var slowest time.Duration
	for round := range 5 {
		body, took := p.metrics(t, "10")
		slowest = max(slowest, took)
		t.Logf("round %d: %s", round, took)
		if d := down(body); len(d) > 0 {
			t.Errorf("round %d: %d of %d databases not up 1 (%.80v…), answered after %s", round, len(d), len(names), d, took)
		}
		if took > 8*time.Second {
			t.Errorf("round %d: /metrics took %s, at the 9.5 s deadline", round, took)
		}
		if n := metricValue(t, p.scrape(t), "pg_liveness_exporter_probe_connections"); n > 20 {
			t.Errorf("round %d: the pools hold %v connections, over the cap of 20", round, n)
		}
	}
	most := peak()
	t.Logf("%d databases: the slowest of 5 answers %s, at most %d sessions of the exporter", len(names), slowest, most)
	if most > 20 {
		t.Errorf("the exporter held %d sessions on the server at once, over --probe.max-conns=20", most)
	}

	// Slow databases (their instances table locked by another session: each scrape of
	// them waits until it is taken back) cost the others no more than their share: 25 of
	// them, more than the 18 turns, the first by name (scraped first), and every other
	// database still answers up 1 in the same answer.
	locked := names[:25]
	ctx := context.Background()
	for _, name := range locked {
		c, err := pgx.Connect(ctx, s.AdminDSN(name))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, `BEGIN; LOCK TABLE liveness.instances IN ACCESS EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 2 {
		body, took := p.metrics(t, "10")
		t.Logf("round %d with %d databases locked: %s", round, len(locked), took)
		for _, d := range down(body) {
			if !slices.Contains(locked, d) {
				t.Errorf("round %d with %d databases locked: %s, not locked, is not up 1", round, len(locked), d)
			}
		}
		slow := 0 // the locked databases whose instances statement failed: they were slow
		for _, name := range locked {
			if strings.Contains(body, `pg_liveness_scrape_collector_success{database="s/`+name+`",collector="instances"} 0`) {
				slow++
			}
		}
		if slow != len(locked) {
			t.Errorf("round %d: %d of the %d locked databases failed their instances statement", round, slow, len(locked))
		}
		if took > 10*time.Second {
			t.Errorf("round %d with %d databases locked: /metrics took %s, past Prometheus' timeout", round, len(locked), took)
		}
	}

	// A dropped database leaves the list (/targets) within about one interval (5 s).
	dropped := names[len(names)/2]
	if err := s.Exec(ctx, "DROP DATABASE "+dropped+" WITH (FORCE)"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	testutil.Eventually(t, 60*time.Second, "the dropped database gone", func() bool {
		return !strings.Contains(p.get(t, "/targets"), ">s/"+dropped+"<")
	})
	gone := time.Since(start)
	t.Logf("the dropped database gone after %s", gone)
	if gone > 7*time.Second {
		t.Errorf("the dropped database stayed listed %s at interval 5s", gone)
	}
}
