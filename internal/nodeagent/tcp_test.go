package nodeagent_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/nodeagent"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/nodeagenttest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

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
	node := nodeagenttest.StartTCP(t, db, addr, claims, nil)
	database, where := nodeagenttest.CurrentDatabase(t, db), "tcp://"+addr

	id := uuid.New()
	owner := nodeagenttest.AttachProcess(t, where, id, database, nodeagenttest.Token)
	if a := owner.Next(t); a.Op != "state" || !a.Held {
		t.Fatalf("the owner's attach: %+v; want its lock held", a)
	}
	// A lock grace longer than a restart of the node agent: the instance is not dead
	// while it is away.
	nodeagenttest.InsertAttachedRow(t, db, id, "owner", 3*time.Second)

	impostor := nodeagenttest.AttachProcess(t, where, id, database, nodeagenttest.Token)
	if a := impostor.Next(t); a.Op != "error" || !strings.Contains(a.Error, "which is attached") {
		t.Fatalf("another process's attach of the owner's instance: %+v; want refused, its claimant attached", a)
	}
	if n := node.Snapshot().Impostors; n == 0 {
		t.Error("no impostor counted")
	}
	impostor.Kill(t)

	// Across a restart: nobody is attached with the owner's secret when the node agent
	// comes back (the owner is stopped meanwhile, so that it cannot attach first), and the
	// instance is not dead: a process that comes first is refused; the owner attaches
	// again as its own.
	if err := owner.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	node.Stop()
	first := nodeagenttest.AttachProcess(t, where, id, database, nodeagenttest.Token) // dials until the node agent listens
	nodeagenttest.StartTCP(t, db, addr, claims, nil)                                  // stopped at the test's end
	if a := first.Next(t); a.Op != "error" || !strings.Contains(a.Error, "not dead yet") {
		t.Fatalf("another process's attach first after the node agent's restart: %+v; want refused", a)
	}
	first.Kill(t)
	if err := owner.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if a := owner.Next(t); a.Op != "state" || !a.Held {
		t.Fatalf("the owner's attach again after the node agent's restart: %+v; want its lock held", a)
	}

	// The owner killed: until the fleet calls it dead, nobody else may claim it.
	owner.Kill(t)
	heir := nodeagenttest.AttachProcess(t, where, id, database, nodeagenttest.Token)
	// Held only once the fleet called the instance dead: it was refused meanwhile.
	nodeagenttest.AwaitDeathThenHold(t, heir)
}

// TestNodeAgentOverTCPTakesOnlyAuthenticatedAttaches: over TCP the first line must be an
// attach with the node agent's token and a process secret. Anything else is told why,
// closed and counted, costs the database nothing, and no token is ever logged or sent
// back; garbage is a protocol error, as on the socket.
func TestNodeAgentOverTCPTakesOnlyAuthenticatedAttaches(t *testing.T) {
	t.Parallel()
	db, _ := testdb.MigratedPool(t, 2)
	node := nodeagenttest.StartTCP(t, db, "127.0.0.1:0", filepath.Join(t.TempDir(), "claims"), nil)
	database := nodeagenttest.CurrentDatabase(t, db)
	const wrongToken = "not-the-node-agents-token-0123456789"

	// answer sends line on a new connection and returns the one reply, and, if
	// waitClose, whether the node agent closed the connection after it.
	answer := func(line string, waitClose bool) (reply string, closed bool) {
		t.Helper()
		c, err := net.Dial("tcp", node.Addr)
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
		{"no secret", attach(map[string]any{"token": nodeagenttest.Token}), "no process secret"},
		{"a proof first", `{"op":"prove","seq":1}`, "must be an attach"},
	} {
		reply, closed := answer(c.line, true)
		if !strings.Contains(reply, `"op":"error"`) || !strings.Contains(reply, c.want) || !closed {
			t.Errorf("%s: reply %q, closed %v; want an error saying %q, and the connection closed", c.name, reply, closed, c.want)
		}
		if strings.Contains(reply, nodeagenttest.Token) || strings.Contains(reply, wrongToken) {
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
	if strings.Contains(node.Logs.String(), wrongToken) {
		t.Errorf("the node agent logged a token it was sent:\n%s", node.Logs)
	}

	// With the token and a secret: attached, its lock held.
	reply, _ = answer(attach(map[string]any{"secret": "a-secret-of-the-process-0123", "token": nodeagenttest.Token}), false)
	if !strings.Contains(reply, `"op":"state"`) || !strings.Contains(reply, `"held":true`) {
		t.Errorf("an authenticated attach: %s; want its lock held", reply)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// The node agent's bad TCP settings are refused before anything listens, each error
// naming its field, and none repeating a token. (A process's are refused by the library:
// TestNodeAgentTCPAgentSettingsRefused.)
func TestNodeAgentTCPSettingsRefused(t *testing.T) {
	const dsn = "host=127.0.0.1 user=u dbname=d"
	claims := filepath.Join(t.TempDir(), "claims")
	for _, c := range []struct {
		name string
		cfg  nodeagent.Config
		want string
	}{
		{"nowhere to listen", nodeagent.Config{DirectDSN: dsn}, "nodeagent.Config.Socket or nodeagent.Config.ListenAddress must be set"},
		{"no port", nodeagent.Config{DirectDSN: dsn, ListenAddress: "127.0.0.1", Token: nodeagenttest.Token, ClaimsFile: claims}, "nodeagent.Config.ListenAddress (\"127.0.0.1\") is not host:port"},
		{"a named port", nodeagent.Config{DirectDSN: dsn, ListenAddress: ":http", Token: nodeagenttest.Token, ClaimsFile: claims}, "nodeagent.Config.ListenAddress (\":http\") names no port number"},
		{"a port too large", nodeagent.Config{DirectDSN: dsn, ListenAddress: ":65536", Token: nodeagenttest.Token, ClaimsFile: claims}, "nodeagent.Config.ListenAddress (\":65536\") names no port number"},
		{"no token", nodeagent.Config{DirectDSN: dsn, ListenAddress: ":9817", ClaimsFile: claims}, "nodeagent.Config.Token must be set with nodeagent.Config.ListenAddress"},
		{"a short token", nodeagent.Config{DirectDSN: dsn, ListenAddress: ":9817", Token: "hunter2", ClaimsFile: claims}, "nodeagent.Config.Token must be at least 16 bytes"},
		{"no claims file", nodeagent.Config{DirectDSN: dsn, ListenAddress: ":9817", Token: nodeagenttest.Token}, "nodeagent.Config.ClaimsFile must be set without nodeagent.Config.Socket"},
	} {
		_, err := nodeagent.New(c.cfg)
		var ce *store.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want a ConfigError saying %q", c.name, err, c.want)
		}
		if err != nil && (strings.Contains(err.Error(), nodeagenttest.Token) || strings.Contains(err.Error(), "hunter2")) {
			t.Errorf("%s: the error repeats the token: %v", c.name, err)
		}
	}
}
