package liveness

// The helpers of the tests in package liveness (those that reach the alive lock's session
// and drive the heartbeat with a fake clock).

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// runUntilCleanup runs run in a goroutine until the returned stop (or the test's end)
// cancels it, and checks that it returns nil promptly.
func runUntilCleanup(t *testing.T, run func(context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run returned %v, want nil", err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("Run did not return within 10s of its context ending")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// logRecorder is a slog handler that keeps every record, debug included.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *logRecorder) WithGroup(string) slog.Handler            { return r }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}

// count returns how many records contain substr in their message, at any level and at
// level or above.
func (r *logRecorder) count(substr string, level slog.Level) (any, atOrAbove int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.recs {
		if strings.Contains(rec.Message, substr) {
			any++
			if rec.Level >= level {
				atOrAbove++
			}
		}
	}
	return any, atOrAbove
}

// toldOnce waits, within the given time, until msg has been logged repeats times or
// more, and fails the test unless exactly one of those lines is at level or above: a
// condition that lasts is told once, loudly, then at debug level (logging.Repeats).
func (r *logRecorder) toldOnce(t *testing.T, msg string, level slog.Level, repeats int, within time.Duration) {
	t.Helper()
	if !testutil.Poll(within, func() bool { n, _ := r.count(msg, slog.LevelDebug); return n >= repeats }) {
		n, _ := r.count(msg, slog.LevelDebug)
		t.Fatalf("%q logged %d times within %s, want %d or more:%s", msg, n, within, repeats, r)
	}
	if _, loud := r.count(msg, level); loud != 1 {
		t.Fatalf("%d lines %q at %s or above, want exactly 1 (once per condition):%s", loud, msg, level, r)
	}
}

func (r *logRecorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, rec := range r.recs {
		fmt.Fprintf(&b, "\n  %s %s", rec.Level, rec.Message)
		rec.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s", a); return true })
	}
	return b.String()
}

// testHeartbeatConfig has the agent's default timing.
func testHeartbeatConfig(pool *pgxpool.Pool, lock lockSource) heartbeatConfig {
	return heartbeatConfig{
		Pool:        pool,
		InstanceID:  uuid.New(),
		ServiceName: "svc",
		Timing:      Timing{}, // the defaults
		Lock:        lock,
	}
}

func startHeartbeat(t *testing.T, cfg heartbeatConfig) (*heartbeatWorker, func()) {
	t.Helper()
	h, err := newHeartbeatWorker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h, runUntilCleanup(t, h.Run)
}

func startAliveLock(t *testing.T, cfg aliveLockConfig) *aliveLock {
	t.Helper()
	lock, _ := startAliveLockStoppable(t, cfg)
	return lock
}

func startAliveLockStoppable(t *testing.T, cfg aliveLockConfig) (*aliveLock, func()) {
	t.Helper()
	lock, err := newAliveLock(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return lock, runUntilCleanup(t, lock.Run)
}

// lockHolderPID returns the pid of the backend that holds the instance's alive lock, or 0.
func lockHolderPID(t *testing.T, ctx context.Context, pool *pgxpool.Pool, id uuid.UUID) int {
	t.Helper()
	var pid int
	err := pool.QueryRow(ctx, `SELECT coalesce(max(l.pid), 0) FROM liveness.bigint_advisory_locks l
	                            WHERE l.granted
	                              AND l.classid = liveness.lock_key_classid(liveness.instance_lock_key($1))
	                              AND l.objid = liveness.lock_key_objid(liveness.instance_lock_key($1))`, id).Scan(&pid)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}
