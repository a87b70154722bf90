package liveness_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// ownership records who owns each shard, from the callbacks themselves: a callback that
// starts while another's for the same shard still runs is two owners at once.
type ownership struct {
	mu       sync.Mutex
	owner    map[string]uuid.UUID
	overlaps []string
	starts   int
}

func (o *ownership) start(shard string, by uuid.UUID) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if cur, ok := o.owner[shard]; ok {
		o.overlaps = append(o.overlaps, fmt.Sprintf("shard %s started by %s while %s owned it", shard, by, cur))
	}
	o.owner[shard] = by
	o.starts++
}

func (o *ownership) stop(shard string, by uuid.UUID) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.owner[shard] == by {
		delete(o.owner, shard)
	}
}

// byOwner counts the shards each instance owns, and how many are owned.
func (o *ownership) byOwner() (map[uuid.UUID]int, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[uuid.UUID]int{}
	for _, id := range o.owner {
		out[id]++
	}
	return out, len(o.owner)
}

type shardMember struct {
	agent *liveness.Agent
	stop  context.CancelFunc
	done  chan error
}

// startShardMember runs an agent and its Shards for set until stop.
func startShardMember(t *testing.T, db *pgtest.DB, pool *pgxpool.Pool, set string, count int, own *ownership) *shardMember {
	t.Helper()
	a := newAgent(t, liveness.AgentConfig{Pool: pool, DirectDSN: db.DSN, InstanceID: uuid.New(), ServiceName: "sharded"})
	runAgent(t, a)
	id := a.Snapshot().InstanceID
	ctx, cancel := context.WithCancel(context.Background())
	m := &shardMember{agent: a, stop: cancel, done: make(chan error, 1)}
	go func() {
		m.done <- a.Shards(ctx, liveness.ShardsConfig{Set: set, Count: count,
			OnStartedOwning: func(ctx context.Context, s liveness.Shard) {
				own.start(s.Name, id)
				defer own.stop(s.Name, id)
				if _, err := s.Exec(ctx, pool, `SELECT 1`); err != nil && ctx.Err() == nil {
					t.Errorf("a fenced statement of shard %s's owner: %v", s.Name, err)
				}
				<-ctx.Done()
			}})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-m.done; err != nil {
			t.Errorf("Shards: %v", err)
		}
	})
	return m
}

// Every shard is owned by one live member at a time: three members share 64 shards,
// a fourth joins and takes about a quarter, one stops and its shards go to the others;
// a callback never starts while another's for the same shard still runs (the old owner's
// callback returns before its lease is released). Each member renews all its leases in
// one statement, whatever the number of shards it owns.
func TestShardsOneOwnerAtATime(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 16)
	own := &ownership{owner: map[string]uuid.UUID{}}
	const shards = 64 // enough that no member is left without one (with 12, one in eight runs left one empty)
	var members []*shardMember
	for range 3 {
		members = append(members, startShardMember(t, db, pool, "orders", shards, own))
	}
	// spread waits until the shards are owned by n members, every running member has
	// read n members, and nothing has moved for a second: the set has settled.
	spread := func(n int, what string, running ...*shardMember) map[uuid.UUID]int {
		var by map[uuid.UUID]int
		var last string
		var since time.Time
		testutil.Eventually(t, time.Minute, what, func() bool {
			var owned int
			by, owned = own.byOwner()
			if owned != shards || len(by) != n {
				return false
			}
			for _, m := range running {
				if st := m.agent.Snapshot().Shards; len(st) != 1 || st[0].Members != n {
					return false
				}
			}
			if now := fmt.Sprint(by); now != last {
				last, since = now, time.Now()
			}
			return time.Since(since) >= time.Second
		})
		return by
	}
	before := spread(3, "the shards owned, by all three members, settled", members...)
	for _, m := range members {
		st := m.agent.Snapshot().Shards
		if len(st) != 1 || st[0].Set != "orders" || st[0].Members != 3 || st[0].Owned != before[m.agent.Snapshot().InstanceID] {
			t.Errorf("snapshot of a member: %+v; want 3 members and its owned count %d", st, before[m.agent.Snapshot().InstanceID])
		}
	}

	joined := startShardMember(t, db, pool, "orders", shards, own)
	after := spread(4, "the shards spread over four members, settled", append(members, joined)...)
	moved := 0
	for id, n := range before {
		if after[id] < n {
			moved += n - after[id]
		}
	}
	// Rendezvous hashing: only the shards the joiner now wins move, all to it (about a
	// quarter: how many is chance, with random instance ids).
	if got := after[joined.agent.Snapshot().InstanceID]; got != moved || moved == 0 || moved == shards {
		t.Errorf("the joiner owns %d shards, %d moved from the others; want those it owns, and only those", got, moved)
	}

	members[0].stop()
	if err := <-members[0].done; err != nil {
		t.Fatal(err)
	}
	members[0].done <- nil // for the cleanup
	spread(3, "the stopped member's shards owned by the three others, settled", members[1], members[2], joined)

	own.mu.Lock()
	defer own.mu.Unlock()
	if len(own.overlaps) > 0 {
		t.Fatalf("two owners at once: %v", own.overlaps)
	}
	t.Logf("%d ownerships started", own.starts)
}

// A member renews all its leases in one statement, however many shards it owns: 64 shards
// cost one lease_renew_many every TTL/4, and no renewal of its own per shard.
func TestShardsRenewAllLeasesInOneStatement(t *testing.T) {
	t.Parallel()
	db, _ := testdb.MigratedPool(t, 2)
	pool, counter := countingPool(t, db.DSN, 4)
	own := &ownership{owner: map[string]uuid.UUID{}}
	m := startShardMember(t, db, pool, "many", 64, own)
	testutil.Eventually(t, 30*time.Second, "the member owning all 64 shards", func() bool {
		_, owned := own.byOwner()
		return owned == 64
	})
	renewals, perShard := counter.count("lease_renew_many"), 0
	time.Sleep(defaults.ElectorTTL / 2) // two renewal periods
	renewals = counter.count("lease_renew_many") - renewals
	for i := range 64 {
		perShard += counter.count(fmt.Sprintf("lease_renew:many/%d", i))
	}
	t.Logf("in %s: %d lease_renew_many, %d single renewals of shards", defaults.ElectorTTL/2, renewals, perShard)
	if renewals < 1 || renewals > 3 || perShard != 0 {
		t.Errorf("in %s a member of 64 shards sent %d lease_renew_many and %d single renewals; want 2 (one a TTL/4) and none",
			defaults.ElectorTTL/2, renewals, perShard)
	}
	if st := m.agent.Snapshot(); len(st.Shards) != 1 || st.Shards[0].Owned != 64 {
		t.Errorf("snapshot: %+v", st.Shards)
	}
	for _, l := range m.agent.Snapshot().Leases {
		if len(l.Name) > 5 && l.Name[:5] == "many/" && l.Name != "many/*" {
			t.Errorf("a lease of the set counted under its own name in the snapshot: %s (want many/*)", l.Name)
		}
	}
}

// WatchAlive's maxHeartbeatAge leaves out an instance that hangs: its lock is held (the verdict
// calls it alive, lock_only) but its heartbeat stopped. Without the bound it is in the
// set.
func TestWatchAliveDropsInstancesThatStoppedBeating(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	ctx := testutil.Context(t, time.Minute)
	a := newAgent(t, defaultAgentConfig(db, pool, "watching"))
	runAgent(t, a)
	hung := startCrashable(t, ctx, db, "hung")
	db.Exec(t, `UPDATE liveness.instances SET last_heartbeat_at = now() - interval '2 minutes' WHERE instance_id = $1`, hung.id)
	seen := func(maxHeartbeatAge time.Duration) []uuid.UUID {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		got := make(chan []uuid.UUID, 1)
		go func() {
			_ = a.WatchAlive(wctx, "hung", maxHeartbeatAge, func(alive []liveness.InstanceStatus) {
				var ids []uuid.UUID
				for _, s := range alive {
					ids = append(ids, s.InstanceID)
				}
				select {
				case got <- ids:
				default:
				}
			})
		}()
		select {
		case ids := <-got:
			return ids
		case <-time.After(10 * time.Second):
			t.Fatal("WatchAlive did not call back within 10 s")
			return nil
		}
	}
	if ids := seen(0); len(ids) != 1 || ids[0] != hung.id {
		t.Fatalf("the alive set without a bound: %v; want the hung instance (alive by its lock)", ids)
	}
	if ids := seen(90 * time.Second); len(ids) != 0 {
		t.Fatalf("the alive set with maxHeartbeatAge 90s: %v; want none (its heartbeat is 2 min old)", ids)
	}
}

// WatchAlive's maxHeartbeatAge must be above the slow heartbeat interval, at which a healthy
// instance that holds its lock beats: below it, such an instance left the set for most of
// every interval (at 15 s, two healthy instances saw an empty set 45 s of every minute).
// WatchAlive refuses such a bound with a *ConfigError naming the parameter.
func TestWatchAliveMaxHeartbeatAgeMustBeAboveTheSlowInterval(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 2)
	ctx := testutil.Context(t, 30*time.Second)
	a := newAgent(t, defaultAgentConfig(db, pool, "watching"))
	for _, d := range []time.Duration{15 * time.Second, defaults.HeartbeatSlowInterval, -time.Second} {
		err := a.WatchAlive(ctx, "", d, func([]liveness.InstanceStatus) {})
		var ce *liveness.ConfigError
		if !errors.As(err, &ce) || ce.Field != "WatchAlive maxHeartbeatAge" {
			t.Errorf("WatchAlive with maxHeartbeatAge %s: %v; want a *ConfigError naming WatchAlive maxHeartbeatAge", d, err)
		}
		if d > 0 && (err == nil || !strings.Contains(err.Error(), "HeartbeatSlowInterval, 1m0s")) {
			t.Errorf("WatchAlive with maxHeartbeatAge %s: %v; want it to name the slow interval", d, err)
		}
	}
}

// TestShardsAndFencedWritesRefuseBadInput: names that would meet another set's leases
// (a / in the set's name made "jobs/member" count as members of "jobs"), or that
// PostgreSQL cannot store as given (NUL, invalid UTF-8), counts past MaxShards, and a
// fenced Exec of nothing are each a clear error naming what is wrong: no panic, no silent
// no-op, no set that owns nothing.
func TestShardsAndFencedWritesRefuseBadInput(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 2)
	agent := newAgent(t, liveness.AgentConfig{Pool: pool, DirectDSN: db.DSN, InstanceID: uuid.New(), ServiceName: "svc"})
	ctx := testutil.Context(t, 30*time.Second)
	owning := func(context.Context, liveness.Shard) {}
	for _, tc := range []struct {
		cfg  liveness.ShardsConfig
		want string
	}{
		{liveness.ShardsConfig{Set: "jobs/member", Count: 4, OnStartedOwning: owning}, "ShardsConfig.Set (\"jobs/member\") holds a /"},
		{liveness.ShardsConfig{Set: "jobs\x00", Count: 4, OnStartedOwning: owning}, "holds a NUL byte"},
		{liveness.ShardsConfig{Set: "jobs\xff", Count: 4, OnStartedOwning: owning}, "is not valid UTF-8"},
		{liveness.ShardsConfig{Set: "", Count: 4, OnStartedOwning: owning}, "ShardsConfig.Set (\"\") must not be empty"},
		{liveness.ShardsConfig{Set: "jobs", Names: []string{"a", "b\x00"}, OnStartedOwning: owning}, "ShardsConfig.Names \"b\\x00\" holds a NUL byte"},
		{liveness.ShardsConfig{Set: "jobs", Names: []string{"\xc3"}, OnStartedOwning: owning}, "is not valid UTF-8"},
		{liveness.ShardsConfig{Set: "jobs", Count: liveness.MaxShards + 1, OnStartedOwning: owning}, "must be at most MaxShards"},
	} {
		err := agent.Shards(ctx, tc.cfg)
		var ce *liveness.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Shards(%+q): %v; want a *ConfigError saying %q", tc.cfg.Set, err, tc.want)
		}
	}

	le := mustAcquire(t, ctx, newTestLeases(t, pool), "job", 10*time.Second)
	for _, sql := range []string{"", "   \n", "-- nothing\n", "/* nothing /* nested */ */ "} {
		tag, err := le.Exec(ctx, pool, sql)
		if err == nil || !strings.Contains(err.Error(), "the statement is empty") {
			t.Errorf("Exec(%q) = %v, %v; want an error saying the statement is empty", sql, tag, err)
		}
	}
	if _, err := le.Exec(ctx, pool, "/* a comment first */ SELECT 1"); err != nil {
		t.Errorf("Exec of a statement after a comment: %v", err)
	}
}
