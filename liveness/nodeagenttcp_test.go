package liveness_test

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// testToken is the node agents' token in these tests.
const testToken = "the-node-agents-token-0123456789abcdef"

// tcpNodeAgent is a node agent listening on TCP only, as in Kubernetes.
type tcpNodeAgent struct {
	*liveness.NodeAgent
	addr string         // where it listens
	logs *logbuf.Buffer // its log
	stop func()
}

// startNodeAgentTCP runs a node agent on addr (127.0.0.1:0: a port of its choosing) with
// testToken, keeping its claims in claims, until stop (or the test's end); it returns
// once the node agent listens. listening, if not nil, is set to when Run was called.
func startNodeAgentTCP(t *testing.T, db *pgtest.DB, addr, claims string, listening *time.Time) *tcpNodeAgent {
	t.Helper()
	logger, logs := logbuf.Logger()
	n, err := liveness.NewNodeAgent(liveness.NodeAgentConfig{DirectDSN: db.DSN, ListenAddress: addr, Token: testToken,
		ClaimsFile: claims, ServiceName: "node", Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	if listening != nil {
		*listening = time.Now()
	}
	go func() { done <- n.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("node agent: %v", err)
			}
			if t.Failed() {
				t.Logf("the node agent's log:\n%s", logs)
			}
			if strings.Contains(logs.String(), testToken) {
				t.Errorf("the node agent logged its token:\n%s", logs)
			}
		})
	}
	t.Cleanup(stop)
	testutil.Eventually(t, 10*time.Second, "the node agent listening", func() bool { return n.Snapshot().ListenAddress != "" })
	return &tcpNodeAgent{NodeAgent: n, addr: n.Snapshot().ListenAddress, logs: logs, stop: stop}
}

// currentDatabase is the pool's database.
func currentDatabase(t *testing.T, db *pgtest.DB) string {
	t.Helper()
	var database string
	if err := db.Conn(t).QueryRow(testutil.Context(t, 10*time.Second), `SELECT current_database()`).Scan(&database); err != nil {
		t.Fatal(err)
	}
	return database
}

// insertAttachedRow writes the row of an instance whose lock the node agent named node
// holds, as its heartbeat would, with the lock grace given.
func insertAttachedRow(t *testing.T, db *pgtest.DB, id uuid.UUID, service string, grace time.Duration) {
	t.Helper()
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock, lock_pid, lock_grace,
		stale_threshold, definitive_dead_cutoff)
		SELECT $1, $2, true, pid, make_interval(secs => $3), interval '90 seconds', interval '5 minutes'
		  FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'node:node-agent'`, id, service,
		grace.Seconds())
}

// TestNodeAgentOverTCPLetsAKilledProcessGoAtOnce: a process attached over TCP (a process
// of its own) is killed with SIGKILL; its kernel closes the connection, the node agent
// lets its lock go at once, and the fleet calls it dead a lock grace later, as over the
// unix socket. Neither the token nor anything else secret is logged.
func TestNodeAgentOverTCPLetsAKilledProcessGoAtOnce(t *testing.T) {
	t.Parallel()
	db, _ := testdb.MigratedPool(t, 2)
	ctx := testutil.Context(t, time.Minute)
	node := startNodeAgentTCP(t, db, "127.0.0.1:0", filepath.Join(t.TempDir(), "claims"), nil)
	// An agent of another node: its watcher records the lock's vanishing.
	runAgent(t, newAgent(t, defaultAgentConfig(db, db.Pool(t, 4), "other-node")))

	id := uuid.New()
	p := attachProcess(t, "tcp://"+node.addr, id, currentDatabase(t, db), testToken)
	if a := p.next(t); a.Op != "state" || !a.Held {
		t.Fatalf("the attach over TCP: %+v; want its lock held", a)
	}
	insertAttachedRow(t, db, id, "tcp-victim", time.Second)
	deaths := db.ConnAs(t, "test:listener")
	if _, err := deaths.Exec(ctx, `SELECT liveness.members_listen()`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * defaults.WatchInterval)

	killed := time.Now()
	p.kill(t)
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

// TestNodeAgentOverTCPGivesAnInstanceToNoOtherProcess: over TCP an instance is the
// process that claimed it, known by the secret it drew at its start. Another process
// with the token that names it is refused, counted, while its claimant is attached; after
// a restart of the node agent, a process that attaches first is refused until the
// instance is dead, and the claimant attaches again as its own; after the claimant is
// killed, the id may begin a new life only once the fleet has called it dead.
func TestNodeAgentOverTCPGivesAnInstanceToNoOtherProcess(t *testing.T) {
	t.Parallel()
	db, _ := testdb.MigratedPool(t, 2)
	addr, claims := testutil.FreeAddr(t), filepath.Join(t.TempDir(), "claims")
	node := startNodeAgentTCP(t, db, addr, claims, nil)
	database, where := currentDatabase(t, db), "tcp://"+addr

	id := uuid.New()
	owner := attachProcess(t, where, id, database, testToken)
	if a := owner.next(t); a.Op != "state" || !a.Held {
		t.Fatalf("the owner's attach: %+v; want its lock held", a)
	}
	// A lock grace longer than a restart of the node agent: the instance is not dead
	// while it is away.
	insertAttachedRow(t, db, id, "owner", 3*time.Second)

	impostor := attachProcess(t, where, id, database, testToken)
	if a := impostor.next(t); a.Op != "error" || !strings.Contains(a.Error, "which is attached") {
		t.Fatalf("another process's attach of the owner's instance: %+v; want refused, its claimant attached", a)
	}
	if n := node.Snapshot().Impostors; n == 0 {
		t.Error("no impostor counted")
	}
	impostor.kill(t)

	// Across a restart: nobody is attached with the owner's secret when the node agent
	// comes back (the owner is stopped meanwhile, so that it cannot attach first), and the
	// instance is not dead: a process that comes first is refused; the owner attaches
	// again as its own.
	if err := owner.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	node.stop()
	first := attachProcess(t, where, id, database, testToken) // dials until the node agent listens
	startNodeAgentTCP(t, db, addr, claims, nil)               // stopped at the test's end
	if a := first.next(t); a.Op != "error" || !strings.Contains(a.Error, "not dead yet") {
		t.Fatalf("another process's attach first after the node agent's restart: %+v; want refused", a)
	}
	first.kill(t)
	if err := owner.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if a := owner.next(t); a.Op != "state" || !a.Held {
		t.Fatalf("the owner's attach again after the node agent's restart: %+v; want its lock held", a)
	}

	// The owner killed: until the fleet calls it dead, nobody else may claim it.
	owner.kill(t)
	heir := attachProcess(t, where, id, database, testToken)
	var refusals int
	for {
		a := heir.next(t)
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

// TestNodeAgentOverTCPTakesOnlyAuthenticatedAttaches: over TCP the first line must be an
// attach with the node agent's token and a process secret. Anything else is told why,
// closed and counted, costs the database nothing, and no token is ever logged or sent
// back; garbage is a protocol error, as on the socket.
func TestNodeAgentOverTCPTakesOnlyAuthenticatedAttaches(t *testing.T) {
	t.Parallel()
	db, _ := testdb.MigratedPool(t, 2)
	node := startNodeAgentTCP(t, db, "127.0.0.1:0", filepath.Join(t.TempDir(), "claims"), nil)
	database := currentDatabase(t, db)
	const wrongToken = "not-the-node-agents-token-0123456789"

	// answer sends line on a new connection and returns the one reply, and, if
	// waitClose, whether the node agent closed the connection after it.
	answer := func(line string, waitClose bool) (reply string, closed bool) {
		t.Helper()
		c, err := net.Dial("tcp", node.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		dec := json.NewDecoder(c)
		var m json.RawMessage
		if err := dec.Decode(&m); err == nil {
			reply = string(m)
		}
		if !waitClose {
			return reply, false
		}
		var more json.RawMessage
		err = dec.Decode(&more)
		return reply, err != nil && !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err)
	}
	attach := func(fields map[string]any) string {
		m := map[string]any{"op": "attach", "instance": uuid.New(), "schema": "liveness", "database": database}
		for k, v := range fields {
			m[k] = v
		}
		b, _ := json.Marshal(m)
		return string(b)
	}

	before := node.Snapshot()
	reply, closed := answer("GET / HTTP/1.1", true)
	if reply != "" || !closed {
		t.Errorf("garbage over TCP: reply %q, closed %v; want the connection closed without a word", reply, closed)
	}
	for _, c := range []struct {
		name, line, want string
	}{
		{"no token", attach(map[string]any{"secret": "a-secret-of-the-process-0123"}), "carries no token"},
		{"a wrong token", attach(map[string]any{"secret": "a-secret-of-the-process-0123", "token": wrongToken}), "is not the node agent's"},
		{"no secret", attach(map[string]any{"token": testToken}), "no process secret"},
		{"a proof first", `{"op":"prove","seq":1}`, "must be an attach"},
	} {
		reply, closed := answer(c.line, true)
		if !strings.Contains(reply, `"op":"error"`) || !strings.Contains(reply, c.want) || !closed {
			t.Errorf("%s: reply %q, closed %v; want an error saying %q, and the connection closed", c.name, reply, closed, c.want)
		}
		if strings.Contains(reply, testToken) || strings.Contains(reply, wrongToken) {
			t.Errorf("%s: the reply repeats a token: %s", c.name, reply)
		}
	}
	after := node.Snapshot()
	if got := after.Unauthenticated - before.Unauthenticated; got != 4 {
		t.Errorf("%d connections counted unauthenticated; want 4", got)
	}
	if got := after.ProtocolErrors - before.ProtocolErrors; got != 1 {
		t.Errorf("%d protocol errors counted for one line of garbage; want 1", got)
	}
	if after.Proofs-before.Proofs > 1 || after.Claims != before.Claims { // its own verification may come due
		t.Errorf("unauthenticated connections cost the database: %d verifications, %d claims", after.Proofs-before.Proofs,
			after.Claims-before.Claims)
	}
	if strings.Contains(node.logs.String(), wrongToken) {
		t.Errorf("the node agent logged a token it was sent:\n%s", node.logs)
	}

	// With the token and a secret: attached, its lock held.
	reply, _ = answer(attach(map[string]any{"secret": "a-secret-of-the-process-0123", "token": testToken}), false)
	if !strings.Contains(reply, `"op":"state"`) || !strings.Contains(reply, `"held":true`) {
		t.Errorf("an authenticated attach: %s; want its lock held", reply)
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

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestNodeAgentOverTCPLeadersStepDownWhileItIsAwayAndAttachAgainAtOnce: the socket's
// test over TCP, with an Agent attached by tcp://host:port and the token: it leads
// nothing while the node agent is away, and its lock is held again within half a second
// of the node agent's return. Five trials.
func TestNodeAgentOverTCPLeadersStepDownWhileItIsAwayAndAttachAgainAtOnce(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	addr, claims := portNoOneElseTakes(t), filepath.Join(t.TempDir(), "claims")
	start := func(listening *time.Time) func() { return startNodeAgentTCP(t, db, addr, claims, listening).stop }
	stop := start(nil)
	cfg := liveness.AgentConfig{Pool: pool, NodeAgentSocket: "tcp://" + addr, NodeAgentToken: testToken,
		InstanceID: uuid.New(), ServiceName: "attached"}
	leadersStepDownAndAttachAgain(t, cfg, stop, start,
		[]time.Duration{time.Second, 2 * time.Second, time.Second, time.Second, 2 * time.Second})
}

// Bad TCP settings are refused before anything listens or dials, each error naming its
// field, and none repeating a token.
func TestNodeAgentTCPSettingsRefused(t *testing.T) {
	const dsn = "host=127.0.0.1 user=u dbname=d"
	claims := filepath.Join(t.TempDir(), "claims")
	for _, c := range []struct {
		name string
		cfg  liveness.NodeAgentConfig
		want string
	}{
		{"nowhere to listen", liveness.NodeAgentConfig{DirectDSN: dsn}, "NodeAgentConfig.Socket or NodeAgentConfig.ListenAddress must be set"},
		{"no port", liveness.NodeAgentConfig{DirectDSN: dsn, ListenAddress: "127.0.0.1", Token: testToken, ClaimsFile: claims}, "NodeAgentConfig.ListenAddress (\"127.0.0.1\") is not host:port"},
		{"a named port", liveness.NodeAgentConfig{DirectDSN: dsn, ListenAddress: ":http", Token: testToken, ClaimsFile: claims}, "NodeAgentConfig.ListenAddress (\":http\") names no port number"},
		{"a port too large", liveness.NodeAgentConfig{DirectDSN: dsn, ListenAddress: ":65536", Token: testToken, ClaimsFile: claims}, "NodeAgentConfig.ListenAddress (\":65536\") names no port number"},
		{"no token", liveness.NodeAgentConfig{DirectDSN: dsn, ListenAddress: ":9817", ClaimsFile: claims}, "NodeAgentConfig.Token must be set with NodeAgentConfig.ListenAddress"},
		{"a short token", liveness.NodeAgentConfig{DirectDSN: dsn, ListenAddress: ":9817", Token: "hunter2", ClaimsFile: claims}, "NodeAgentConfig.Token must be at least 16 bytes"},
		{"no claims file", liveness.NodeAgentConfig{DirectDSN: dsn, ListenAddress: ":9817", Token: testToken}, "NodeAgentConfig.ClaimsFile must be set without NodeAgentConfig.Socket"},
	} {
		_, err := liveness.NewNodeAgent(c.cfg)
		var ce *liveness.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want a ConfigError saying %q", c.name, err, c.want)
		}
		if err != nil && (strings.Contains(err.Error(), testToken) || strings.Contains(err.Error(), "hunter2")) {
			t.Errorf("%s: the error repeats the token: %v", c.name, err)
		}
	}
	pool, err := pgxpool.New(context.Background(), dsn) // connects only when used, which Validate does not
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, c := range []struct {
		name, socket, token, want string
	}{
		{"another scheme", "udp://127.0.0.1:9817", testToken, "AgentConfig.NodeAgentSocket (\"udp://127.0.0.1:9817\"): udp:// is not a node agent's"},
		{"no port", "tcp://127.0.0.1", testToken, "is not tcp://host:port with a port number"},
		{"no host", "tcp://:9817", testToken, "is not tcp://host:port with a port number"},
		{"port 0", "tcp://127.0.0.1:0", testToken, "is not tcp://host:port with a port number"},
		{"no token", "tcp://127.0.0.1:9817", "", "AgentConfig.NodeAgentToken must be set with a NodeAgentSocket of tcp://"},
		{"a short token", "tcp://127.0.0.1:9817", "hunter2", "AgentConfig.NodeAgentToken must be at least 16 bytes"},
	} {
		err := liveness.AgentConfig{Pool: pool, InstanceID: uuid.New(), ServiceName: "s", NodeAgentSocket: c.socket,
			NodeAgentToken: c.token}.Validate()
		var ce *liveness.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want a ConfigError saying %q", c.name, err, c.want)
		}
		if err != nil && (strings.Contains(err.Error(), testToken) || strings.Contains(err.Error(), "hunter2")) {
			t.Errorf("%s: the error repeats the token: %v", c.name, err)
		}
	}
}
