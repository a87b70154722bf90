package testutil

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestExposedMetrics(t *testing.T) {
	names := ExposedMetrics(t)
	for _, want := range []string{"pg_liveness_up", "pg_liveness_instances", "pg_liveness_exporter_config_last_reload_successful", "pg_liveness_exporter_probe_connections_max"} {
		if !names[want] {
			t.Errorf("%s is neither in %s nor in docs/metrics.md's metrics table", want, ScenarioExposition)
		}
	}
}

func TestPoll(t *testing.T) {
	n := 0
	if !Poll(time.Minute, func() bool { n++; return n == 3 }) || n != 3 {
		t.Errorf("Poll returned before the condition held, or went on after (n=%d)", n)
	}
	if Poll(50*time.Millisecond, func() bool { return false }) {
		t.Error("Poll reported a condition that never held")
	}
}

// errorRecorder is a testing.TB whose Errorf is recorded instead of failing the test,
// so that a helper's failure can be asserted on.
type errorRecorder struct {
	testing.TB
	errors []string
}

func (r *errorRecorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func TestNever(t *testing.T) {
	t.Run("a condition that never holds passes after the whole window", func(t *testing.T) {
		r := &errorRecorder{TB: t}
		polls, start := 0, time.Now()
		if !Never(r, 200*time.Millisecond, "it happened", func() bool { polls++; return false }) {
			t.Error("Never returned false for a condition that never held")
		}
		if took := time.Since(start); took < 200*time.Millisecond {
			t.Errorf("Never returned after %s, before its window of 200ms ended", took)
		}
		if polls < 3 || len(r.errors) != 0 {
			t.Errorf("%d polls, errors %q; want several polls and no error", polls, r.errors)
		}
	})
	t.Run("a condition that comes to hold fails at once, naming what happened", func(t *testing.T) {
		r := &errorRecorder{TB: t}
		polls, start := 0, time.Now()
		if Never(r, time.Minute, "the lock was lost", func() bool { polls++; return polls == 3 }) {
			t.Error("Never returned true for a condition that held")
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("Never returned after %s; want at once when the condition holds", took)
		}
		if len(r.errors) != 1 || !strings.Contains(r.errors[0], "the lock was lost") || polls != 3 {
			t.Errorf("errors %q after %d polls; want one naming what happened, at the third poll", r.errors, polls)
		}
	})
}

func TestContext(t *testing.T) {
	var ctx context.Context
	t.Run("within the test", func(t *testing.T) {
		start := time.Now()
		ctx = Context(t, time.Minute)
		deadline, ok := ctx.Deadline()
		if !ok || deadline.Before(start.Add(time.Minute)) || deadline.After(time.Now().Add(time.Minute)) {
			t.Errorf("deadline %v (set %v); want a minute from the call", deadline, ok)
		}
		if ctx.Err() != nil {
			t.Errorf("ended while the test runs: %v", ctx.Err())
		}
	})
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Errorf("after the test ended: %v; want context.Canceled", ctx.Err())
	}
	short := Context(t, time.Millisecond)
	select {
	case <-short.Done():
	case <-time.After(time.Minute):
		t.Fatal("a context of 1ms had not ended after a minute")
	}
	if !errors.Is(short.Err(), context.DeadlineExceeded) {
		t.Errorf("after its deadline: %v; want context.DeadlineExceeded", short.Err())
	}
}

// TestFreePortIsNoConnectionsPort checks that FreePort hands out ports that no outgoing
// connection can take (below the kernel's ephemeral range), free to bind, and never the
// same one twice in a row of calls.
func TestFreePortIsNoConnectionsPort(t *testing.T) {
	lo, n := quietPorts()
	if n == 0 {
		t.Fatal("no range below the ephemeral ports: /proc/sys/net/ipv4/ip_local_port_range unreadable or starting below 21000")
	}
	seen := map[int]bool{}
	for range 50 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if port < lo || port >= lo+n {
			t.Fatalf("FreePort gave %d; want a port from %d to %d, below the ephemeral range", port, lo, lo+n-1)
		}
		if seen[port] {
			t.Fatalf("FreePort gave %d twice", port)
		}
		seen[port] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("FreePort gave %d, which cannot be bound: %v", port, err)
		}
		_ = l.Close()
	}
}
