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
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// BenchmarkDiscoveryAgainstProbe compares one scrape of /metrics of an exporter whose
// discover entry finds the 50 databases of BenchmarkProbeManyDatabases (1,000 instances
// each, one server) with the same 50 scraped one after another through /probe of a
// second exporter: the same binary, the default pool bounds, each logged in as a role of
// its own. Rounds alternate which goes first. It reports each side's median (the probes'
// sum per round), exporter CPU per round (utime+stime, 10 ms ticks), the server's CPU
// per round (/proc, around each side's turn), the planning plus
// execution that pg_stat_statements counts for the role per round (elapsed time: it
// grows with the statements running at once, not only with their work), and
// discovery / probes for each. Not part of make test: run it with
//
//	go test -run '^$' -bench BenchmarkDiscoveryAgainstProbe -benchtime 1x -count 1 .
func BenchmarkDiscoveryAgainstProbe(b *testing.B) {
	bin := buildForBenchmark(b)
	srv := pgtest.NewServer(b)
	names := probeBenchData(b, srv)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, srv.AdminDSN("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close(ctx)
	// The template the copies were made from holds the table too; discovery would find
	// it, /probe has no target for it.
	var tmpl string
	if err := admin.QueryRow(ctx, `SELECT datname FROM pg_database WHERE NOT datistemplate AND datname <> 'postgres'
	        AND datname <> ALL($1) LIMIT 1`, names).Scan(&tmpl); err != nil {
		b.Fatal(err)
	}
	if err := srv.Exec(ctx, "DROP DATABASE "+pgx.Identifier{tmpl}.Sanitize()+" WITH (FORCE)"); err != nil {
		b.Fatal(err)
	}
	for _, sql := range []string{
		`CREATE EXTENSION IF NOT EXISTS pg_stat_statements`,
		`CREATE ROLE bench_discover LOGIN SUPERUSER PASSWORD '` + srv.Password + `'`,
		`CREATE ROLE bench_probe LOGIN SUPERUSER PASSWORD '` + srv.Password + `'`,
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	dir := b.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte(srv.Password+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			b.Fatal(err)
		}
		return p
	}
	var probeCfg strings.Builder
	fmt.Fprintf(&probeCfg, "credentials:\n  bench: {user: bench_probe, password_file: %s, sslmode: disable}\ntargets:\n", pw)
	for i, n := range names {
		fmt.Fprintf(&probeCfg, "  db%02d: {host: 127.0.0.1, port: %d, database: %s, credentials: bench}\n", i, srv.Port, n)
	}
	discoverCfg := fmt.Sprintf("credentials:\n  bench: {user: bench_discover, password_file: %s, sslmode: disable}\n"+
		"discover:\n  server: {host: 127.0.0.1, port: %d, credentials: bench}\n", pw, srv.Port)
	prober := startBinary(b, bin, nil, "--no-agent", "--config.file="+write("probe.yml", probeCfg.String()))
	discoverer := startBinary(b, bin, nil, "--no-agent", "--config.file="+write("discover.yml", discoverCfg))

	client := &http.Client{Timeout: 30 * time.Second}
	get := func(url string) (string, time.Duration) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", "10")
		t0 := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("%s: %s %.400s", url, resp.Status, body)
		}
		return string(body), time.Since(t0)
	}
	// Wait until discovery has found every database and each one answers.
	var last string
	if !testutil.Poll(60*time.Second, func() bool {
		resp, err := client.Get("http://" + discoverer.addr + "/metrics")
		if err != nil {
			return false
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body := string(raw)
		last = body
		return answered(body) == len(names)
	}) {
		var lines []string
		for l := range strings.Lines(last) {
			if strings.Contains(l, "collector_success") && len(lines) < 8 {
				lines = append(lines, l)
			}
		}
		b.Fatalf("discovery did not find the 50 databases within 60 s:\n%s", strings.Join(lines, ""))
	}
	probeAll := func() time.Duration {
		var sum time.Duration
		for i := range names {
			body, d := get(fmt.Sprintf("http://%s/probe?target=db%02d", prober.addr, i))
			if !strings.Contains(body, `pg_liveness_scrape_collector_success{collector="instances"} 1`) {
				b.Fatalf("probe of db%02d: %.400s", i, body)
			}
			sum += d
		}
		return sum
	}
	scrape := func() time.Duration {
		body, d := get("http://" + discoverer.addr + "/metrics")
		if n := answered(body); n != len(names) {
			b.Fatalf("the discovered scrape has %d databases answering, want %d", n, len(names))
		}
		return d
	}
	for range 2 { // warm up: connections, statement classification
		probeAll()
		scrape()
	}
	execTime := func(role string) time.Duration {
		var ms float64
		if err := admin.QueryRow(ctx, `SELECT coalesce(sum(s.total_exec_time + s.total_plan_time), 0)::float8
		      FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid WHERE r.rolname = $1`, role).Scan(&ms); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ms * float64(time.Millisecond))
	}
	// The server's CPU so far: the postmaster's and its live children's, and what its
	// exited children used (cutime, cstime). Per role it cannot be told: at 20
	// connections for 50 targets the pools close and open backends all the time, and an
	// exited backend's CPU is only in the postmaster's total. The sides take turns, so a
	// turn's difference is that side's (with the server's own background work).
	// pg_stat_statements counts elapsed time, which grows with the statements running at
	// once on two cores, not only with their work.
	var pm int
	if err := admin.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pm); err != nil {
		b.Fatal(err)
	}
	pm = ppid(b, pm)
	serverCPU := func() time.Duration {
		total := procCPU(b, pm) + procChildrenCPU(b, pm)
		kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pm, pm))
		if err != nil {
			b.Fatal(err)
		}
		for _, f := range strings.Fields(string(kids)) {
			pid, _ := strconv.Atoi(f)
			if _, err := os.Stat(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
				total += procCPU(b, pid)
			}
		}
		return total
	}
	type side struct {
		name  string
		pid   int
		role  string
		run   func() time.Duration
		wall  []time.Duration
		cpu   []time.Duration
		db    []time.Duration
		exec0 time.Duration
		exec  time.Duration
	}
	sides := []*side{
		{name: "discovery", pid: discoverer.Pid(), role: "bench_discover", run: scrape},
		{name: "probes", pid: prober.Pid(), role: "bench_probe", run: probeAll},
	}
	for _, s := range sides {
		s.exec0 = execTime(s.role)
	}
	const rounds = 8
	b.ResetTimer()
	for range b.N {
		for r := range rounds {
			for j := range sides {
				s := sides[(j+r)%len(sides)]
				c0, d0 := procCPU(b, s.pid), serverCPU()
				s.wall = append(s.wall, s.run())
				s.cpu = append(s.cpu, procCPU(b, s.pid)-c0)
				s.db = append(s.db, serverCPU()-d0)
			}
		}
	}
	b.StopTimer()
	median := func(ds []time.Duration) time.Duration {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	msOf := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	mean := func(ds []time.Duration) time.Duration {
		var sum time.Duration
		for _, d := range ds {
			sum += d
		}
		return sum / time.Duration(len(ds))
	}
	var m [2][4]float64
	for i, s := range sides {
		s.exec = (execTime(s.role) - s.exec0) / time.Duration(b.N*rounds)
		m[i] = [4]float64{msOf(median(s.wall)), msOf(mean(s.cpu)), msOf(mean(s.db)), msOf(s.exec)}
		b.ReportMetric(m[i][0], "ms-median-"+s.name)
		b.ReportMetric(m[i][1], "ms-cpu-"+s.name)
		b.ReportMetric(m[i][2], "ms-server-cpu-"+s.name)
		b.ReportMetric(m[i][3], "ms-server-elapsed-"+s.name)
	}
	for k, unit := range []string{"x-median", "x-cpu", "x-server-cpu", "x-server-elapsed"} {
		b.ReportMetric(m[0][k]/m[1][k], unit)
	}
}

// answered counts the discovered databases whose instances collector succeeded.
func answered(body string) int {
	n := 0
	for l := range strings.Lines(body) {
		if strings.HasPrefix(l, `pg_liveness_scrape_collector_success{database="server/`) &&
			strings.HasSuffix(l, `,collector="instances"} 1`+"\n") {
			n++
		}
	}
	return n
}

// ppid is a process's parent.
func ppid(b *testing.B, pid int) int {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	fields := strings.Fields(string(raw)[strings.LastIndexByte(string(raw), ')')+2:])
	p, _ := strconv.Atoi(fields[1])
	return p
}

// procChildrenCPU is the CPU of a process's exited and reaped children (cutime +
// cstime), in clock ticks of 10 ms.
func procChildrenCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	fields := strings.Fields(string(raw)[strings.LastIndexByte(string(raw), ')')+2:])
	cutime, _ := strconv.Atoi(fields[13])
	cstime, _ := strconv.Atoi(fields[14])
	return time.Duration(cutime+cstime) * 10 * time.Millisecond
}
