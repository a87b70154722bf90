package liveness

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// TestWatchAliveTellsAFailingReadOnce: while the set cannot be read, fn is not called and
// WatchAlive says so once at warning level (repeats at debug); once a read succeeds, it
// says so at info level.
func TestWatchAliveTellsAFailingReadOnce(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	logs := &logRecorder{}
	a, err := NewAgent(AgentConfig{Pool: pool, DirectDSN: db.DSN, InstanceID: uuid.New(), ServiceName: "svc",
		Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, a.Run)
	ctx := testutil.Context(t, time.Minute)
	wctx, stopWatch := context.WithCancel(ctx)
	calls := make(chan int, 64)
	watchDone := make(chan error, 1)
	go func() {
		watchDone <- a.WatchAlive(wctx, "svc", func(alive []InstanceStatus) { calls <- len(alive) })
	}()
	defer func() {
		stopWatch()
		if err := <-watchDone; err != nil {
			t.Errorf("WatchAlive: %v", err)
		}
	}()
	select {
	case <-calls:
	case <-time.After(20 * time.Second):
		t.Fatal("WatchAlive made no first call within 20s")
	}

	db.Exec(t, `ALTER TABLE liveness.instances RENAME TO instances_away`)
	logs.toldOnce(t, "watch: cannot read the instances", slog.LevelWarn, 2, 3*WatchAlivePoll)
	if n, _ := logs.count("watch: reading the instances again", slog.LevelInfo); n != 0 {
		t.Fatalf("told %d times that reads succeed again while they still fail:%s", n, logs)
	}
	db.Exec(t, `ALTER TABLE liveness.instances_away RENAME TO instances`)
	if !testutil.Poll(3*WatchAlivePoll, func() bool {
		_, n := logs.count("watch: reading the instances again", slog.LevelInfo)
		return n == 1
	}) {
		t.Fatalf("not told once at info that reads succeed again:%s", logs)
	}
}
