package nodeagent_test

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/nodeagent"
	"github.com/pg-liveness/pg_liveness_exporter/internal/nodeagent/proto"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/nodeagenttest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// A TCP peer that vanished without closing (its node lost) is noticed within
// proto.TCPDeadPeer: the node agent's accepted connections carry keepalive (5 s idle, 1 s
// apart, 5 probes) and a user timeout of as much. (The kernel enforces them; this checks
// that they are set. The processes' dialed connections: the library's
// TestNodeAgentTCPDialNoticesAVanishedPeer.)
func TestNodeAgentTCPConnectionsNoticeAVanishedPeer(t *testing.T) {
	n := listenWithoutDatabase(t)

	dialed, err := net.Dial("tcp", n.Snapshot().ListenAddress)
	if err != nil {
		t.Fatal(err)
	}
	defer dialed.Close()
	var accepted net.Conn
	testutil.Eventually(t, 10*time.Second, "the connection accepted", func() bool {
		for _, c := range n.AcceptedConns() {
			accepted = c
		}
		return accepted != nil
	})
	on, idle, interval, count, user := testutil.TCPOptions(t, accepted)
	if !on || idle != 5*time.Second || interval != time.Second || count != 5 || user != proto.TCPDeadPeer {
		t.Errorf("the node agent's connection: keepalive %v, idle %s, interval %s, %d probes, user timeout %s; want on, 5s, 1s, 5, %s",
			on, idle, interval, count, user, proto.TCPDeadPeer)
	}
	if proto.TCPDeadPeer != 10*time.Second {
		t.Errorf("proto.TCPDeadPeer is %s; the documentation says 10 s", proto.TCPDeadPeer)
	}
}

// A TCP connection that sends no attach within the attach timeout is told why, closed
// and counted: a connection that never authenticates holds nothing for long.
func TestNodeAgentTCPClosesAConnectionThatNeverAttaches(t *testing.T) {
	defer nodeagent.SetTCPAttachTimeout(300 * time.Millisecond)()
	n := listenWithoutDatabase(t)
	c, err := net.Dial("tcp", n.Snapshot().ListenAddress)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	began := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	dec := proto.NewDecoder(c, defaults.NodeAgentMaxMessageBytes)
	m, err := dec.Next()
	if err != nil || m.Op != proto.OpError || !strings.Contains(m.Error, "no attach within") {
		t.Fatalf("a connection silent past the attach timeout got %+v, %v; want an error saying so", m, err)
	}
	if _, err := dec.Next(); err == nil {
		t.Error("the connection stays open after the error")
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("closed %s after connecting; want about the timeout, 300 ms", took)
	}
	if u := n.Snapshot().Unauthenticated; u != 1 {
		t.Errorf("%d connections counted unauthenticated; want 1", u)
	}
}

// listenWithoutDatabase runs a node agent on TCP whose database cannot be reached, until
// the test's end, and returns once it listens: its connections' handling needs no
// session.
func listenWithoutDatabase(t *testing.T) *nodeagent.Server {
	t.Helper()
	n, err := nodeagent.New(nodeagent.Config{DirectDSN: "host=127.0.0.1 port=1 user=nobody dbname=none", ListenAddress: "127.0.0.1:0",
		Token: strings.Repeat("t", proto.TokenMin), ClaimsFile: filepath.Join(t.TempDir(), "claims")})
	if err != nil {
		t.Fatal(err)
	}
	nodeagenttest.RunUntilCleanup(t, n)
	testutil.Eventually(t, 10*time.Second, "the node agent listening", func() bool { return n.Snapshot().ListenAddress != "" })
	return n
}
