package main

// The binary's life (main.go): refused configuration (exit 2, one line), serving while
// the database comes and goes, SIGTERM, the connection budget, a duplicate instance id
// (exit 1), its logger and its build stamp.

import (
	"bytes"
	"context"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/cli"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

func TestBadConfigurationExitsTwoWithOneLine(t *testing.T) {
	t.Parallel()
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
		{"both direct dsn flags", nil, []string{"--db.dsn=host=x", "--db.direct-dsn=host=y", "--db.direct-dsn-file=/nonexistent"}, "--db.direct-dsn and --db.direct-dsn-file"},
		{"missing direct dsn file", nil, []string{"--db.dsn=host=x", "--db.direct-dsn-file=/nonexistent/direct"}, "--db.direct-dsn-file: "},
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
			checkOneLine(t, out, tc.want)
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
	write := func(name, content string) string { return writeFile(t, dir, name, content) }
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
			checkOneLine(t, out, tc.want)
		})
	}
}

func TestServesAndRecoversWhenDatabaseReturns(t *testing.T) {
	t.Parallel()
	srv, db := ownServer(t)
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
	t.Parallel()
	p := startExporter(t, nil, "--db.dsn=host=127.0.0.1 port=1 user=x password=topsecret dbname=x connect_timeout=1")
	body := p.waitFor(t, `(?m)^pg_liveness_up 0$`, 30*time.Second)
	if strings.Contains(body, "topsecret") || strings.Contains(p.Logs(), "topsecret") {
		t.Fatal("password leaked into /metrics or logs")
	}
}

func TestSIGTERMRemovesOwnRowAndExitsZero(t *testing.T) {
	t.Parallel()
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
	p.signal(t, syscall.SIGTERM)
	if code := p.exitCode(t, 20*time.Second, "SIGTERM"); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
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
	// Beats every 1-2 s: each may wait its turn for the one connection behind a scrape,
	// and a loaded machine must not turn that wait into a failed beat (its deadline is
	// below the interval).
	p := startExporter(t, []string{"DATA_SOURCE_NAME=" + db.DSN}, "--db.max-conns=1",
		"--agent.service-name="+service,
		"--agent.heartbeat-interval=1s", "--agent.heartbeat-slow-interval=2s",
		"--agent.stale-threshold=5s", "--agent.definitive-dead-cutoff=10s",
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
	for start := time.Now(); time.Since(start) < 7*time.Second; {
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
	} {
		if !regexp.MustCompile(want).MatchString(body) {
			t.Errorf("after 6s with one pooled connection, /metrics lacks %s", want)
		}
	}
	// A beat waits its turn for the one connection behind a scrape's statements, under a
	// deadline of half a second here; on a loaded machine one such wait can outlast it,
	// and the beat is retried. The budget must not starve the heartbeat: at most one beat
	// in three fails.
	beats, failures := metricValue(t, body, "pg_liveness_agent_heartbeats_total"), metricValue(t, body, "pg_liveness_agent_heartbeat_failures_total")
	if failures*2 > beats {
		t.Errorf("with one pooled connection %v beats failed and %v succeeded: the heartbeat is starved", failures, beats)
	}
	checkCollectors(t, "with one pooled connection", body, "instances", "leases", "advisory_locks", "statements", "agent")
	if t.Failed() {
		t.Logf("last scrape:\n%s", body)
	}
}

// Two exporters with the same --agent.instance-id: the second cannot take the alive lock,
// so it writes no row (the first one's service name stays), reports the duplicate in
// /metrics, and exits 1 after --agent.duplicate-timeout; the first keeps its row.
func TestDuplicateInstanceIDExitsNonZeroWithoutWriting(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	const id = "0d7c3c2a-41b5-4e0e-a6a5-3c5b7b8f9e10"
	env := []string{"DATA_SOURCE_NAME=" + db.DSN}
	first := startExporter(t, env, "--agent.instance-id="+id, "--agent.service-name=first")
	first.waitFor(t, `(?m)^pg_liveness_agent_alive_lock_held 1$`, 30*time.Second)
	second := startExporter(t, env, "--agent.instance-id="+id, "--agent.service-name=second",
		"--agent.duplicate-timeout=3s")
	second.waitFor(t, `(?m)^pg_liveness_agent_duplicate_instance 1$`, 30*time.Second)
	if code := second.exitCode(t, 30*time.Second, "finding its id's lock held (--agent.duplicate-timeout=3s)"); code != 1 {
		t.Fatalf("the duplicate exited with %d, want 1", code)
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

// The binary's logger removes passwords from every line, in both formats.
func TestLoggerRemovesPasswords(t *testing.T) {
	for _, format := range []string{"logfmt", "json"} {
		t.Run(format, func(t *testing.T) {
			f, err := cli.Parse([]string{"--log.format=" + format}, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			logtest.LogPasswords(newLogger(f, &buf))
			if leak, problem := logtest.Leak(buf.String()); leak != "" || problem != "" {
				t.Fatalf("leaked %q (%s):\n%s", leak, problem, buf.String())
			}
		})
	}
}

// `make build` stamps the version from git into pg_liveness_exporter_build_info; a plain
// `go build` leaves version and branch empty.
func TestMakeBuildStampsVersion(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make is not installed: apt-get install make")
	}
	bin := filepath.Join(t.TempDir(), "pg_liveness_exporter")
	if out, err := exec.Command("make", "--no-print-directory", "build", "BINARY="+bin).CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	revision, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD (the test needs the git checkout): %v", err)
	}

	db := pgtest.NewDB(t)
	p := startBinary(t, bin, []string{"DATA_SOURCE_NAME=" + db.DSN}, "--no-agent")
	line := regexp.MustCompile(`(?m)^pg_liveness_exporter_build_info\{.*\} 1$`).FindString(
		p.waitFor(t, `(?m)^pg_liveness_exporter_build_info\{`, 30*time.Second))
	labels := map[string]string{}
	for _, m := range regexp.MustCompile(`(\w+)="([^"]*)"`).FindAllStringSubmatch(line, -1) {
		labels[m[1]] = m[2]
	}
	for _, name := range []string{"version", "revision", "branch", "goversion"} {
		if labels[name] == "" || labels[name] == "unknown" {
			t.Errorf("build_info label %s is %q; want it stamped: %s", name, labels[name], line)
		}
	}
	if want := strings.TrimSpace(string(revision)); labels["revision"] != want {
		t.Errorf("build_info revision %q, want git's HEAD %s", labels["revision"], want)
	}
	if strings.Contains(labels["version"], " ") {
		t.Errorf("build_info version %q has a space", labels["version"])
	}
}
