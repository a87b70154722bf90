package main

// /probe against two real servers with several databases each: every target answers
// for its own database, a stopped server's targets say so while the other's answer on
// time, and a hung server (every process stopped with SIGSTOP) costs only its own
// targets their deadline. The configuration file's errors exit 2 with one line naming
// the field, and SIGHUP keeps the last valid file.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// testTarget is one database of the test's servers, as --config.file names it.
type testTarget struct {
	name string
	srv  *pgtest.Server
	db   *pgtest.DB
}

// probe GETs /probe with the query and the scrape timeout header, returning the status,
// the body and how long it took.
func (p *exporterProc) probe(t testing.TB, query string, timeout string) (int, string, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+"/probe?"+query, nil)
	req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", timeout)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil { // code 0: the callers' checks fail, or wait
		return 0, err.Error(), time.Since(start)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), time.Since(start)
}

// targetsConfig writes --config.file for the targets, with one password file per
// server, and returns its path.
func targetsConfig(t *testing.T, dir string, ts []testTarget) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("credentials:\n")
	seen := map[int]bool{}
	for _, tg := range ts {
		if seen[tg.srv.Port] {
			continue
		}
		seen[tg.srv.Port] = true
		pw := writeFile(t, dir, fmt.Sprintf("pw-%d", tg.srv.Port), tg.srv.Password+"\n")
		fmt.Fprintf(&b, "  server-%d: {user: %s, password_file: %s, sslmode: disable}\n", tg.srv.Port, pgtest.Superuser, pw)
	}
	b.WriteString("targets:\n")
	for _, tg := range ts {
		fmt.Fprintf(&b, "  %s: {host: 127.0.0.1, port: %d, database: %s, credentials: server-%d}\n", tg.name, tg.srv.Port, tg.db.Name, tg.srv.Port)
	}
	return writeFile(t, dir, "targets.yml", b.String())
}

// seedService migrates db and records one live instance of service there.
func seedService(t *testing.T, db *pgtest.DB, service string) {
	t.Helper()
	testdb.Migrate(t, db.DSN, "liveness")
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, last_heartbeat_at) VALUES (gen_random_uuid(), $1, now())`, service)
}

func TestProbeAnswersPerTargetAndIsolatesADownServer(t *testing.T) {
	s1, s2 := pgtest.NewServer(t), pgtest.NewServer(t)
	var ts []testTarget
	for i, srv := range []*pgtest.Server{s1, s2} {
		for j := range 3 {
			tg := testTarget{name: fmt.Sprintf("s%d-db%d", i+1, j+1), srv: srv, db: pgtest.NewDBOn(t, srv)}
			seedService(t, tg.db, "svc-"+tg.name)
			ts = append(ts, tg)
		}
	}
	cfg := targetsConfig(t, t.TempDir(), ts)
	p := startExporter(t, nil, "--no-agent", "--config.file="+cfg, "--probe.max-conns=8", "--probe.max-conns-per-target=2")
	testutil.Eventually(t, 15*time.Second, "the exporter serving", func() bool {
		code, _, _ := p.probe(t, "target="+ts[0].name, "5")
		return code == http.StatusOK
	})

	// Every target answers for its own database, and only for it.
	for _, tg := range ts {
		code, body, _ := p.probe(t, "target="+tg.name, "5")
		if code != http.StatusOK || !strings.Contains(body, "\npg_liveness_up 1\n") {
			t.Fatalf("%s: %d\n%s", tg.name, code, body)
		}
		checkCollectors(t, tg.name, body, "instances", "leases", "advisory_locks", "statements")
		for _, other := range ts {
			has := strings.Contains(body, `service="svc-`+other.name+`"`)
			if has != (other.name == tg.name) {
				t.Errorf("probe of %s: service of %s shown: %v", tg.name, other.name, has)
			}
		}
	}
	// collector= selects collectors.
	_, body, _ := p.probe(t, "target="+ts[0].name+"&collector=leases&collector=instances", "5")
	checkCollectors(t, "selected", body, "instances", "leases")
	if strings.Contains(body, `collector="advisory_locks"`) || strings.Contains(body, "pg_liveness_backends") {
		t.Errorf("collector=leases&collector=instances ran advisory_locks:\n%s", body)
	}
	// Bad requests are the probe package's tests (TestBadRequestsNameTheParameter).

	// s2 stops: its targets are down, s1's answer on time, probed at the same moments.
	s2.Stop()
	probeAll := func(timeout string) map[string]probeResult {
		var mu sync.Mutex
		out := map[string]probeResult{}
		var wg sync.WaitGroup
		for _, tg := range ts {
			wg.Go(func() {
				code, body, took := p.probe(t, "target="+tg.name, timeout)
				mu.Lock()
				out[tg.name] = probeResult{code, body, took}
				mu.Unlock()
			})
		}
		wg.Wait()
		return out
	}
	for round := range 3 {
		for name, r := range probeAll("5") {
			up := "1"
			if strings.HasPrefix(name, "s2-") {
				up = "0"
			}
			if r.code != http.StatusOK || !strings.Contains(r.body, "\npg_liveness_up "+up+"\n") {
				t.Fatalf("round %d, server 2 stopped: %s: %d, want pg_liveness_up %s\n%s", round, name, r.code, up, r.body)
			}
			// Sessions the shutdown ended are "unavailable", new ones refused "connection".
			if up == "0" && !regexp.MustCompile(`pg_liveness_database_down_reason\{reason="(connection|unavailable)"\} 1`).MatchString(r.body) {
				t.Errorf("%s: down, but not for a connection:\n%s", name, r.body)
			}
		}
	}

	// s2 comes back, then hangs: every process of it stopped, so its connections neither
	// answer nor fail. Its targets take their deadline (3 s less the 0.5 s offset); s1's
	// do not wait for them.
	if err := s2.Start(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "server 2's targets up again", func() bool {
		_, body, _ := p.probe(t, "target=s2-db1", "5")
		return strings.Contains(body, "\npg_liveness_up 1\n")
	})
	hang(t, s2)
	for round := range 2 {
		results := probeAll("3")
		for name, r := range results {
			if r.code != http.StatusOK {
				t.Fatalf("round %d, server 2 hung: %s: %d\n%s", round, name, r.code, r.body)
			}
			if strings.HasPrefix(name, "s1-") {
				// The bound is the behaviour's, generous for a loaded machine: well under
				// the hung targets' 2.5 s deadline.
				if !strings.Contains(r.body, "\npg_liveness_up 1\n") || r.took > 2*time.Second {
					t.Errorf("round %d, server 2 hung: %s took %s, up 1: %v", round, name, r.took, strings.Contains(r.body, "\npg_liveness_up 1\n"))
				}
				continue
			}
			if !strings.Contains(r.body, "\npg_liveness_up 0\n") || r.took < 2*time.Second {
				t.Errorf("round %d: hung %s answered in %s:\n%s", round, name, r.took, r.body)
			}
		}
	}
	// The pools stayed under the cap throughout, and nothing printed a password.
	m := p.scrape(t)
	if n := metricValue(t, m, "pg_liveness_exporter_probe_connections"); n > 8 {
		t.Errorf("%v connections, cap 8", n)
	}
	for _, pw := range []string{s1.Password, s2.Password} {
		if strings.Contains(p.Logs(), pw) || strings.Contains(m, pw) {
			t.Fatal("a password is in the logs or /metrics")
		}
	}
}

type probeResult struct {
	code int
	body string
	took time.Duration
}

// hang stops every process of srv with SIGSTOP until the test ends, the postmaster
// first (so that it forks no more) and then each of its children (each backend leads a
// session of its own): a server that accepts TCP connections and never answers, which
// no configuration of a running server produces.
func hang(t *testing.T, srv *pgtest.Server) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(srv.SocketDir(), "data", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		t.Fatal(err)
	}
	pids := []int{pid}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	children, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(children)) {
		c, _ := strconv.Atoi(f)
		if err := syscall.Kill(c, syscall.SIGSTOP); err == nil {
			pids = append(pids, c)
		}
	}
	t.Cleanup(func() {
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGCONT)
		}
	})
}

// metricValue is the value of the sample named exactly name (no labels).
func metricValue(t *testing.T, body, name string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no %s in:\n%s", name, body)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

func TestProbeConfigurationErrorsAndReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pw := writeFile(t, dir, "pw", "hunter2secret\n")
	for name, c := range map[string]struct {
		yaml string
		args []string
		want string
	}{
		"unknown credentials": {"targets:\n  orders: {host: h, database: d, credentials: nobody}\n", nil, `--config.file ` + dir + `/config.yml: line 2: targets.orders.credentials: no credentials named "nobody"`},
		"unknown field":       {"targets:\n  orders: {dsn: x}\n", nil, "--config.file " + dir + "/config.yml: line 2: targets.orders.dsn: unknown field"},
		"two documents": {"credentials:\n  c: {user: u, password_file: " + pw + "}\ntargets:\n  o: {host: h, database: d, credentials: c}\n---\ntargets: {}\n", nil,
			"--config.file " + dir + "/config.yml: line 5: a --- line starts a second YAML document"},
		"unreadable password": {"credentials:\n  c: {user: u, password_file: " + dir + "/missing}\ntargets:\n  o: {host: h, database: d, credentials: c}\n", nil, "--config.file " + dir + "/config.yml: credentials.c.password_file: open " + dir + "/missing"},
		"with the agent":      {"credentials:\n  c: {user: u, password_file: " + pw + "}\ntargets:\n  o: {host: h, database: d, credentials: c}\n", []string{"--agent"}, "--config.file makes an observer"},
		"telemetry path of /probe": {"credentials:\n  c: {user: u, password_file: " + pw + "}\ntargets:\n  o: {host: h, database: d, credentials: c}\n",
			[]string{"--web.telemetry-path=/probe"}, `--web.telemetry-path "/probe" is a path of --config.file's targets`},
		"per-target above cap": {"credentials:\n  c: {user: u, password_file: " + pw + "}\ntargets:\n  o: {host: h, database: d, credentials: c}\n",
			[]string{"--probe.max-conns=1", "--probe.max-conns-per-target=2"}, "--probe.max-conns must be at least --probe.max-conns-per-target"},
		"no discovered series": {"credentials:\n  c: {user: u, password_file: " + pw + "}\ntargets:\n  o: {host: h, database: d, credentials: c}\n",
			[]string{"--discover.max-series=0"}, "--discover.max-series must be at least 1, got 0"},
		// The collectors of a file of targets only, or of discover entries only, are built
		// at start: a bad collector flag is refused then, not at the first probe or scrape.
		"bad collector flag, targets": {"credentials:\n  c: {user: u, password_file: " + pw + "}\ntargets:\n  o: {host: h, database: d, credentials: c}\n",
			[]string{"--collector.advisory_locks.max-applications=0"}, "--collector.advisory_locks.max-applications"},
		"bad collector flag, discover": {"credentials:\n  c: {user: u, password_file: " + pw + "}\ndiscover:\n  s: {host: h, credentials: c}\n",
			[]string{"--collector.advisory_locks.max-applications=0"}, "--collector.advisory_locks.max-applications"},
	} {
		t.Run(name, func(t *testing.T) {
			file := writeFile(t, dir, "config.yml", c.yaml)
			args := append([]string{"--config.file=" + file}, c.args...)
			if name != "with the agent" {
				args = append(args, "--no-agent")
			}
			code, out := runToExit(t, nil, args...)
			if code != exitConfig {
				t.Errorf("exit %d, want %d:\n%s", code, exitConfig, out)
			}
			checkOneLine(t, out, c.want)
			if strings.Contains(out, "hunter2secret") {
				t.Error("the password is in the output")
			}
		})
	}

	// SIGHUP: a bad file is refused and the targets in force stay; a good one is taken.
	srv := pgtest.SharedServer(t)
	a, b := testTarget{"a", srv, pgtest.NewDB(t)}, testTarget{"b", srv, pgtest.NewDB(t)}
	cfg := targetsConfig(t, dir, []testTarget{a})
	p := startExporter(t, nil, "--no-agent", "--config.file="+cfg)
	testutil.Eventually(t, 15*time.Second, "target a answering", func() bool {
		_, body, _ := p.probe(t, "target=a", "5")
		return strings.Contains(body, "\npg_liveness_up 1\n")
	})
	replaceFile(t, cfg, "targets:\n  a: {host: h, database: d, credentials: gone}\n")
	p.signal(t, syscall.SIGHUP)
	waitLog(t, p, "refused --config.file")
	if _, body, _ := p.probe(t, "target=a", "5"); !strings.Contains(body, "\npg_liveness_up 1\n") {
		t.Fatalf("target a lost after a refused reload:\n%s", body)
	}
	p.waitFor(t, `(?m)^pg_liveness_exporter_config_last_reload_successful 0$`, 10*time.Second)
	// A file of two documents, the first valid (and naming b), is refused as well: not cut
	// to its first document.
	replaceFile(t, cfg, mustRead(t, targetsConfig(t, t.TempDir(), []testTarget{a, b}))+"---\ntargets: {}\n")
	p.signal(t, syscall.SIGHUP)
	waitLogCount(t, p, "refused --config.file", 2)
	if !strings.Contains(p.Logs(), "a --- line starts a second YAML document") {
		t.Errorf("the refusal of a file of two documents does not say why")
	}
	if code, body, _ := p.probe(t, "target=b", "5"); code != http.StatusBadRequest {
		t.Fatalf("target b served from a refused file of two documents: %d\n%s", code, body)
	}
	replaceFile(t, cfg, mustRead(t, targetsConfig(t, t.TempDir(), []testTarget{a, b})))
	p.signal(t, syscall.SIGHUP)
	waitLog(t, p, "reloaded --config.file")
	if _, body, _ := p.probe(t, "target=b", "5"); !strings.Contains(body, "\npg_liveness_up 1\n") {
		t.Fatalf("target b not served after the reload:\n%s", body)
	}
	p.waitFor(t, `(?m)^pg_liveness_exporter_config_last_reload_successful 1$`, 10*time.Second)
	// The targets' list and status pages.
	for path, want := range map[string]string{"/targets": `href="/targets/b/status"`, "/targets/a/status.json": `"instances"`} {
		resp, err := http.Get("http://" + p.addr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), want) {
			t.Errorf("%s: %s, no %q:\n%s", path, resp.Status, want, body)
		}
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// With a DSN as well, the exporter serves its own database on /metrics and /status as
// before, and the targets beside it; the landing page and /targets link them.
func TestProbeBesideTheMainDatabase(t *testing.T) {
	t.Parallel()
	srv := pgtest.SharedServer(t)
	main := testdb.Migrated(t)
	other := testTarget{"other", srv, pgtest.NewDB(t)}
	seedService(t, other.db, "svc-other")
	cfg := targetsConfig(t, t.TempDir(), []testTarget{other})
	p := startExporter(t, []string{"DATA_SOURCE_NAME=" + main.DSN}, "--no-agent", "--no-migrations.apply", "--config.file="+cfg)
	body := p.waitFor(t, `(?m)^pg_liveness_up 1$`, 30*time.Second)
	if strings.Contains(body, "svc-other") {
		t.Error("/metrics shows a target's service")
	}
	if !strings.Contains(body, "pg_liveness_exporter_probe_connections_max 20") {
		t.Error("/metrics lacks the targets' connection gauges")
	}
	_, pb, _ := p.probe(t, "target=other", "5")
	if !strings.Contains(pb, "\npg_liveness_up 1\n") || !strings.Contains(pb, `service="svc-other"`) {
		t.Errorf("/probe?target=other:\n%s", pb)
	}
	for path, want := range map[string]string{"/": `href="/targets"`, "/targets": `href="/status"`} {
		resp, err := http.Get("http://" + p.addr + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), want) {
			t.Errorf("%s has no %s:\n%s", path, want, b)
		}
	}
}

// SIGTERM while probes of a frozen server (every process stopped) are in flight, one on
// a connection made before the freeze (its statement never answered) and one still
// connecting: the exporter ends them, answers them, and exits within the 5 s that the
// deploy tests and an HTTP server's shutdown allow, not at their 30 s deadline or after it.
func TestSIGTERMDuringProbesOfAFrozenServerExitsAtOnce(t *testing.T) {
	t.Parallel()
	s := pgtest.NewServer(t)
	ts := []testTarget{{"before", s, pgtest.NewDBOn(t, s)}, {"after", s, pgtest.NewDBOn(t, s)}}
	for _, tg := range ts {
		seedService(t, tg.db, "svc-"+tg.name)
	}
	p := startExporter(t, nil, "--no-agent", "--config.file="+targetsConfig(t, t.TempDir(), ts))
	testutil.Eventually(t, 15*time.Second, "target before answering", func() bool {
		_, body, _ := p.probe(t, "target=before", "5")
		return strings.Contains(body, "\npg_liveness_up 1\n")
	})
	hang(t, s)
	type answer struct {
		code int
		body string
	}
	answers := make(chan answer, len(ts))
	var sent sync.WaitGroup
	for _, tg := range ts {
		sent.Add(1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { sent.Done() }}
			req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodGet, "http://"+p.addr+"/probe?target="+tg.name, nil)
			req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", "30")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				answers <- answer{0, err.Error()}
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			answers <- answer{resp.StatusCode, string(b)}
		}()
	}
	sent.Wait()
	// Both probes are being served: each waits on the frozen server (a statement, a login).
	testutil.Eventually(t, 10*time.Second, "both probes waiting on the server", func() bool {
		return metricValue(t, p.scrape(t), "pg_liveness_exporter_probe_connections") >= 2
	})
	start := time.Now()
	p.signal(t, syscall.SIGTERM)
	code := p.exitCode(t, 30*time.Second, "SIGTERM")
	took := time.Since(start)
	t.Logf("exit %d %s after SIGTERM", code, took)
	if code != 0 || took > 5*time.Second {
		t.Errorf("SIGTERM during probes of a frozen server: exit %d after %s, want 0 within 5 s", code, took)
	}
	for range ts {
		if a := <-answers; a.code != http.StatusOK || !strings.Contains(a.body, "\npg_liveness_up 0\n") {
			t.Errorf("a probe in flight at SIGTERM: %d, want its answer, up 0:\n%.300s", a.code, a.body)
		}
	}
}

// Hung targets never starve healthy ones: ten targets on a frozen server (every process
// stopped) and five on a healthy one, 40 clients probing them at once under
// --probe.max-conns=10. The frozen server's targets hold at most its share of the cap,
// so every probe of a healthy target answers up 1, well within its deadline, in every
// round; the frozen ones answer up 0 at theirs.
func TestHungTargetsDoNotStarveHealthyOnes(t *testing.T) {
	hung, healthy := pgtest.NewServer(t), pgtest.NewServer(t)
	hungDB, healthyDB := pgtest.NewDBOn(t, hung), pgtest.NewDBOn(t, healthy)
	seedService(t, hungDB, "svc-hung")
	seedService(t, healthyDB, "svc-healthy")
	var ts []testTarget
	for i := range 10 {
		ts = append(ts, testTarget{fmt.Sprintf("hung-%d", i), hung, hungDB})
	}
	for i := range 5 {
		ts = append(ts, testTarget{fmt.Sprintf("healthy-%d", i), healthy, healthyDB})
	}
	p := startExporter(t, nil, "--no-agent", "--config.file="+targetsConfig(t, t.TempDir(), ts), "--probe.max-conns=10")
	// Half the frozen server's targets have connections from before, the other half
	// connect once it is frozen.
	for _, tg := range ts[:5] {
		testutil.Eventually(t, 15*time.Second, tg.name+" answering", func() bool {
			_, body, _ := p.probe(t, "target="+tg.name, "5")
			return strings.Contains(body, "\npg_liveness_up 1\n")
		})
	}
	hang(t, hung)
	const deadline = 4500 * time.Millisecond // 5 s less the 0.5 s offset
	for round := range 2 {
		var mu sync.Mutex
		var bad []string
		healthyUp, hungDown := 0, 0
		var wg sync.WaitGroup
		for c := range 40 {
			wg.Go(func() {
				tg := ts[c%len(ts)]
				if c >= 30 { // ten more clients on the healthy targets
					tg = ts[10+c%5]
				}
				code, body, took := p.probe(t, "target="+tg.name, "5")
				mu.Lock()
				defer mu.Unlock()
				up := strings.Contains(body, "\npg_liveness_up 1\n")
				switch {
				case tg.srv == healthy && code == http.StatusOK && up && took < deadline:
					healthyUp++
				case tg.srv == healthy:
					bad = append(bad, fmt.Sprintf("%s: %d, up 1 %v, after %s", tg.name, code, up, took.Round(time.Millisecond)))
				case code == http.StatusOK && strings.Contains(body, "\npg_liveness_up 0\n"):
					hungDown++
				}
			})
		}
		wg.Wait()
		t.Logf("round %d: %d healthy probes up 1 on time, %d frozen ones down", round, healthyUp, hungDown)
		for _, b := range bad {
			t.Errorf("round %d, a healthy target beside frozen ones: %s", round, b)
		}
		if hungDown == 0 {
			t.Errorf("round %d: no probe of a frozen target answered up 0", round)
		}
	}
	if n := metricValue(t, p.scrape(t), "pg_liveness_exporter_probe_connections"); n > 10 {
		t.Errorf("%v connections, cap 10", n)
	}
}
