package database

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"
)

// fullListener listens on loopback with the smallest accept queue and never accepts, and
// fills that queue: the kernel then drops every further SYN, as a cut network would, and
// the client's kernel sends it again 1 s, then 3 s, later. It returns the port.
func fullListener(t *testing.T) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	port := sa.(*syscall.SockaddrInet4).Port
	// Fill the accept queue: a dial that does not complete within a moment found it full.
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 200*time.Millisecond)
		if err != nil {
			break
		}
		t.Cleanup(func() { _ = c.Close() })
		if i > 16 {
			t.Fatal("the listener's accept queue never filled")
		}
	}
	return port
}

// A new connection's TCP handshake gives up after TCPHandshakeTimeout, not after the
// connection's whole ConnectTimeout: a dial whose SYN was lost is dialled afresh by the
// next caller instead of waiting for the kernel's retransmission, which after a network
// heals keeps an agent's heartbeat from proving life in time.
func TestPoolHandshakeGivesUpWithinItsBound(t *testing.T) {
	port := fullListener(t)
	pool, err := NewPool(PoolConfig{DSN: fmt.Sprintf("host=127.0.0.1 port=%d user=u dbname=d sslmode=disable", port),
		MaxConns: 1, ConnectTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	began := time.Now()
	err = pool.Ping(ctx)
	took := time.Since(began)
	if err == nil {
		t.Fatal("a ping through a listener that drops every SYN succeeded")
	}
	// Generous for a loaded machine, and far below the 10 s ConnectTimeout (and the 3 s of
	// the kernel's second retransmission) that the dial would wait without the bound.
	if took > 2500*time.Millisecond {
		t.Errorf("the failed handshake took %v; want about %v: %v", took, TCPHandshakeTimeout, err)
	}
}
