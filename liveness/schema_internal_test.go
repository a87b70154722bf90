package liveness

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
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
	logs := &logRecorder{}
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
	logs.toldOnce(t, "cannot read the schema's version in time", slog.LevelWarn, 5, 2*time.Second)
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
