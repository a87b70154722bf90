package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testutil"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pg_liveness_exporter_bin_")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "pg_liveness_exporter")
	if out, err := exec.Command("go", "build", "-race", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := pgtest.Run(m)
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// exporterProc is the real binary running against a real database.
type exporterProc struct {
	cmd  *exec.Cmd
	addr string
	mu   sync.Mutex
	logs bytes.Buffer
	done chan struct{}
	code int
}

func startExporter(t testing.TB, env []string, args ...string) *exporterProc {
	t.Helper()
	return startBinary(t, binary, env, args...)
}

func startBinary(t testing.TB, binary string, env []string, args ...string) *exporterProc {
	t.Helper()
	p := &exporterProc{addr: testutil.FreeAddr(t), done: make(chan struct{})}
	p.cmd = exec.Command(binary, append([]string{"--web.listen-address=" + p.addr, "--log.level=debug"}, args...)...)
	p.cmd.Env = append(os.Environ(), env...)
	pr, pw := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = pw, pw
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
		for sc.Scan() {
			p.mu.Lock()
			p.logs.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, pr) // keep draining, or the process blocks on its stderr
	}()
	go func() {
		_ = p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		pw.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("exporter logs:\n%s", p.Logs())
		}
	})
	return p
}

func (p *exporterProc) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

func (p *exporterProc) scrape(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+"/metrics", nil)
	req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", "5")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s\n%s", resp.Status, b)
	}
	return string(b)
}

// waitFor scrapes until the exposition matches re, or fails after timeout.
func (p *exporterProc) waitFor(t testing.TB, re string, timeout time.Duration) string {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			t.Fatalf("exporter exited with %d while waiting for %s", p.code, re)
		default:
		}
		if last = p.scrape(t); rx.MatchString(last) {
			return last
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("no %s within %s; last scrape:\n%s", re, timeout, last)
	return ""
}

func runToExit(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(os.Environ(), env...)
	out, _ := cmd.CombinedOutput()
	return cmd.ProcessState.ExitCode(), string(out)
}

func TestBadConfigurationExitsTwoWithOneLine(t *testing.T) {
	const pw = "hunter2secret"
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"unknown flag", nil, []string{"--db.dsn=host=x", "--no-such-flag"}, "no-such-flag"},
		{"bad duration", nil, []string{"--db.dsn=host=x", "--agent.heartbeat-interval=soon"}, "agent.heartbeat-interval"},
		{"bad mode", nil, []string{"--db.dsn=host=x", "--agent.liveness-mode=vibes"}, "agent.liveness-mode"},
		{"malformed dsn flag", nil, []string{"--db.dsn=host=x password=" + pw + " port=notaport"}, "--db.dsn"},
		{"malformed dsn url", []string{"DATA_SOURCE_NAME=postgres://u:" + pw + "@h:notaport/db"}, nil, "DATA_SOURCE_NAME"},
		{"malformed direct dsn", nil, []string{"--db.dsn=host=x", "--db.direct-dsn=postgres://u:" + pw + "@h:x/db"}, "--db.direct-dsn"},
		{"no dsn", []string{"DATA_SOURCE_NAME="}, nil, "DATA_SOURCE_NAME"},
		{"bad instance id", nil, []string{"--db.dsn=host=x", "--agent.instance-id=nope"}, "--agent.instance-id"},
		{"slow below fast", nil, []string{"--db.dsn=host=x", "--agent.heartbeat-slow-interval=10s"}, "--agent.heartbeat-slow-interval"},
		{"dead cutoff too low", nil, []string{"--db.dsn=host=x", "--agent.definitive-dead-cutoff=100s"}, "--agent.definitive-dead-cutoff"},
		{"zero interval", nil, []string{"--db.dsn=host=x", "--agent.heartbeat-interval=0s"}, "--agent.heartbeat-interval"},
		{"zero max conns", nil, []string{"--db.dsn=host=x", "--db.max-conns=0"}, "--db.max-conns"},
		{"too many conns", nil, []string{"--db.dsn=host=x", "--db.max-conns=1001"}, "--db.max-conns"},
		{"zero connect timeout", nil, []string{"--db.dsn=host=x", "--db.connect-timeout=0s"}, "--db.connect-timeout"},
		{"nil instance id", nil, []string{"--db.dsn=host=x", "--agent.instance-id=00000000-0000-0000-0000-000000000000"}, "--agent.instance-id"},
		{"empty schema", nil, []string{"--db.dsn=host=x", "--db.schema="}, "--db.schema"},
		{"schema cut by the server", nil, []string{"--db.dsn=host=x", "--db.schema=" + strings.Repeat("s", 64)}, "--db.schema"},
		{"reserved schema", nil, []string{"--db.dsn=host=x", "--db.schema=pg_liveness"}, "--db.schema"},
		{"service name not utf-8", nil, []string{"--db.dsn=host=x", "--agent.service-name=api\xff"}, "--agent.service-name"},
		{"service name control character", nil, []string{"--db.dsn=host=x", "--agent.service-name=api\nworker"}, "--agent.service-name"},
		{"telemetry path without slash", nil, []string{"--db.dsn=host=x", "--web.telemetry-path=metrics"}, "--web.telemetry-path"},
		{"telemetry path with a pattern", nil, []string{"--db.dsn=host=x", "--web.telemetry-path=/metrics/{x}"}, "--web.telemetry-path"},
		{"telemetry path of the status page", nil, []string{"--db.dsn=host=x", "--web.telemetry-path=/status"}, "--web.telemetry-path"},
		{"telemetry path of the status JSON", nil, []string{"--db.dsn=host=x", "--web.telemetry-path=/status.json"}, "--web.telemetry-path"},
		{"listen address without port", nil, []string{"--db.dsn=host=x", "--web.listen-address=127.0.0.1"}, "--web.listen-address"},
		{"listen address bad port", nil, []string{"--db.dsn=host=x", "--web.listen-address=127.0.0.1:notaport"}, "--web.listen-address"},
		{"missing web config", nil, []string{"--db.dsn=host=x", "--web.config.file=/nonexistent/web.yml"}, "--web.config.file"},
		{"empty service name", nil, []string{"--db.dsn=host=x", "--agent.service-name="}, "--agent.service-name"},
		// Every identifier flag is checked by the one rule --db.schema is.
		{"schema control character", nil, []string{"--db.dsn=host=x", "--db.schema=live\x01ness"}, "--db.schema"},
		{"whizbang schema cut by the server", nil, []string{"--db.dsn=host=x", "--source=whizbang", "--no-agent", "--source.whizbang.schema=" + strings.Repeat("s", 70)}, "--source.whizbang.schema"},
		{"whizbang schema control character", nil, []string{"--db.dsn=host=x", "--source=whizbang", "--no-agent", "--source.whizbang.schema=pub\tlic"}, "--source.whizbang.schema"},
		{"whizbang schema reserved", nil, []string{"--db.dsn=host=x", "--source=whizbang", "--no-agent", "--source.whizbang.schema=pg_catalog"}, "--source.whizbang.schema"},
		{"whizbang schema not utf-8", nil, []string{"--db.dsn=host=x", "--source=whizbang", "--no-agent", "--source.whizbang.schema=caf\xe9"}, "--source.whizbang.schema"},
		{"whizbang prefix makes a name cut by the server", nil, []string{"--db.dsn=host=x", "--source=whizbang", "--no-agent", "--source.whizbang.prefix=" + strings.Repeat("p", 50)}, "--source.whizbang.prefix"},
		{"whizbang prefix control character", nil, []string{"--db.dsn=host=x", "--source=whizbang", "--no-agent", "--source.whizbang.prefix=wh\n_"}, "--source.whizbang.prefix"},
		{"whizbang lock key prefix not utf-8", nil, []string{"--db.dsn=host=x", "--source=whizbang", "--no-agent", "--source.whizbang.lock-key-prefix=wh\xff"}, "--source.whizbang.lock-key-prefix"},
		{"leases table schema cut by the server", nil, []string{"--db.dsn=host=x", "--collector.leases.table=" + strings.Repeat("s", 64) + ".leases"}, "--collector.leases.table"},
		{"leases table name cut by the server", nil, []string{"--db.dsn=host=x", "--collector.leases.table=" + strings.Repeat("l", 64)}, "--collector.leases.table"},
		{"leases table control character", nil, []string{"--db.dsn=host=x", "--collector.leases.table=public.lea\x7fses"}, "--collector.leases.table"},
		{"leases table reserved schema", nil, []string{"--db.dsn=host=x", "--collector.leases.table=pg_catalog.leases"}, "--collector.leases.table"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runToExit(t, tc.env, tc.args...)
			if code != exitConfig {
				t.Fatalf("exit code %d, want %d; output:\n%s", code, exitConfig, out)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != 1 {
				t.Errorf("want one line, got %d:\n%s", len(lines), out)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("output does not name %s:\n%s", tc.want, out)
			}
			if strings.Contains(out, pw) {
				t.Errorf("output leaks the password:\n%s", out)
			}
		})
	}
}

// Web configuration that cannot work is refused before anything starts: exit 2, one line
// naming the flag, and no "starting" or "Listening" line before it.
func TestBadWebConfigurationExitsTwo(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"yaml error", []string{"--web.config.file=" + write("bad.yml", "tls_server_config: [unclosed\n")}, "--web.config.file"},
		{"unknown field", []string{"--web.config.file=" + write("unknown.yml", "tls_server_config:\n  no_such_field: 1\n")}, "--web.config.file"},
		{"missing certificate", []string{"--web.config.file=" + write("nocert.yml", "tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n")}, "--web.config.file"},
		{"empty file", []string{"--web.config.file=" + write("empty.yml", "")}, "--web.config.file"},
		{"only comments", []string{"--web.config.file=" + write("comments.yml", "# nothing here\n\n")}, "--web.config.file"},
		{"port in use", []string{"--web.listen-address=" + busy.Addr().String()}, "--web.listen-address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--db.dsn=host=127.0.0.1 port=1"}, tc.args...)
			if !strings.HasPrefix(tc.args[0], "--web.listen-address") {
				args = append(args, "--web.listen-address=127.0.0.1:0") // never the default :9816
			}
			code, out := runToExit(t, nil, args...)
			if code != exitConfig {
				t.Fatalf("exit code %d, want %d; output:\n%s", code, exitConfig, out)
			}
			if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 1 {
				t.Errorf("want one line, got %d:\n%s", len(lines), out)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("output does not name %s:\n%s", tc.want, out)
			}
		})
	}
}

func TestServesAndRecoversWhenDatabaseReturns(t *testing.T) {
	srv := pgtest.NewServer(t)
	db := pgtest.NewDBOn(t, srv)
	p := startExporter(t, []string{"DATA_SOURCE_NAME=" + db.DSN},
		"--agent.heartbeat-interval=1s", "--agent.heartbeat-slow-interval=2s",
		"--agent.stale-threshold=5s", "--agent.definitive-dead-cutoff=20s")
	body := p.waitFor(t, `(?m)^pg_liveness_up 1$`, 30*time.Second)
	if !strings.Contains(body, "pg_liveness_build_info") && !strings.Contains(body, "pg_liveness_exporter_build_info") {
		t.Errorf("no build info in /metrics")
	}
	// The migrations were applied: the agent joins only after they are, and the database
	// may answer a scrape before that.
	p.waitFor(t, `(?m)^pg_liveness_agent_joined 1$`, 30*time.Second)
	var version int
	if err := db.Conn(t).QueryRow(context.Background(), `SELECT max(version) FROM liveness.schema_migrations`).Scan(&version); err != nil || version < 2 {
		t.Fatalf("migrations not applied: version %d, %v", version, err)
	}

	srv.Stop()
	start := time.Now()
	p.waitFor(t, `(?m)^pg_liveness_up 0$`, 30*time.Second)
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("noticing the database was down took %s", d)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	p.waitFor(t, `(?m)^pg_liveness_up 1$`, 60*time.Second)
	if strings.Contains(p.Logs(), srv.Password) {
		t.Fatal("a log line contains the database password")
	}
}

func TestUnreachableDatabaseIsNotFatal(t *testing.T) {
	p := startExporter(t, nil, "--db.dsn=host=127.0.0.1 port=1 user=x password=topsecret dbname=x connect_timeout=1")
	body := p.waitFor(t, `(?m)^pg_liveness_up 0$`, 30*time.Second)
	if strings.Contains(body, "topsecret") || strings.Contains(p.Logs(), "topsecret") {
		t.Fatal("password leaked into /metrics or logs")
	}
}

func TestSIGTERMRemovesOwnRowAndExitsZero(t *testing.T) {
	db := pgtest.NewDB(t)
	const id = "7b4b8f1e-8c1e-4a57-9b7e-3f0a2e5c9d11"
	p := startExporter(t, []string{"DATA_SOURCE_NAME=" + db.DSN}, "--agent.instance-id="+id)
	p.waitFor(t, `(?m)^pg_liveness_agent_alive_lock_held 1$`, 30*time.Second)
	conn := db.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var alive bool
	if err := conn.QueryRow(ctx, `SELECT liveness.is_instance_alive($1, 90)`, id).Scan(&alive); err != nil || !alive {
		t.Fatalf("agent not alive before SIGTERM: %v, %v", alive, err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatal("exporter did not exit within 20s of SIGTERM")
	}
	if p.code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", p.code)
	}
	var rows int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM liveness.instances WHERE instance_id = $1`, id).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("own instance row still there after shutdown: %d, %v", rows, err)
	}
	if err := conn.QueryRow(ctx, `SELECT liveness.is_instance_alive($1, 90)`, id).Scan(&alive); err != nil || alive {
		t.Fatalf("instance still alive after shutdown: %v, %v", alive, err)
	}
}

// The connection budget: the pool (--db.max-conns) plus one direct connection, never more.
// With a pool of one, scrapes, heartbeats, the reaper and its lease all keep working.
func TestConnectionBudgetWithOnePooledConnection(t *testing.T) {
	db := pgtest.NewDB(t)
	db.Exec(t, `CREATE EXTENSION pg_stat_statements`)
	const service = "budget"
	p := startExporter(t, []string{"DATA_SOURCE_NAME=" + db.DSN}, "--db.max-conns=1",
		"--agent.service-name="+service,
		"--agent.heartbeat-interval=300ms", "--agent.heartbeat-slow-interval=600ms",
		"--agent.stale-threshold=2s", "--agent.definitive-dead-cutoff=5s",
		"--agent.reaper-interval=200ms", "--agent.reaper-lease-ttl=2s")
	p.waitFor(t, `(?m)^pg_liveness_agent_alive_lock_held 1$`, 30*time.Second)

	// A dead instance for the reaper to remove through the same single connection.
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, last_heartbeat_at)
		VALUES (gen_random_uuid(), 'gone', now() - interval '1 hour')`)

	conn := db.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	maxPool, maxTotal := 0, 0
	var body string
	for start := time.Now(); time.Since(start) < 6*time.Second; {
		// Scrape concurrently with the agent's work, so they compete for the connection.
		body = p.scrape(t)
		var pool, total int
		if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE application_name = 'pg_liveness_exporter:pool'),
			count(*) FILTER (WHERE application_name IN ('pg_liveness_exporter:pool', $1))
			FROM pg_stat_activity WHERE datname = current_database()`, service+":alive-lock").Scan(&pool, &total); err != nil {
			t.Fatal(err)
		}
		maxPool, maxTotal = max(maxPool, pool), max(maxTotal, total)
		time.Sleep(50 * time.Millisecond)
	}
	if maxPool > 1 || maxTotal > 2 {
		t.Fatalf("connections: pool up to %d (budget 1), pool+direct up to %d (budget 2)", maxPool, maxTotal)
	}
	if maxTotal < 2 {
		t.Fatalf("never saw the pool and the direct connection together (max %d): the check cannot tell", maxTotal)
	}
	for _, want := range []string{
		`(?m)^pg_liveness_up 1$`,
		`(?m)^pg_liveness_agent_alive_lock_held 1$`,
		`(?m)^pg_liveness_agent_instances_reaped_total [1-9]`,
		`(?m)^pg_liveness_agent_heartbeats_total ([3-9]|[1-9][0-9]+)$`,
		`(?m)^pg_liveness_agent_heartbeat_failures_total 0$`,
	} {
		if !regexp.MustCompile(want).MatchString(body) {
			t.Errorf("after 6s with one pooled connection, /metrics lacks %s", want)
		}
	}
	for _, c := range []string{"instances", "leases", "advisory_locks", "statements", "agent"} {
		if !strings.Contains(body, `pg_liveness_scrape_collector_success{collector="`+c+`"} 1`) {
			t.Errorf("collector %s did not succeed with one pooled connection", c)
		}
	}
	if t.Failed() {
		t.Logf("last scrape:\n%s", body)
	}
}

// Two exporters with the same --agent.instance-id: the second cannot take the alive lock,
// so it writes no row (the first one's service name stays), reports the duplicate in
// /metrics, and exits 1 after --agent.duplicate-timeout; the first keeps its row.
func TestDuplicateInstanceIDExitsNonZeroWithoutWriting(t *testing.T) {
	db := pgtest.NewDB(t)
	const id = "0d7c3c2a-41b5-4e0e-a6a5-3c5b7b8f9e10"
	env := []string{"DATA_SOURCE_NAME=" + db.DSN}
	first := startExporter(t, env, "--agent.instance-id="+id, "--agent.service-name=first")
	first.waitFor(t, `(?m)^pg_liveness_agent_alive_lock_held 1$`, 30*time.Second)
	second := startExporter(t, env, "--agent.instance-id="+id, "--agent.service-name=second",
		"--agent.duplicate-timeout=3s")
	second.waitFor(t, `(?m)^pg_liveness_agent_duplicate_instance 1$`, 30*time.Second)
	select {
	case <-second.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the duplicate did not exit within 30s (--agent.duplicate-timeout=3s)")
	}
	if second.code != 1 {
		t.Fatalf("the duplicate exited with %d, want 1", second.code)
	}
	conn := db.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var service string
	if err := conn.QueryRow(ctx, `SELECT service_name FROM liveness.instances WHERE instance_id = $1`, id).Scan(&service); err != nil {
		t.Fatalf("the first exporter's row is gone: %v", err)
	}
	if service != "first" {
		t.Fatalf("service_name = %q: the duplicate wrote the row", service)
	}
}
