package liveness

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// TestRunWaitsForASlowDatabaseAtStart: a database that does not answer the start-up
// read of the schema's version in time (a fleet starting at once, a server under load) is
// asked again, not reported as a schema that is not ready: Run goes on waiting until its
// context ends. A listener that accepts connections and never answers stands in for the
// server that does not answer in time (a real PostgreSQL cannot be made to stall its
// start-up handshake on demand).
func TestRunWaitsForASlowDatabaseAtStart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, silent, until the test ends
		}
	}()
	pool, err := pgxpool.New(context.Background(), "host=127.0.0.1 port="+strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)+
		" user=u password=p dbname=d sslmode=disable connect_timeout=30")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	old := schemaReadTimeout
	schemaReadTimeout = 100 * time.Millisecond
	defer func() { schemaReadTimeout = old }()
	logs := &logbuf.Recorder{}
	a, err := NewAgent(AgentConfig{Pool: pool, InstanceID: uuid.New(), ServiceName: "svc", Mode: ModeHeartbeatTableOnly,
		Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	select {
	case err := <-done:
		cancel()
		t.Fatalf("Run returned %v while the database had only been slow", err)
	case <-time.After(time.Second): // ten reads that timed out
	}
	logs.ToldOnce(t, "cannot read the schema's version in time", slog.LevelWarn, 5, 2*time.Second)
	cancel()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("Run after its context ended: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// TestRunAsksAgainWhenTheDatabaseIsUnreachableAtStart: a connection reset at start-up (a
// server restarting, a pooler at its limits while a fleet starts at once) is not a
// schema that is not ready: Run asks again, with a backoff, and starts once the database
// answers. A wrong password still ends Run at once. A listener that resets every
// connection, then relays them to the real PostgreSQL, stands in for the server that
// comes back: the shared server cannot be made to refuse and then accept on demand.
func TestRunAsksAgainWhenTheDatabaseIsUnreachableAtStart(t *testing.T) {
	t.Parallel()
	ctx := testutil.Context(t, 90*time.Second)
	db, admin := testdb.MigratedPool(t, 2)
	real, err := pgxpool.ParseConfig(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	target := net.JoinHostPort(real.ConnConfig.Host, strconv.Itoa(int(real.ConnConfig.Port)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var relay atomic.Bool
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !relay.Load() {
				c.(*net.TCPConn).SetLinger(0) // a reset, as a full accept queue answers
				c.Close()
				continue
			}
			go func() {
				defer c.Close()
				s, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer s.Close()
				go func() { io.Copy(s, c); s.Close() }()
				io.Copy(c, s)
			}()
		}
	}()
	cfg := real.Copy()
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(ln.Addr().(*net.TCPAddr).Port)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	logs := &logbuf.Recorder{}
	id := uuid.New()
	a, err := NewAgent(AgentConfig{Pool: pool, InstanceID: id, ServiceName: "svc", Mode: ModeHeartbeatTableOnly,
		Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	defer func() { stop(); <-done }()
	logs.ToldOnce(t, "cannot reach the database", slog.LevelWarn, 3, 10*time.Second)
	select {
	case err := <-done:
		t.Fatalf("Run returned %v while the database could not be reached", err)
	default:
	}
	relay.Store(true)
	if !testutil.Poll(30*time.Second, func() bool {
		var n int
		return admin.QueryRow(ctx, `SELECT count(*) FROM liveness.instances WHERE instance_id = $1`, id).Scan(&n) == nil && n == 1
	}) {
		t.Fatalf("the agent did not register once the database answered:%s", logs)
	}

	wrong := real.Copy()
	wrong.ConnConfig.Password = "not-the-password"
	badPool, err := pgxpool.NewWithConfig(ctx, wrong)
	if err != nil {
		t.Fatal(err)
	}
	defer badPool.Close()
	b, err := NewAgent(AgentConfig{Pool: badPool, InstanceID: uuid.New(), ServiceName: "svc", Mode: ModeHeartbeatTableOnly})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Run(ctx); !errors.Is(err, ErrSchemaNotReady) || strings.Contains(err.Error(), "not-the-password") {
		t.Fatalf("Run with a wrong password = %v; want ErrSchemaNotReady at once, without the password", err)
	}
}
