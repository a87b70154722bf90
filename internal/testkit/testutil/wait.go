package testutil

import (
	"net"
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

// FreePort returns a port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// FreeAddr returns a 127.0.0.1 address whose port was free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
