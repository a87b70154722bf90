package liveness

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// tcpOptions reads a TCP connection's keepalive and user timeout.
func tcpOptions(t *testing.T, conn net.Conn) (keepalive bool, idle, interval time.Duration, count int, userTimeout time.Duration) {
	t.Helper()
	raw, err := conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var errs []error
	get := func(fd uintptr, level, opt int) int {
		v, err := unix.GetsockoptInt(int(fd), level, opt)
		errs = append(errs, err)
		return v
	}
	if err := raw.Control(func(fd uintptr) {
		keepalive = get(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE) == 1
		idle = time.Duration(get(fd, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)) * time.Second
		interval = time.Duration(get(fd, unix.IPPROTO_TCP, unix.TCP_KEEPINTVL)) * time.Second
		count = get(fd, unix.IPPROTO_TCP, unix.TCP_KEEPCNT)
		userTimeout = time.Duration(get(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)) * time.Millisecond
	}); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return
}

// A TCP peer that vanished without closing (its node lost) is noticed within
// NodeAgentTCPDeadPeer, on both ends: the node agent's accepted connections and the
// processes' dialed ones carry keepalive (5 s idle, 1 s apart, 5 probes) and a user
// timeout of as much. (The kernel enforces them; this checks that they are set.)
func TestNodeAgentTCPConnectionsNoticeAVanishedPeer(t *testing.T) {
	n, err := NewNodeAgent(NodeAgentConfig{DirectDSN: "host=127.0.0.1 port=1 user=nobody dbname=none", ListenAddress: "127.0.0.1:0",
		Token: strings.Repeat("t", nodeTokenMin), ClaimsFile: filepath.Join(t.TempDir(), "claims")})
	if err != nil {
		t.Fatal(err)
	}
	stop := runUntilCleanup(t, n.Run)
	defer stop()
	testutil.Eventually(t, 10*time.Second, "the node agent listening", func() bool { return n.Snapshot().ListenAddress != "" })

	lock := newNodeLock(nodeLockConfig{Socket: nodeAgentTCPScheme + n.Snapshot().ListenAddress, Token: "x"})
	dialed, err := lock.dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer dialed.Close()
	var accepted net.Conn
	testutil.Eventually(t, 10*time.Second, "the connection accepted", func() bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		for c := range n.clients {
			accepted = c.conn
		}
		return accepted != nil
	})
	for side, conn := range map[string]net.Conn{"the node agent's": accepted, "the process's": dialed} {
		on, idle, interval, count, user := tcpOptions(t, conn)
		if !on || idle != 5*time.Second || interval != time.Second || count != 5 || user != NodeAgentTCPDeadPeer {
			t.Errorf("%s connection: keepalive %v, idle %s, interval %s, %d probes, user timeout %s; want on, 5s, 1s, 5, %s",
				side, on, idle, interval, count, user, NodeAgentTCPDeadPeer)
		}
	}
	if NodeAgentTCPDeadPeer != 10*time.Second {
		t.Errorf("NodeAgentTCPDeadPeer is %s; the documentation says 10 s", NodeAgentTCPDeadPeer)
	}
}

// A TCP connection that sends no attach within nodeTCPAttachTimeout is told why, closed
// and counted: a connection that never authenticates holds nothing for long.
func TestNodeAgentTCPClosesAConnectionThatNeverAttaches(t *testing.T) {
	defer func(d time.Duration) { nodeTCPAttachTimeout = d }(nodeTCPAttachTimeout)
	nodeTCPAttachTimeout = 300 * time.Millisecond
	n, err := NewNodeAgent(NodeAgentConfig{DirectDSN: "host=127.0.0.1 port=1 user=nobody dbname=none", ListenAddress: "127.0.0.1:0",
		Token: strings.Repeat("t", nodeTokenMin), ClaimsFile: filepath.Join(t.TempDir(), "claims")})
	if err != nil {
		t.Fatal(err)
	}
	stop := runUntilCleanup(t, n.Run)
	defer stop()
	testutil.Eventually(t, 10*time.Second, "the node agent listening", func() bool { return n.Snapshot().ListenAddress != "" })
	c, err := net.Dial("tcp", n.Snapshot().ListenAddress)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	began := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	dec := newNodeDecoder(c, defaults.NodeAgentMaxMessageBytes)
	m, err := dec.next()
	if err != nil || m.Op != nodeOpError || !strings.Contains(m.Error, "no attach within") {
		t.Fatalf("a connection silent past the attach timeout got %+v, %v; want an error saying so", m, err)
	}
	if _, err := dec.next(); err == nil {
		t.Error("the connection stays open after the error")
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("closed %s after connecting; want about the timeout, 300 ms", took)
	}
	if u := n.Snapshot().Unauthenticated; u != 1 {
		t.Errorf("%d connections counted unauthenticated; want 1", u)
	}
}
