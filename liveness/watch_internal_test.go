package liveness

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/alivelock"
	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// TestWatchAliveTellsAFailingReadOnce: while the set cannot be read, fn is not called and
// WatchAlive says so once at warning level (repeats at debug); once a read succeeds, it
// says so at info level.
func TestWatchAliveTellsAFailingReadOnce(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	logs := &logbuf.Recorder{}
	a, err := NewAgent(AgentConfig{Pool: pool, DirectDSN: db.DSN, InstanceID: uuid.New(), ServiceName: "svc",
		Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	testutil.RunUntilCleanup(t, a.Run)
	ctx := testutil.Context(t, time.Minute)
	wctx, stopWatch := context.WithCancel(ctx)
	calls := make(chan int, 64)
	watchDone := make(chan error, 1)
	go func() {
		watchDone <- a.WatchAlive(wctx, "svc", 0, func(alive []InstanceStatus) { calls <- len(alive) })
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
	logs.ToldOnce(t, "watch: cannot read the instances", slog.LevelWarn, 2, 3*defaults.WatchAlivePoll)
	if n, _ := logs.Count("watch: reading the instances again", slog.LevelInfo); n != 0 {
		t.Fatalf("told %d times that reads succeed again while they still fail:%s", n, logs)
	}
	db.Exec(t, `ALTER TABLE liveness.instances_away RENAME TO instances`)
	if !testutil.Poll(3*defaults.WatchAlivePoll, func() bool {
		_, n := logs.Count("watch: reading the instances again", slog.LevelInfo)
		return n == 1
	}) {
		t.Fatalf("not told once at info that reads succeed again:%s", logs)
	}
}

// TestMembershipIsListenedToOnlyWhileWanted: an agent's session listens to the members
// channel (joined:, left:, dead:) only while something in the process waits for
// membership, here WatchAlive; a join is then told at once (within the defaults.WatchAlivePoll it
// would otherwise wait). PostgreSQL signals every listener of a channel for each
// notification, so an agent that nothing of which waits for membership must not listen.
func TestMembershipIsListenedToOnlyWhileWanted(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	a, err := NewAgent(AgentConfig{Pool: pool, DirectDSN: db.DSN, InstanceID: uuid.New(), ServiceName: "svc",
		DisableWatcher: true})
	if err != nil {
		t.Fatal(err)
	}
	testutil.RunUntilCleanup(t, a.Run)
	testutil.Eventually(t, 20*time.Second, "the agent listening to its events", a.events.Listening)
	if !testutil.Never(t, 500*time.Millisecond, "listening to the members channel with nothing waiting", a.lock.(*alivelock.Direct).Members) {
		t.FailNow()
	}
	ctx := testutil.Context(t, time.Minute)
	wctx, stopWatch := context.WithCancel(ctx)
	sizes := make(chan int, 64)
	watchDone := make(chan error, 1)
	go func() {
		watchDone <- a.WatchAlive(wctx, "svc", 0, func(alive []InstanceStatus) { sizes <- len(alive) })
	}()
	testutil.Eventually(t, 10*time.Second, "listening to the members channel while WatchAlive runs", a.lock.(*alivelock.Direct).Members)
	for n := 0; n != 1; {
		select {
		case n = <-sizes:
		case <-time.After(20 * time.Second):
			t.Fatal("WatchAlive did not report the agent itself")
		}
	}
	// Another instance joins: its row's insertion is notified, and WatchAlive reads again
	// well before its poll.
	other := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO liveness.instances (instance_id, service_name) VALUES ($1, 'svc')`, other); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-sizes:
		if n != 2 {
			t.Fatalf("after the join WatchAlive reported %d alive; want 2", n)
		}
	case <-time.After(defaults.WatchAlivePoll / 2):
		t.Fatalf("the join was not told within %s", defaults.WatchAlivePoll/2)
	}
	stopWatch()
	if err := <-watchDone; err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the members channel let go once WatchAlive ended", func() bool { return !a.lock.(*alivelock.Direct).Members() })
}
