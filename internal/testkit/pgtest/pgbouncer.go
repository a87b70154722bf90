package pgtest

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/watchdog"
)

// PgBouncerInstallHint is the one line printed when PgBouncer cannot be found.
const PgBouncerInstallHint = "pgbouncer not found: apt-get install pgbouncer"

// PgBouncer is a throwaway PgBouncer on 127.0.0.1 in front of a test server, stopped when
// the test ends.
type PgBouncer struct {
	Port int

	user     string
	password string
	dir      string
	proc     *exec.Cmd
	exited   chan struct{}
	watchdog io.WriteCloser
}

type pgBouncerConfig struct {
	poolMode      string
	ignoreStartup []string
	maxClients    int
	poolSize      int
	authType      string
}

// WithTrustedClients lets clients in without a password check (auth_type trust; PgBouncer
// still logs in to the server with the password): for a benchmark whose thousands of
// client connections would otherwise spend PgBouncer's one thread on SCRAM handshakes.
func WithTrustedClients() PgBouncerOption {
	return func(c *pgBouncerConfig) { c.authType = "trust" }
}

// WithLimits sets max_client_conn (100 by default) and default_pool_size (10): the
// clients PgBouncer accepts, and the server sessions it opens per database and user.
func WithLimits(maxClients, poolSize int) PgBouncerOption {
	return func(c *pgBouncerConfig) { c.maxClients, c.poolSize = maxClients, poolSize }
}

// PgBouncerOption adjusts a throwaway PgBouncer.
type PgBouncerOption func(*pgBouncerConfig)

// WithPoolMode sets pool_mode (session, transaction or statement); the default is
// transaction.
func WithPoolMode(mode string) PgBouncerOption {
	return func(c *pgBouncerConfig) { c.poolMode = mode }
}

// WithIgnoreStartupParameters lets clients send startup parameters PgBouncer does not
// know; without it PgBouncer refuses such connections.
func WithIgnoreStartupParameters(names ...string) PgBouncerOption {
	return func(c *pgBouncerConfig) { c.ignoreStartup = append(c.ignoreStartup, names...) }
}

// NewPgBouncer starts PgBouncer in front of the server that targetDSN (a TCP DSN with a
// password, such as DB.DSN) points at. Clients authenticate to PgBouncer with the same
// user and password, which PgBouncer also uses to log in to the server. It fails the test
// with a one-line install hint when PgBouncer is missing.
func NewPgBouncer(t testing.TB, targetDSN string, opts ...PgBouncerOption) *PgBouncer {
	t.Helper()
	cfg := pgBouncerConfig{poolMode: "transaction", maxClients: 100, poolSize: 10, authType: "scram-sha-256"}
	for _, o := range opts {
		o(&cfg)
	}
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer" // Debian's, outside a non-root PATH
		if _, err := os.Stat(bin); err != nil {
			t.Fatal(PgBouncerInstallHint)
		}
	}
	target, err := pgx.ParseConfig(targetDSN)
	if err != nil {
		t.Fatalf("pgtest: parse target DSN: %v", redact(err))
	}
	b := &PgBouncer{user: target.User, password: target.Password}
	if b.dir, err = os.MkdirTemp("", "pg_liveness_pgbouncer_"); err != nil {
		t.Fatal(err)
	}
	// PgBouncer refuses to run as root, so as root it runs as an unprivileged user.
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		if cred, err = unprivileged(); err != nil {
			_ = os.RemoveAll(b.dir)
			t.Fatalf("pgtest: %v", err)
		}
	}
	if b.Port, err = testutil.FreePort(); err != nil {
		_ = os.RemoveAll(b.dir)
		t.Fatal(err)
	}
	ini := strings.Join([]string{
		"[databases]",
		fmt.Sprintf("* = host=%s port=%d", target.Host, target.Port),
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		"listen_port = " + strconv.Itoa(b.Port),
		"unix_socket_dir =",
		"auth_type = " + cfg.authType,
		"auth_file = " + filepath.Join(b.dir, "userlist.txt"),
		"pool_mode = " + cfg.poolMode,
		"ignore_startup_parameters = " + strings.Join(cfg.ignoreStartup, ","),
		"server_tls_sslmode = disable",
		"max_client_conn = " + strconv.Itoa(cfg.maxClients),
		// Thousands of clients connecting at once (the fleet benchmark's start) can
		// overflow the default queue of 128 unaccepted connections while PgBouncer's
		// single thread is busy, and an overflow can be answered with resets.
		"listen_backlog = 4096",
		"default_pool_size = " + strconv.Itoa(cfg.poolSize),
		// The target's user may read the admin console's SHOW commands (Describe).
		"stats_users = " + b.user,
		"logfile = " + filepath.Join(b.dir, "pgbouncer.log"),
		"pidfile = " + filepath.Join(b.dir, "pgbouncer.pid"),
		"",
	}, "\n")
	files := map[string]string{
		"pgbouncer.ini": ini,
		// A plain password lets PgBouncer answer the client's SCRAM exchange and run its
		// own against the server.
		"userlist.txt": quoteUserlist(b.user) + " " + quoteUserlist(b.password) + "\n",
	}
	for name, content := range files {
		p := filepath.Join(b.dir, name)
		err := os.WriteFile(p, []byte(content), 0o600)
		if err == nil && cred != nil {
			err = os.Chown(p, int(cred.Uid), int(cred.Gid))
		}
		if err != nil {
			_ = os.RemoveAll(b.dir)
			t.Fatal(err)
		}
	}
	if cred != nil {
		if err := os.Chown(b.dir, int(cred.Uid), int(cred.Gid)); err != nil {
			_ = os.RemoveAll(b.dir)
			t.Fatal(err)
		}
	}

	cmd := exec.Command(bin, filepath.Join(b.dir, "pgbouncer.ini"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	out, err := os.Create(filepath.Join(b.dir, "stderr.log"))
	if err != nil {
		_ = os.RemoveAll(b.dir)
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		out.Close()
		_ = os.RemoveAll(b.dir)
		t.Fatalf("pgtest: start pgbouncer: %v", err)
	}
	b.proc, b.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); out.Close(); close(b.exited) }()
	t.Cleanup(b.stop)
	if err := b.startWatchdog(); err != nil {
		t.Fatal(err)
	}
	if err := b.waitReady(); err != nil {
		t.Fatalf("pgtest: pgbouncer: %v", err)
	}
	return b
}

// DSN returns a TCP DSN through PgBouncer for database db, with the target's user and
// password.
func (b *PgBouncer) DSN(db string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable",
		b.Port, b.user, b.password, db)
}

// waitReady waits until PgBouncer accepts connections and forwards one to the server.
func (b *PgBouncer) waitReady() error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var lastErr error
	for {
		select {
		case <-b.exited:
			return fmt.Errorf("exited during start-up: %s", b.logTail())
		case <-ctx.Done():
			return fmt.Errorf("not ready within 15s: %s: %s", redact(lastErr), b.logTail())
		case <-time.After(50 * time.Millisecond):
		}
		if lastErr = b.ping(ctx); lastErr == nil {
			return nil
		}
	}
}

func (b *PgBouncer) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	d := net.Dialer{}
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port)))
	if err != nil {
		return err
	}
	c.Close()
	conn, err := pgx.Connect(ctx, b.DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "SELECT 1", pgx.QueryExecModeSimpleProtocol)
	return err
}

// startWatchdog stops PgBouncer and removes its folder if this process dies first, the
// way the server's watchdog does.
func (b *PgBouncer) startWatchdog() error {
	w, err := watchdog.Start("pgtest-pgbouncer-watchdog", `kill -9 "$2" 2>/dev/null; sleep 0.2; rm -rf "$1"`,
		b.dir, strconv.Itoa(b.proc.Process.Pid))
	b.watchdog = w
	return err
}

// stop shuts PgBouncer down at once (SIGTERM), then removes its folder.
func (b *PgBouncer) stop() {
	_ = b.proc.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(10 * time.Second):
		_ = b.proc.Process.Kill()
		<-b.exited
	}
	_ = os.RemoveAll(b.dir)
	if b.watchdog != nil {
		_ = b.watchdog.Close()
	}
}

// Describe is PgBouncer's state for a test that failed: its pools and lists from the
// admin console (SHOW POOLS, SHOW LISTS) and the last lines of its log, one per line.
func (b *PgBouncer) Describe(ctx context.Context) string {
	var out strings.Builder
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, b.DSN("pgbouncer")+" default_query_exec_mode=simple_protocol")
	if err != nil {
		fmt.Fprintf(&out, "pgbouncer admin console: %v\n", redact(err))
	} else {
		defer conn.Close(context.Background())
		for _, show := range []string{"SHOW POOLS", "SHOW LISTS"} {
			rows, err := conn.Query(ctx, show)
			if err != nil {
				fmt.Fprintf(&out, "%s: %v\n", show, err)
				continue
			}
			var names []string
			for _, f := range rows.FieldDescriptions() {
				names = append(names, f.Name)
			}
			fmt.Fprintf(&out, "%s: %s\n", show, strings.Join(names, " "))
			for rows.Next() {
				values, err := rows.Values()
				if err != nil {
					break
				}
				fmt.Fprintf(&out, "  %v\n", values)
			}
			rows.Close()
		}
	}
	if data, err := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log")); err == nil {
		// Thousands of clients' logins would fill the tail; the rest is what went wrong.
		var kept []string
		for line := range strings.Lines(string(data)) {
			if !strings.Contains(line, " login attempt: ") {
				kept = append(kept, strings.TrimSuffix(line, "\n"))
			}
		}
		fmt.Fprintf(&out, "pgbouncer.log, last lines but logins:\n  %s\n", strings.Join(kept[max(0, len(kept)-30):], "\n  "))
	}
	return out.String()
}

func (b *PgBouncer) logTail() string {
	var tail []string
	for _, f := range []string{"pgbouncer.log", "stderr.log"} {
		if data, err := os.ReadFile(filepath.Join(b.dir, f)); err == nil {
			tail = append(tail, lastLines(string(data), 5))
		}
	}
	return strings.Join(tail, " | ")
}

// unprivileged returns the credential of the postgres user, or of nobody.
func unprivileged() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		u, err = user.Lookup("nobody")
	}
	if err != nil {
		return nil, fmt.Errorf("running as root and no unprivileged user (postgres or nobody) to run as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// quoteUserlist quotes a userlist.txt field: double quotes, with inner ones doubled.
func quoteUserlist(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
