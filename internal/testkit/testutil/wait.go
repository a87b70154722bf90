package testutil

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Poll calls cond until it holds or within has passed, and reports whether it held. It
// polls every 10 ms at first and backs off to every 100 ms, so short waits stay quick
// and long ones do not load the machine.
func Poll(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	pause := 10 * time.Millisecond
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
		pause = min(2*pause, 100*time.Millisecond)
	}
}

// Eventually fails the test when cond does not hold within the given time; what says
// what was awaited.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(within, cond) {
		t.Fatalf("not within %s: %s", within, what)
	}
}

// Never fails the test when cond holds within the given time: for what must not happen,
// such as a live instance called dead while its database restarts. It polls as Poll does
// for the whole of within and returns true once it has passed; when cond holds, it says
// so with t.Errorf, naming what happened, and returns false at once, so that a test may
// still record what it measured before it stops.
func Never(t testing.TB, within time.Duration, what string, cond func() bool) bool {
	t.Helper()
	start := time.Now()
	if Poll(within, cond) {
		t.Errorf("within %s (after %s): %s", within, time.Since(start).Round(time.Millisecond), what)
		return false
	}
	return true
}

// FreePort returns a port on 127.0.0.1 that was free a moment ago, for a server that a
// test starts next.
//
// It is taken below the kernel's ephemeral range, from which every outgoing connection
// takes its local port: a port from that range (what listening on port 0 gives) can be
// taken by any process's connection in the moment before the server binds it, and the
// server then fails with "address already in use". Ports are handed out in turn from a
// random start, so that one test binary does not hand out the same port twice and
// binaries running side by side rarely meet.
func FreePort() (int, error) {
	if lo, n := quietPorts(); n > 0 {
		for range min(n, 200) {
			port := lo + int(nextPort.Add(1)%uint32(n))
			if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
				_ = l.Close()
				return port, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// FreeAddr returns a 127.0.0.1 address whose port was free a moment ago (FreePort).
func FreeAddr(t testing.TB) string {
	t.Helper()
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// quietPortsFrom is the lowest port FreePort hands out: above the well-known and most
// registered services' ports that a developer's machine may run.
const quietPortsFrom = 20000

// nextPort is FreePort's turn, from a random start.
var nextPort atomic.Uint32

func init() { nextPort.Store(rand.Uint32()) }

// quietPorts is the range below the kernel's ephemeral ports that FreePort hands out:
// its first port and its size, 0 if there is none (the range cannot be read, or starts
// too low).
func quietPorts() (lo, n int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0
	}
	ephemeral, err := strconv.Atoi(f[0])
	if err != nil || ephemeral-quietPortsFrom < 1000 {
		return 0, 0
	}
	return quietPortsFrom, ephemeral - quietPortsFrom
}
