package liveness_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/nodeagenttest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// TestNodeAgentOverTCPLetsAKilledProcessGoAtOnce: a process attached over TCP (a process
// of its own) is killed with SIGKILL; its kernel closes the connection, the node agent
// lets its lock go at once, and the fleet calls it dead a lock grace later, as over the
// unix socket. Neither the token nor anything else secret is logged.
func TestNodeAgentOverTCPLetsAKilledProcessGoAtOnce(t *testing.T) {
	t.Parallel()
	db, _ := testdb.MigratedPool(t, 2)
	ctx := testutil.Context(t, time.Minute)
	node := nodeagenttest.StartTCP(t, db, "127.0.0.1:0", filepath.Join(t.TempDir(), "claims"), nil)
	// An agent of another node: its watcher records the lock's vanishing.
	runAgent(t, newAgent(t, defaultAgentConfig(db, db.Pool(t, 4), "other-node")))

	id := uuid.New()
	p := nodeagenttest.AttachProcess(t, "tcp://"+node.Addr, id, nodeagenttest.CurrentDatabase(t, db), nodeagenttest.Token)
	if a := p.Next(t); a.Op != "state" || !a.Held {
		t.Fatalf("the attach over TCP: %+v; want its lock held", a)
	}
	nodeagenttest.InsertAttachedRow(t, db, id, "tcp-victim", time.Second)
	deaths := db.ConnAs(t, "test:listener")
	if _, err := deaths.Exec(ctx, `SELECT liveness.members_listen()`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * defaults.WatchInterval)

	killed := time.Now()
	p.Kill(t)
	for node.Snapshot().LocksHeld != 0 {
		if time.Since(killed) > 10*time.Second {
			t.Fatal("the node agent still holds the killed process's lock 10 s after the kill")
		}
		time.Sleep(time.Millisecond)
	}
	released := time.Since(killed)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		n, err := deaths.WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("no dead:%s within 10 s of the kill: %v", id, err)
		}
		if n.Payload == "dead:"+id.String() {
			break
		}
	}
	dead := time.Since(killed)
	t.Logf("a process attached over TCP, killed -9: its lock let go %s after the kill, dead by the verdict %s after it",
		released.Round(time.Millisecond), dead.Round(time.Millisecond))
	if released > time.Second {
		t.Errorf("the lock let go %s after the kill; want at once (the kernel closes a killed process's connection)", released)
	}
	if dead > 3*time.Second {
		t.Errorf("dead %s after the kill; want about a lock grace (1 s)", dead)
	}
}

// portNoOneElseTakes is a free 127.0.0.1 address whose port is below both FreePort's
// range (from 20000) and the kernel's ephemeral ports, so that no other test's server,
// proxy or exporter, nor a listener on port 0, can take it while the node agent that
// listens on it is away (a server of another test did, from FreePort's range).
func portNoOneElseTakes(t *testing.T) string {
	t.Helper()
	for range 100 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(10000+rand.IntN(10000)))
		if l, err := net.Listen("tcp", addr); err == nil {
			_ = l.Close()
			return addr
		}
	}
	t.Fatal("no free port between 10000 and 19999 on 127.0.0.1")
	return ""
}

// TestNodeAgentOverTCPLeadersStepDownWhileItIsAwayAndAttachAgainAtOnce: the socket's
// test over TCP, with an Agent attached by tcp://host:port and the token: it leads
// nothing while the node agent is away, and its lock is held again within half a second
// of the node agent's return. Five trials.
func TestNodeAgentOverTCPLeadersStepDownWhileItIsAwayAndAttachAgainAtOnce(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	addr, claims := portNoOneElseTakes(t), filepath.Join(t.TempDir(), "claims")
	start := func(listening *time.Time) func() { return nodeagenttest.StartTCP(t, db, addr, claims, listening).Stop }
	stop := start(nil)
	cfg := liveness.AgentConfig{Pool: pool, NodeAgentSocket: "tcp://" + addr, NodeAgentToken: nodeagenttest.Token,
		InstanceID: uuid.New(), ServiceName: "attached"}
	leadersStepDownAndAttachAgain(t, cfg, stop, start,
		[]time.Duration{time.Second, 2 * time.Second, time.Second, time.Second, 2 * time.Second})
}

// A process's bad TCP settings for its node agent are refused before it dials, each error
// naming its field, and none repeating a token. (The node agent's are refused by the
// server: TestNodeAgentTCPSettingsRefused.)
func TestNodeAgentTCPAgentSettingsRefused(t *testing.T) {
	const dsn = "host=127.0.0.1 user=u dbname=d"
	pool, err := pgxpool.New(context.Background(), dsn) // connects only when used, which Validate does not
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, c := range []struct {
		name, socket, token, want string
	}{
		{"another scheme", "udp://127.0.0.1:9817", nodeagenttest.Token, "AgentConfig.NodeAgentSocket (\"udp://127.0.0.1:9817\"): udp:// is not a node agent's"},
		{"no port", "tcp://127.0.0.1", nodeagenttest.Token, "is not tcp://host:port with a port number"},
		{"no host", "tcp://:9817", nodeagenttest.Token, "is not tcp://host:port with a port number"},
		{"port 0", "tcp://127.0.0.1:0", nodeagenttest.Token, "is not tcp://host:port with a port number"},
		{"no token", "tcp://127.0.0.1:9817", "", "AgentConfig.NodeAgentToken must be set with a NodeAgentSocket of tcp://"},
		{"a short token", "tcp://127.0.0.1:9817", "hunter2", "AgentConfig.NodeAgentToken must be at least 16 bytes"},
	} {
		err := liveness.AgentConfig{Pool: pool, InstanceID: uuid.New(), ServiceName: "s", NodeAgentSocket: c.socket,
			NodeAgentToken: c.token}.Validate()
		var ce *liveness.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want a ConfigError saying %q", c.name, err, c.want)
		}
		if err != nil && (strings.Contains(err.Error(), nodeagenttest.Token) || strings.Contains(err.Error(), "hunter2")) {
			t.Errorf("%s: the error repeats the token: %v", c.name, err)
		}
	}
}
