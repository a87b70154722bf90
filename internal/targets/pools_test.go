package targets

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const app = "pg_liveness_exporter:probe-test"

func testPools(t *testing.T, opts Options, dbs ...*pgtest.DB) *Pools {
	t.Helper()
	cfg := &Config{targets: map[string]Target{}}
	for i, db := range dbs {
		name := string(rune('a' + i))
		cfg.targets[name] = Target{Name: name, dsn: db.DSN}
	}
	opts.ApplicationName = app
	opts.ConnectTimeout = 5 * time.Second
	p, err := NewPools(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// serverConns counts the server's sessions of the pools.
func serverConns(t *testing.T, db *pgtest.DB) int {
	return db.QueryInt(t, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()", app)
}

func pool(t *testing.T, p *Pools, name string) *pgxpool.Pool {
	t.Helper()
	pool, ok, err := p.Pool(name)
	if !ok || err != nil {
		t.Fatalf("Pool(%s): %v %v", name, ok, err)
	}
	return pool
}

func TestPoolsOpenLazilyAndCloseIdleConnections(t *testing.T) {
	a, b := pgtest.NewDB(t), pgtest.NewDB(t)
	p := testPools(t, Options{MaxConns: 4, MaxConnsPerTarget: 2, IdleTimeout: 300 * time.Millisecond}, a, b)
	pa := pool(t, p, "a")
	if _, ok, _ := p.Pool("nope"); ok {
		t.Fatal("an unknown target has a pool")
	}
	if n := p.Conns() + serverConns(t, a); n != 0 {
		t.Fatalf("%d connections before the first statement", n)
	}
	ctx := testutil.Context(t, 10*time.Second)
	if _, err := pa.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if p.Conns() != 1 || serverConns(t, a) != 1 {
		t.Fatalf("after one statement: %d connections counted, %d on the server", p.Conns(), serverConns(t, a))
	}
	testutil.Eventually(t, 10*time.Second, "the idle connection closed", func() bool { return p.Conns() == 0 })
	testutil.Eventually(t, 10*time.Second, "the server's session gone", func() bool { return serverConns(t, a) == 0 })
}

func TestPoolsCapConnectionsAcrossTargets(t *testing.T) {
	a, b, c := pgtest.NewDB(t), pgtest.NewDB(t), pgtest.NewDB(t)
	p := testPools(t, Options{MaxConns: 2, MaxConnsPerTarget: 2, IdleTimeout: time.Hour}, a, b, c)
	ctx := testutil.Context(t, 20*time.Second)
	// a and b each hold a connection, in use: the cap is reached.
	ca, err := pool(t, p, "a").Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	released := false
	defer func() {
		if !released {
			ca.Release()
		}
	}()
	cb, err := pool(t, p, "b").Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Release()
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = pool(t, p, "c").Exec(short, "SELECT 1")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("c got a connection beyond the cap: %v", err)
	}
	if p.Conns() != 2 {
		t.Fatalf("%d connections, cap 2", p.Conns())
	}
	// a's connection turns idle: c closes it to make room, within its own deadline.
	ca.Release()
	released = true
	if _, err := pool(t, p, "c").Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("c at the cap with an idle connection elsewhere: %v", err)
	}
	if got := p.Conns(); got != 2 {
		t.Fatalf("%d connections after the eviction, want 2", got)
	}
	testutil.Eventually(t, 10*time.Second, "a's session closed on the server", func() bool { return serverConns(t, a) == 0 })
	if serverConns(t, c) != 1 {
		t.Fatalf("c has %d sessions", serverConns(t, c))
	}
}

func TestPoolsReplaceClosesOnlyChangedTargets(t *testing.T) {
	a, b := pgtest.NewDB(t), pgtest.NewDB(t)
	p := testPools(t, Options{MaxConns: 4, MaxConnsPerTarget: 1, IdleTimeout: time.Hour}, a, b)
	pa, pb := pool(t, p, "a"), pool(t, p, "b")
	ctx := testutil.Context(t, 10*time.Second)
	for _, pl := range []*pgxpool.Pool{pa, pb} {
		if _, err := pl.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
	}
	// b's DSN changes, a's does not.
	next := &Config{targets: map[string]Target{"a": {Name: "a", dsn: a.DSN}, "b": {Name: "b", dsn: b.DSN + " connect_timeout=3"}}}
	p.Replace(next)
	if pool(t, p, "a") != pa {
		t.Error("a's pool was replaced though its DSN is the same")
	}
	if pool(t, p, "b") == pb {
		t.Error("b's pool was kept though its DSN changed")
	}
	testutil.Eventually(t, 10*time.Second, "b's old connection closed", func() bool { return serverConns(t, b) == 0 })
	if serverConns(t, a) != 1 {
		t.Errorf("a has %d sessions, want its one kept", serverConns(t, a))
	}
	p.Replace(&Config{targets: map[string]Target{"a": next.targets["a"]}})
	if _, ok, _ := p.Pool("b"); ok {
		t.Error("a removed target still has a pool")
	}
}

func TestNewPoolsNamesTheField(t *testing.T) {
	cfg := &Config{targets: map[string]Target{}}
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{MaxConns: 1, MaxConnsPerTarget: 2, IdleTimeout: time.Second, ConnectTimeout: time.Second}, "Options.MaxConns"},
		{Options{MaxConns: 1, MaxConnsPerTarget: 0, IdleTimeout: time.Second, ConnectTimeout: time.Second}, "Options.MaxConnsPerTarget"},
		{Options{MaxConns: 1, MaxConnsPerTarget: 1, ConnectTimeout: time.Second}, "Options.IdleTimeout"},
	} {
		if _, err := NewPools(cfg, c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %s", c.o, err, c.want)
		}
	}
}

// Each server holds at most its share of the cap (the cap over the servers of the
// configuration, here 4 over 2): at its share, a target of that server waits for one of
// the server's own connections, even with the cap not reached, and takes no other
// server's; the other server's targets connect at once meanwhile.
func TestPoolsShareTheCapByServer(t *testing.T) {
	a1, a2, a3 := pgtest.NewDB(t), pgtest.NewDB(t), pgtest.NewDB(t) // the shared server
	b := pgtest.NewDBOn(t, pgtest.NewServer(t))
	p := testPools(t, Options{MaxConns: 4, MaxConnsPerTarget: 2, IdleTimeout: time.Hour}, a1, a2, a3, b)
	ctx := testutil.Context(t, 20*time.Second)
	// a and b (a1, a2) hold the shared server's two connections, in use.
	var held []*pgxpool.Conn
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	for _, name := range []string{"a", "b"} {
		c, err := pool(t, p, name).Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := pool(t, p, "c").Exec(short, "SELECT 1")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a third connection to the shared server beyond its share of 2: %v", err)
	}
	// The other server's target (d, on b) is not kept waiting: two connections at once.
	for range 2 {
		c, err := pool(t, p, "d").Acquire(ctx)
		if err != nil {
			t.Fatalf("the other server's target: %v", err)
		}
		held = append(held, c)
	}
	if p.Conns() != 4 {
		t.Fatalf("%d connections, want 4", p.Conns())
	}
	// a's connection turns idle: c closes it (its own server's) and connects.
	held[0].Release()
	held = held[1:]
	if _, err := pool(t, p, "c").Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("c at its server's share with an idle connection of it: %v", err)
	}
	testutil.Eventually(t, 10*time.Second, "a's session closed", func() bool { return serverConns(t, a1) == 0 })
}
