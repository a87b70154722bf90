package collector

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pg-liveness/pg_liveness_exporter/internal/pgtest"
)

// Scale of DESIGN §7's scrape budget.
const (
	benchInstances  = 10000
	benchServices   = 20
	benchLeases     = 1000
	benchBackends   = 50
	benchAliveLocks = 30 // per backend; with benchOtherLocks, 2,000 held locks in all
	benchOtherLocks = 10
	benchStatements = 5000
)

// BenchmarkScrape measures whole scrapes through the Handler (collection, exposition
// encoding) against a database at the scale of the budget: 10,000 instances (1,500 of
// them holding their alive lock), 1,000 leases, 2,000 advisory locks held over 50
// backends, and 5,000 pg_stat_statements entries. Besides ns/op and allocs it reports
// the median and 90th percentile scrape, the statements sent per scrape (each one round
// trip), and the RSS of the whole test process (which also holds the 50 lock holders'
// connections and the setup's garbage).
func BenchmarkScrape(b *testing.B) {
	dsn := setupBench(b)
	for _, name := range []string{"all", NameInstances, NameLeases, NameAdvisoryLocks, NameStatements, NameAgent} {
		b.Run(name, func(b *testing.B) {
			cfg := DefaultConfig()
			if name != "all" {
				cfg.Instances.Enabled = name == NameInstances
				cfg.Leases.Enabled = name == NameLeases
				cfg.AdvisoryLocks.Enabled = name == NameAdvisoryLocks
				cfg.Statements.Enabled = name == NameStatements
				cfg.Agent.Enabled = name == NameAgent
			}
			qc := &queryCounter{}
			e := newExporter(b, cfg, exporterPool(b, dsn, 2, qc), testAgent, nil)
			h := e.Handler(nil, promhttp.HandlerOpts{})
			scrape := func() {
				req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
				req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", "10")
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				body := rec.Body.String()
				if rec.Code != http.StatusOK || !strings.Contains(body, "\npg_liveness_up 1\n") {
					b.Fatalf("scrape failed: %d %.500s", rec.Code, body)
				}
				for l := range strings.Lines(body) {
					if strings.HasPrefix(l, "pg_liveness_scrape_collector_success") && strings.HasSuffix(l, " 0\n") {
						b.Fatalf("collector failed: %s", l)
					}
				}
			}
			// Warm up: connections, prepared statements, and the statement classification
			// of the exporter's own new entries.
			for range 3 {
				scrape()
			}
			times := make([]time.Duration, 0, b.N)
			before := qc.n.Load()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				scrape()
				times = append(times, time.Since(t0))
			}
			b.StopTimer()
			slices.Sort(times)
			b.ReportMetric(float64(qc.n.Load()-before)/float64(b.N), "queries/scrape")
			b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "ms-median")
			b.ReportMetric(float64(times[len(times)*9/10].Microseconds())/1000, "ms-p90")
			b.ReportMetric(rssMiB(b), "MiB-RSS")
		})
	}
}

// rssMiB reads the test process's resident set size.
func rssMiB(b *testing.B) float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb / 1024
		}
	}
	b.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// setupBench builds the budget's database on a server of its own, where
// pg_stat_statements can keep more than its default 5,000 entries.
func setupBench(b *testing.B) string {
	b.Helper()
	start := time.Now()
	srv := pgtest.NewServer(b, pgtest.WithSetting("pg_stat_statements.max", "10000"))
	db := pgtest.NewDBOn(b, srv)
	migrate(b, db, "liveness")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	setup, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		b.Fatal(err)
	}
	defer setup.Close(context.Background())
	run := func(sql string, args ...any) {
		if _, err := setup.Exec(ctx, sql, args...); err != nil {
			b.Fatalf("%.80s: %v", sql, err)
		}
	}
	run(`CREATE EXTENSION pg_stat_statements`)
	run(`INSERT INTO liveness.instances (instance_id, service_name, host_name, process_id, last_heartbeat_at)
	     SELECT gen_random_uuid(), 'service-' || (i % $2), 'host-' || (i % 500), i,
	            now() - make_interval(secs => (i * 7919) % 900)
	       FROM generate_series(1, $1) i`, benchInstances, benchServices)
	run(`INSERT INTO liveness.leases (name, holder, taken_at, expires_at)
	     SELECT 'job-' || i, 'host-' || (i % 50) || ':' || i || ':00ff00ff00ff00ff',
	            now() - interval '1 minute', now() + make_interval(secs => (i % 240) - 120)
	       FROM generate_series(1, $1) i`, benchLeases)

	// 5,000 distinct statements: each selects a different ordered pair of columns of a
	// wide table, so each has its own queryid. They run inside a DO block, as nested
	// statements, which pg_stat_statements.track=all records.
	cols := make([]string, 100)
	for i := range cols {
		cols[i] = fmt.Sprintf("c%d int", i)
	}
	run(`CREATE TABLE wide (` + strings.Join(cols, ", ") + `)`)
	run(fmt.Sprintf(`DO $$ BEGIN
	    FOR n IN 0..%d LOOP
	        EXECUTE format('SELECT c%%s, c%%s FROM wide', n / 100, n %% 100);
	    END LOOP; END $$`, benchStatements-1))
	for range 10 {
		run(`/* pg_liveness:heartbeat */ UPDATE liveness.instances SET last_heartbeat_at = now() WHERE instance_id = $1`,
			"00000000-0000-0000-0000-000000000000")
	}
	var entries int
	if err := setup.QueryRow(ctx, `SELECT count(*) FROM pg_stat_statements`).Scan(&entries); err != nil || entries < benchStatements {
		b.Fatalf("pg_stat_statements has %d entries (%v), want at least %d", entries, err, benchStatements)
	}

	// 50 backends, each holding 30 alive locks and 10 other advisory locks, idle.
	for i := range benchBackends {
		cfg, err := pgx.ParseConfig(db.DSN)
		if err != nil {
			b.Fatal(err)
		}
		cfg.RuntimeParams["application_name"] = fmt.Sprintf("service-%d", i%benchServices)
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close(context.Background()) })
		if _, err := c.Exec(ctx, `SELECT liveness.claim_instance_alive_lock(instance_id)
		                             FROM liveness.instances ORDER BY instance_id OFFSET $1 LIMIT $2`,
			i*benchAliveLocks, benchAliveLocks); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Exec(ctx, `SELECT pg_advisory_lock(k) FROM generate_series($1::bigint, $2::bigint) k`,
			int64(i*benchOtherLocks), int64((i+1)*benchOtherLocks-1)); err != nil {
			b.Fatal(err)
		}
	}
	var held int
	if err := setup.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted`).Scan(&held); err != nil ||
		held != benchBackends*(benchAliveLocks+benchOtherLocks) {
		b.Fatalf("%d advisory locks held (%v), want %d", held, err, benchBackends*(benchAliveLocks+benchOtherLocks))
	}
	run(`VACUUM ANALYZE`)
	b.Logf("setup took %s: %d instances, %d leases, %d advisory locks over %d backends, %d pg_stat_statements entries",
		time.Since(start).Round(time.Millisecond), benchInstances, benchLeases, held, benchBackends, entries)
	return db.DSN
}
