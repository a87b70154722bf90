// Package nodeagenttest runs node agents (package nodeagent's Server) and processes
// attached to them, for the tests of the server and of the library's client alike. Only
// tests import it. It never imports the library: the server's tests use it without the
// library in their build.
package nodeagenttest

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/nodeagent"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// Token is the node agents' token in the tests.
const Token = "the-node-agents-token-0123456789abcdef"

// Start runs a node agent on a socket in a temporary folder until stop (or the test's
// end), and returns once its session is up.
func Start(t *testing.T, db *pgtest.DB, socket string) (n *nodeagent.Server, stop func()) {
	t.Helper()
	logger, logs := logbuf.Logger()
	n, err := nodeagent.New(nodeagent.Config{DirectDSN: db.DSN, Socket: socket, ServiceName: "node",
		Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	stop = run(t, n, logs, nil)
	testutil.Eventually(t, 10*time.Second, "the node agent's session up", func() bool { return n.Snapshot().SessionUp })
	return n, stop
}

// StartAt is Start, noting in listening when the node agent listens; it does not wait
// for the session.
func StartAt(t *testing.T, db *pgtest.DB, socket string, listening *time.Time) (*nodeagent.Server, func()) {
	t.Helper()
	n, err := nodeagent.New(nodeagent.Config{DirectDSN: db.DSN, Socket: socket, ServiceName: "node"})
	if err != nil {
		t.Fatal(err)
	}
	return n, run(t, n, nil, listening)
}

// run runs n until the returned stop (or the test's end), which fails the test if Run
// returned an error and prints logs (if any) when the test failed. listening, if not nil,
// is set to when Run was called.
func run(t *testing.T, n *nodeagent.Server, logs *logbuf.Buffer, listening *time.Time) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	if listening != nil {
		*listening = time.Now()
	}
	go func() { done <- n.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("node agent: %v", err)
			}
			if logs != nil && t.Failed() {
				t.Logf("the node agent's log:\n%s", logs)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// TCP is a node agent listening on TCP only, as in Kubernetes.
type TCP struct {
	*nodeagent.Server
	Addr string         // where it listens
	Logs *logbuf.Buffer // its log
	Stop func()
}

// StartTCP runs a node agent on addr (127.0.0.1:0: a port of its choosing) with Token,
// keeping its claims in claims, until Stop (or the test's end); it returns once the node
// agent listens. listening, if not nil, is set to when Run was called. At its stop it
// fails the test if the node agent logged its token.
func StartTCP(t *testing.T, db *pgtest.DB, addr, claims string, listening *time.Time) *TCP {
	t.Helper()
	logger, logs := logbuf.Logger()
	n, err := nodeagent.New(nodeagent.Config{DirectDSN: db.DSN, ListenAddress: addr, Token: Token,
		ClaimsFile: claims, ServiceName: "node", Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs after the stop's cleanup: the shutdown's lines count.
	t.Cleanup(func() {
		if strings.Contains(logs.String(), Token) {
			t.Errorf("the node agent logged its token:\n%s", logs)
		}
	})
	stop := run(t, n, logs, listening)
	testutil.Eventually(t, 10*time.Second, "the node agent listening", func() bool { return n.Snapshot().ListenAddress != "" })
	return &TCP{Server: n, Addr: n.Snapshot().ListenAddress, Logs: logs, Stop: stop}
}

// RunUntilCleanup runs n until stop or the test's end, and fails the test unless Run
// returns nil within 10 s of its context ending. It does not wait for anything.
func RunUntilCleanup(t *testing.T, n *nodeagent.Server) (stop func()) {
	t.Helper()
	return testutil.RunUntilCleanup(t, n.Run)
}

// RawAttach attaches an instance over the socket as a process would, without an Agent:
// the connection is the lock, and closing it is what a killed process's kernel does.
func RawAttach(t *testing.T, socket string, id uuid.UUID, database string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	b, _ := json.Marshal(map[string]any{"op": "attach", "instance": id, "schema": "liveness", "database": database})
	if _, err := c.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
	return c
}

// CurrentDatabase is the pool's database.
func CurrentDatabase(t *testing.T, db *pgtest.DB) string {
	t.Helper()
	var database string
	if err := db.Conn(t).QueryRow(testutil.Context(t, 10*time.Second), `SELECT current_database()`).Scan(&database); err != nil {
		t.Fatal(err)
	}
	return database
}

// InsertAttachedRow writes the row of an instance whose lock the node agent named node
// holds, as its heartbeat would, with the lock grace given.
func InsertAttachedRow(t *testing.T, db *pgtest.DB, id uuid.UUID, service string, grace time.Duration) {
	t.Helper()
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock, lock_pid, lock_grace,
		stale_threshold, definitive_dead_cutoff)
		SELECT $1, $2, true, pid, make_interval(secs => $3), interval '90 seconds', interval '5 minutes'
		  FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'node:node-agent'`, id, service,
		grace.Seconds())
}

// AwaitDeathThenHold reads heir's answers until it holds its lock, failing on anything
// but "not dead yet" refusals before that, and fails the test unless there was at least
// one: an instance whose claimant was killed goes to another process only once the fleet
// calls it dead (its lock grace).
func AwaitDeathThenHold(t *testing.T, heir *Process) {
	t.Helper()
	var refusals int
	for {
		a := heir.Next(t)
		if a.Op == "state" && a.Held {
			break
		}
		if a.Op != "error" || !strings.Contains(a.Error, "not dead yet") {
			t.Fatalf("another process's attach after the owner's kill: %+v; want refused until the instance is dead", a)
		}
		refusals++
	}
	if refusals == 0 {
		t.Error("the heir attached at once after the owner's kill: the instance was not dead yet (its lock grace)")
	}
	t.Logf("the heir was refused %d times until the instance was dead, then held its lock", refusals)
}
