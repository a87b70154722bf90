package database

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// A pool configuration the pool cannot work with is refused before anything connects,
// with a *store.ConfigError naming the PoolConfig field (the binary maps it to its flag).
func TestPoolConfigErrorsNameTheField(t *testing.T) {
	const dsn = "host=127.0.0.1 port=1 user=u dbname=d sslmode=disable"
	for _, c := range []struct {
		cfg   PoolConfig
		field string
	}{
		{PoolConfig{DSN: dsn, MaxConns: 0, ConnectTimeout: time.Second}, "PoolConfig.MaxConns"},
		{PoolConfig{DSN: dsn, MaxConns: MaxMaxConns + 1, ConnectTimeout: time.Second}, "PoolConfig.MaxConns"},
		{PoolConfig{DSN: dsn, MaxConns: 1, ConnectTimeout: 0}, "PoolConfig.ConnectTimeout"},
		{PoolConfig{DSN: dsn, MaxConns: 1, ConnectTimeout: -time.Second}, "PoolConfig.ConnectTimeout"},
	} {
		pool, err := NewPool(c.cfg)
		if pool != nil {
			pool.Close()
		}
		var ce *store.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("NewPool(MaxConns %d, ConnectTimeout %s): %v; want a *store.ConfigError naming %s",
				c.cfg.MaxConns, c.cfg.ConnectTimeout, err, c.field)
		}
	}
	pool, err := NewPool(PoolConfig{DSN: dsn, MaxConns: MaxMaxConns, ConnectTimeout: time.Second})
	if err != nil {
		t.Fatalf("the largest pool is refused: %v", err)
	}
	pool.Close()
}

// The decision alone, for versions no test here can run (9.6, 19): a major outside 14 to
// 18, or a version that does not parse, gets a line; the supported ones none.
func TestVersionWarning(t *testing.T) {
	for _, c := range []struct {
		version string
		want    string // a piece of the line; "" for none
	}{
		{"14.0", ""},
		{"15.18 (Debian 15.18-0+deb12u1)", ""},
		{"16.14", ""},
		{"17.10", ""},
		{"18.4", ""},
		{"13.23", "PostgreSQL 13.23 is not supported: the oldest supported major is 14 (supported: 14 to 18)"},
		{"9.6.24", "PostgreSQL 9.6.24 is not supported"},
		{"19devel", "PostgreSQL 19devel is newer than the newest major this release is tested on (supported: 14 to 18)"},
		{"19beta1", "is newer than"},
		{"", "cannot tell the PostgreSQL major"},
		{"EnterpriseDB 12", "cannot tell the PostgreSQL major"},
	} {
		got := VersionWarning(c.version)
		if c.want == "" && got != "" || !strings.Contains(got, c.want) {
			t.Errorf("VersionWarning(%q) = %q, want %q", c.version, got, c.want)
		}
	}
}

// poolLog opens a pool on dsn with a logger, uses two connections at once, and returns
// what was logged.
func poolLog(t *testing.T, dsn string) string {
	t.Helper()
	var logs logbuf.Buffer // the pool's connections write to it concurrently
	pool, err := NewPool(PoolConfig{DSN: dsn, MaxConns: 2, ConnectTimeout: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []interface {
		Release()
	}{a, b} {
		c.Release()
	}
	var one int
	if err := pool.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil || one != 1 {
		t.Fatalf("the pool does not serve: %v", err)
	}
	return logs.String()
}

// A real PostgreSQL 13: one warning for the pool's two connections, and the pool serves.
func TestPoolNamesAnUnsupportedMajorOnce(t *testing.T) {
	s := pgtest.NewServer(t, pgtest.WithMajor(13))
	logs := poolLog(t, s.DSN("postgres"))
	if n := strings.Count(logs, "level=WARN"); n != 1 || !strings.Contains(logs, `is not supported: the oldest supported major is 14`) ||
		!strings.Contains(logs, "server_version=13.") {
		t.Errorf("want one warning naming PostgreSQL 13, got %d lines:\n%s", n, logs)
	}
}

// The run's own major (one of 14 to 18) gets no line.
func TestPoolIsQuietOnASupportedMajor(t *testing.T) {
	db := pgtest.NewDB(t)
	if logs := poolLog(t, db.DSN); logs != "" {
		t.Errorf("logged on a supported major:\n%s", logs)
	}
}

// Each connection keeps only the statement cache its exec mode uses (pgx would build
// both, about 25 KB each), and the pool serves parameterized queries, twice (the second
// from the cache), whatever default_query_exec_mode the DSN chooses.
func TestPoolKeepsTheCacheItsExecModeUses(t *testing.T) {
	db := pgtest.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []struct {
		mode                  string // "" for pgx's default, cache_statement
		statements, describes int    // the caches' capacities
	}{
		{"", 512, 0},
		{"cache_statement", 512, 0},
		{"cache_describe", 0, 512},
		{"describe_exec", 512, 512},
		{"exec", 512, 512},
		{"simple_protocol", 512, 512},
	} {
		dsn := db.DSN
		if c.mode != "" {
			dsn += " default_query_exec_mode=" + c.mode
		}
		pool, err := NewPool(PoolConfig{DSN: dsn, MaxConns: 1, ConnectTimeout: 5 * time.Second})
		if err != nil {
			t.Fatalf("%s: %v", c.mode, err)
		}
		cc := pool.Config().ConnConfig
		if cc.StatementCacheCapacity != c.statements || cc.DescriptionCacheCapacity != c.describes {
			t.Errorf("mode %q: statement cache %d, description cache %d; want %d and %d", c.mode,
				cc.StatementCacheCapacity, cc.DescriptionCacheCapacity, c.statements, c.describes)
		}
		for range 2 {
			var n int
			if err := pool.QueryRow(ctx, `SELECT $1::int + 1`, 41).Scan(&n); err != nil || n != 42 {
				t.Errorf("mode %q: %d, %v; want 42", c.mode, n, err)
			}
		}
		pool.Close()
	}
}
