package liveness_test

// A member with many shards that stops.

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// shardsAtStop is how many shards the member of TestShardsStopOfAManyShardMember owns. At
// MaxShards (10,000) the test takes twice as long: owning them took 6.4-8.7 s and the
// stop 0.41-0.65 s on the 2-core test machine (1.1-1.6 s before migration 0019 took the
// search path changes out of each lease's release and notification trigger).
const shardsAtStop = 5_000

// A member that stops with many shards releases every lease, its member lease with them,
// in one statement per 5,000 leases (the server spends a fraction of a millisecond on
// each) when their callbacks return together, and says so in one line: no line per
// shard, no lease left to expire. It took one statement per shard, and as many lines as
// the wind-down ran out on, each leaving a lease to expire.
func TestShardsStopOfAManyShardMember(t *testing.T) {
	t.Parallel()
	db, _ := testdb.MigratedPool(t, 2)
	pool, counter := countingPool(t, db.DSN, 8)
	logger, logs := logbuf.Logger()
	agent := newAgent(t, liveness.AgentConfig{Pool: pool, DirectDSN: db.DSN, InstanceID: uuid.New(), ServiceName: "many",
		Logger: logger})
	runAgent(t, agent)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	var running atomic.Int64
	began := time.Now()
	go func() {
		done <- agent.Shards(ctx, liveness.ShardsConfig{Set: "many", Count: shardsAtStop, TTL: time.Minute,
			OnStartedOwning: func(ctx context.Context, _ liveness.Shard) {
				running.Add(1)
				<-ctx.Done()
				running.Add(-1)
			}})
	}()
	testutil.Eventually(t, 5*time.Minute, "the member owning every shard", func() bool { return running.Load() == shardsAtStop })
	owned := time.Since(began)
	releases := counter.count("lease_release")
	stopped := time.Now()
	stop()
	err := <-done
	took := time.Since(stopped)
	left := db.QueryInt(t, `SELECT count(*) FROM liveness.leases WHERE name LIKE 'many/%'`)
	statements := counter.count("lease_release") - releases
	t.Logf("%d shards owned %s after the start; the stop took %s, %d release statements, %d leases left",
		shardsAtStop, owned.Round(time.Millisecond), took.Round(time.Millisecond), statements, left)
	// One statement per 5,000 leases when the callbacks return together; a loaded machine
	// wakes them over longer than the gathering's windows (20 ms quiet, 250 ms in all), and
	// each group is a statement of its own: a few, never one a shard (as before).
	if least := (shardsAtStop + 1 + 4_999) / 5_000; err != nil || left != 0 || statements < least || statements > least+8 ||
		running.Load() != 0 {
		t.Errorf("Shards: %v; %d leases left, %d release statements, %d callbacks running; want none left, in %d "+
			"statements (a few more under load), every callback returned", err, left, statements, running.Load(), least)
	}
	var told []string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "shards:") && !strings.Contains(line, "level=DEBUG") {
			told = append(told, line)
		}
	}
	if len(told) != 1 || !strings.Contains(told[0], "left the set") || !strings.Contains(told[0], "released=5000") {
		t.Errorf("the shard set's lines: %q; want one saying it left, every shard released", told)
	}
}
