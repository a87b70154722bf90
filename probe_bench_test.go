package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// probeBenchDatabases and probeBenchInstances are the scale the probe is measured at
// (docs/many-databases.md): 50 databases of 1,000 instances each, on one server.
const (
	probeBenchDatabases = 50
	probeBenchInstances = 1000
)

// BenchmarkProbeManyDatabases runs the real binary (built without the race detector)
// with --config.file naming 50 databases of 1,000 instances (and 10 leases) each on one
// server, at the default pool bounds (--probe.max-conns 20, 2 per target, 1 m idle), and
// probes the first 10, 25 and 50 targets one after another, as rounds interleaved in one
// run (10, 25, 50, 10, 25, 50, …), so that the three sizes share the machine's noise. For
// each size it reports the median probe, the exporter's CPU per round and per target
// (utime+stime from /proc), the most server sessions the exporter held, and at the end
// its resident memory. Not part of make test: run it with
//
//	go test -run '^$' -bench BenchmarkProbeManyDatabases -benchtime 1x -count 1 .
func BenchmarkProbeManyDatabases(b *testing.B) {
	bin := buildForBenchmark(b)
	srv := pgtest.NewServer(b)
	names := probeBenchData(b, srv)
	dir := b.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte(srv.Password+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "credentials:\n  bench: {user: %s, password_file: %s, sslmode: disable}\ntargets:\n", pgtest.Superuser, pw)
	for i, n := range names {
		fmt.Fprintf(&cfg, "  db%02d: {host: 127.0.0.1, port: %d, database: %s, credentials: bench}\n", i, srv.Port, n)
	}
	cfgFile := filepath.Join(dir, "targets.yml")
	if err := os.WriteFile(cfgFile, []byte(cfg.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	p := startBinary(b, bin, nil, "--no-agent", "--config.file="+cfgFile)
	client := &http.Client{Timeout: 15 * time.Second}
	if !testutil.Poll(30*time.Second, func() bool {
		resp, err := client.Get("http://" + p.addr + "/")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	}) {
		b.Fatal("the exporter did not listen within 30 s")
	}
	probe := func(target string) time.Duration {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+p.addr+"/probe?target="+target, nil)
		req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", "10")
		t0 := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(t0)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "\npg_liveness_up 1\n") ||
			!strings.Contains(string(body), `pg_liveness_scrape_collector_success{collector="instances"} 1`) {
			b.Fatalf("probe of %s: %s %.400s", target, resp.Status, body)
		}
		return took
	}
	admin, err := pgx.Connect(context.Background(), srv.AdminDSN("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close(context.Background())
	sessions := func() int {
		var n int
		if err := admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_liveness_exporter:probe'`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}
	for i := range names {
		probe(fmt.Sprintf("db%02d", i)) // warm up: every target's statements classified once
	}

	sizes := []int{10, 25, 50}
	type stats struct {
		probes   []time.Duration
		cpu      []time.Duration // per round
		sessions int
	}
	per := map[int]*stats{}
	for _, n := range sizes {
		per[n] = &stats{}
	}
	const rounds = 5
	b.ResetTimer()
	for range b.N {
		for range rounds {
			for _, n := range sizes {
				s := per[n]
				cpu0 := procCPU(b, p.Pid())
				for i := range n {
					s.probes = append(s.probes, probe(fmt.Sprintf("db%02d", i)))
				}
				s.cpu = append(s.cpu, procCPU(b, p.Pid())-cpu0)
				s.sessions = max(s.sessions, sessions())
			}
		}
	}
	b.StopTimer()
	for _, n := range sizes {
		s := per[n]
		slices.Sort(s.probes)
		slices.Sort(s.cpu)
		cpu := s.cpu[len(s.cpu)/2]
		b.ReportMetric(float64(s.probes[len(s.probes)/2].Microseconds())/1000, fmt.Sprintf("ms-median-probe-%d", n))
		b.ReportMetric(float64(cpu.Microseconds())/1000, fmt.Sprintf("ms-cpu-round-%d", n))
		b.ReportMetric(float64(cpu.Microseconds())/1000/float64(n), fmt.Sprintf("ms-cpu-per-target-%d", n))
		b.ReportMetric(float64(s.sessions), fmt.Sprintf("sessions-max-%d", n))
	}
	b.ReportMetric(procStatusMiB(b, p.Pid(), "VmRSS"), "MiB-RSS")
	b.ReportMetric(procStatusMiB(b, p.Pid(), "VmHWM"), "MiB-peak-RSS")
}

// probeBenchData makes one database of 1,000 instances over 5 services and 10 leases,
// migrated, and copies it 50 times (CREATE DATABASE … TEMPLATE); it returns their names.
func probeBenchData(b *testing.B, srv *pgtest.Server) []string {
	b.Helper()
	tmpl := pgtest.NewDBOn(b, srv)
	testdb.Migrate(b, tmpl.DSN, "liveness")
	tmpl.Exec(b, fmt.Sprintf(`INSERT INTO liveness.instances (instance_id, service_name, last_heartbeat_at)
		SELECT gen_random_uuid(), 'svc-' || (i %% 5), now() - (i %% 900) * interval '1 second' FROM generate_series(1, %d) i`, probeBenchInstances))
	tmpl.Exec(b, `INSERT INTO liveness.leases (name, holder, expires_at) SELECT 'job-' || i, gen_random_uuid()::text, now() + interval '1 hour' FROM generate_series(1, 10) i`)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var names []string
	for i := range probeBenchDatabases {
		name := "bench_" + strconv.Itoa(i)
		if err := srv.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+pgx.Identifier{tmpl.Name}.Sanitize()); err != nil {
			b.Fatal(err)
		}
		names = append(names, name)
	}
	return names
}

// procCPU is the process's user plus system CPU time so far (/proc/PID/stat, in clock
// ticks of 10 ms).
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	fields := strings.Fields(string(raw)[strings.LastIndexByte(string(raw), ')')+2:])
	utime, _ := strconv.Atoi(fields[11])
	stime, _ := strconv.Atoi(fields[12])
	return time.Duration(utime+stime) * 10 * time.Millisecond
}
