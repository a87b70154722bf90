package alivelock

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/nodeagent/proto"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// A TCP peer that vanished without closing (its node lost) is noticed within
// proto.TCPDeadPeer: a process's connections dialed to a node agent carry keepalive
// (5 s idle, 1 s apart, 5 probes) and a user timeout of as much. (The kernel enforces
// them; this checks that they are set. The node agent's accepted connections: the
// server's TestNodeAgentTCPConnectionsNoticeAVanishedPeer.)
func TestNodeAgentTCPDialNoticesAVanishedPeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // stands in for the node agent: only the dialed end is read
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	lock := NewNode(NodeConfig{Socket: NodeAgentTCPScheme + ln.Addr().String(), Token: "x"})
	dialed, err := lock.dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer dialed.Close()
	on, idle, interval, count, user := testutil.TCPOptions(t, dialed)
	if !on || idle != 5*time.Second || interval != time.Second || count != 5 || user != proto.TCPDeadPeer {
		t.Errorf("the process's connection: keepalive %v, idle %s, interval %s, %d probes, user timeout %s; want on, 5s, 1s, 5, %s",
			on, idle, interval, count, user, proto.TCPDeadPeer)
	}
}
