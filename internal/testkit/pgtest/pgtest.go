package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
)

var shared struct {
	once sync.Once
	srv  *Server
	err  error
}

var dbCounter atomic.Int64

// Main runs the package's tests and then stops the shared server. Use it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// Without it the watchdog still stops the server when the test binary exits.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main without the exit, for a TestMain with clean-up of its own.
func Run(m *testing.M) int {
	code := m.Run()
	if shared.srv != nil {
		shared.srv.Close()
	}
	return code
}

// SharedServer returns the test binary's server, started on first use. It fails the test
// with a one-line install hint when PostgreSQL is missing. Tests must not stop it; use
// NewServer for that. It is nil when EnvDSN points at an existing server.
func SharedServer(t testing.TB) *Server {
	t.Helper()
	if os.Getenv(EnvDSN) != "" {
		return nil
	}
	shared.once.Do(func() { shared.srv, shared.err = StartServer() })
	if shared.err != nil {
		t.Fatalf("pgtest: %v", shared.err)
	}
	return shared.srv
}

// NewServer starts a server of the test's own, closed when the test ends. Use it for
// tests that stop, kill or reconfigure the server.
func NewServer(t testing.TB, opts ...ServerOption) *Server {
	t.Helper()
	s, err := StartServer(opts...)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// DB is a fresh, empty database made for one test.
type DB struct {
	Name string
	// DSN connects over TCP on 127.0.0.1 with a password (or is derived from EnvDSN).
	DSN string
	// Server is nil when EnvDSN is in use.
	Server *Server

	adminDSN string
}

// NewDB creates a fresh database on the shared server (or on EnvDSN's server) and drops
// it when the test ends.
func NewDB(t testing.TB) *DB {
	t.Helper()
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		return newDB(t, nil, dsn, "")
	}
	return NewDBOn(t, SharedServer(t))
}

// NewDBOn creates a fresh database on s and drops it when the test ends.
func NewDBOn(t testing.TB, s *Server) *DB {
	t.Helper()
	return newDB(t, s, s.AdminDSN("postgres"), "")
}

// NewSQLASCIIDB is NewDB with a database whose encoding is SQL_ASCII: it stores and hands
// out any bytes, invalid UTF-8 included, in names, labels and jsonb strings.
func NewSQLASCIIDB(t testing.TB) *DB {
	t.Helper()
	const encoding = "ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' "
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		return newDB(t, nil, dsn, encoding)
	}
	s := SharedServer(t)
	return newDB(t, s, s.AdminDSN("postgres"), encoding)
}

var nonIdent = regexp.MustCompile(`[^a-z0-9_]+`)

// newDB creates the database with the CREATE DATABASE options given (each followed by a
// space), from template0.
func newDB(t testing.TB, s *Server, adminDSN, options string) *DB {
	t.Helper()
	name := nonIdent.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(name) > 40 {
		name = name[:40]
	}
	name = fmt.Sprintf("t_%s_%d_%d", name, os.Getpid(), dbCounter.Add(1))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		t.Fatalf("pgtest: connect to admin database: %v", redact(err))
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" "+options+"TEMPLATE template0"); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	db := &DB{Name: name, Server: s, adminDSN: adminDSN}
	if s != nil {
		db.DSN = s.DSN(name)
	} else {
		db.DSN = withDBName(adminDSN, name)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, adminDSN)
		if err != nil {
			return // the server is gone; its folder goes with it
		}
		defer admin.Close(context.Background())
		_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	return db
}

// withDBName points a keyword/value or URL DSN at another database.
func withDBName(dsn, db string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			u.Path = "/" + db
			return u.String()
		}
	}
	return dsn + " dbname=" + db // a later keyword wins
}

// Pool opens a pgxpool on the database, closed when the test ends. maxConns 0 keeps
// pgxpool's default.
func (d *DB) Pool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return Pool(t, d.DSN, maxConns)
}

// Conn opens a single connection, closed when the test ends.
func (d *DB) Conn(t testing.TB) *pgx.Conn { return d.ConnAs(t, "") }

// ConnAs opens a single connection with application_name app (as the sessions of a
// service show in pg_stat_activity), closed when the test ends.
func (d *DB) ConnAs(t testing.TB, app string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := d.connect(t, ctx, app)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// connect opens a connection, with application_name app unless app is "".
func (d *DB) connect(t testing.TB, ctx context.Context, app string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(d.DSN)
	if err != nil {
		t.Fatalf("pgtest: %v", redact(err))
	}
	if app != "" {
		cfg.RuntimeParams["application_name"] = app
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", redact(err))
	}
	return c
}

// QueryInt runs a query of one integer (a count, say) on a short-lived connection and
// returns it, failing the test on error.
func (d *DB) QueryInt(t testing.TB, sql string, args ...any) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := d.connect(t, ctx, "")
	defer c.Close(context.Background())
	var n int
	if err := c.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("pgtest: %s: %v", firstLine(sql), err)
	}
	return n
}

// Exec runs statements on a short-lived connection and fails the test on error.
func (d *DB) Exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := d.connect(t, ctx, "")
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("pgtest: %s: %v", firstLine(sql), err)
	}
}

// Pool opens a pgxpool on dsn, closed when the test ends.
func Pool(t testing.TB, dsn string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("pgtest: parse DSN: %v", redact(err))
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: open pool: %v", redact(err))
	}
	t.Cleanup(p.Close)
	return p
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " …"
	}
	return s
}

// redact keeps a password out of test logs.
func redact(err error) string { return logging.Redact(err.Error()) }

// FreshDSN starts the shared server if needed and returns the DSN of a new, empty
// database on it. It is for runnable examples, which get no *testing.T; the database goes
// away with the shared server when Main ends.
func FreshDSN() (string, error) {
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		return "", fmt.Errorf("pgtest: FreshDSN needs a throwaway server; unset %s", EnvDSN)
	}
	shared.once.Do(func() { shared.srv, shared.err = StartServer() })
	if shared.err != nil {
		return "", shared.err
	}
	name := fmt.Sprintf("example_%d_%d", os.Getpid(), dbCounter.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, shared.srv.AdminDSN("postgres"))
	if err != nil {
		return "", err
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE template0"); err != nil {
		return "", err
	}
	return shared.srv.DSN(name), nil
}
