package liveness_test

// The timing of Agent.Shards: how soon a joining instance owns its share, how long a
// shard stays unowned when it moves between live members, and how soon a crashed owner's
// shards move.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/netfault"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// shardTimeline records, from the callbacks themselves, when each shard's owner started
// and returned: a shard is unowned from one callback's return to the next one's start
// (a gap), and owned twice when a callback starts while another's still runs.
type shardTimeline struct {
	mu       sync.Mutex
	owner    map[string]uuid.UUID
	since    map[string]time.Time // when the current owner's callback started
	freed    map[string]time.Time // when the last owner's callback returned, while unowned
	gaps     []shardGap
	overlaps []string
	changed  time.Time // the last start or return
}

// shardGap is a shard unowned for d, until a callback started at at.
type shardGap struct {
	shard string
	at    time.Time
	d     time.Duration
}

func newShardTimeline() *shardTimeline {
	return &shardTimeline{owner: map[string]uuid.UUID{}, since: map[string]time.Time{}, freed: map[string]time.Time{}}
}

func (l *shardTimeline) start(shard string, by uuid.UUID) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if cur, ok := l.owner[shard]; ok {
		l.overlaps = append(l.overlaps, fmt.Sprintf("shard %s started by %s while %s owned it", shard, by, cur))
	}
	if f, ok := l.freed[shard]; ok {
		l.gaps = append(l.gaps, shardGap{shard: shard, at: now, d: now.Sub(f)})
		delete(l.freed, shard)
	}
	l.owner[shard], l.since[shard], l.changed = by, now, now
}

func (l *shardTimeline) stop(shard string, by uuid.UUID) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.owner[shard] == by {
		delete(l.owner, shard)
		l.freed[shard], l.changed = now, now
	}
}

// owned is how many shards are owned, by how many members each, and when the last
// start or return was.
func (l *shardTimeline) owned() (total int, by map[uuid.UUID]int, changed time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	by = map[uuid.UUID]int{}
	for _, id := range l.owner {
		by[id]++
	}
	return len(l.owner), by, l.changed
}

// lastStartOf is when the latest of the callbacks id runs now started: the moment it came
// to own all it owns.
func (l *shardTimeline) lastStartOf(id uuid.UUID) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	var last time.Time
	for shard, o := range l.owner {
		if o == id && l.since[shard].After(last) {
			last = l.since[shard]
		}
	}
	return last
}

// gapsSince are the gaps that ended at or after from, longest first.
func (l *shardTimeline) gapsSince(from time.Time) []shardGap {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []shardGap
	for _, g := range l.gaps {
		if !g.at.Before(from) {
			out = append(out, g)
		}
	}
	slices.SortFunc(out, func(a, b shardGap) int { return int(b.d - a.d) })
	return out
}

func (l *shardTimeline) checkNoOverlap(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.overlaps) > 0 {
		t.Errorf("two owners at once: %v", l.overlaps)
	}
}

// timedMember is an Agent taking part in a shard set, its callbacks recorded.
type timedMember struct {
	agent *liveness.Agent
	id    uuid.UUID
	logs  *logbuf.Buffer     // its agent's log, at debug, for a diagnosis
	stop  context.CancelFunc // ends Shards and Run
	done  chan struct{}      // closed once both have returned
	// crashed: the database no longer hears from it, so its Run's last steps fail.
	crashed atomic.Bool
}

// startTimedMember starts an agent with cfg (its defaults but for what cfg sets) and
// its Shards for set at once, as a process does at its start.
func startTimedMember(t *testing.T, cfg liveness.AgentConfig, set string, count int, tl *shardTimeline) *timedMember {
	t.Helper()
	if cfg.InstanceID == uuid.Nil {
		cfg.InstanceID = uuid.New()
	}
	cfg.ServiceName = "sharded"
	var logs *logbuf.Buffer
	if cfg.Logger == nil {
		cfg.Logger, logs = logbuf.Logger()
	}
	a := newAgent(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	m := &timedMember{agent: a, id: cfg.InstanceID, logs: logs, stop: cancel, done: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := a.Run(ctx); err != nil && !m.crashed.Load() {
			t.Errorf("Run: %v", err)
		}
	})
	wg.Go(func() {
		err := a.Shards(ctx, liveness.ShardsConfig{Set: set, Count: count,
			OnStartedOwning: func(ctx context.Context, s liveness.Shard) {
				tl.start(s.Name, cfg.InstanceID)
				<-ctx.Done()
				tl.stop(s.Name, cfg.InstanceID)
			}})
		if err != nil {
			t.Errorf("Shards: %v", err)
		}
	})
	go func() { wg.Wait(); close(m.done) }()
	t.Cleanup(func() { cancel(); <-m.done })
	return m
}

// settle waits until the set's count shards are owned by exactly members, and nothing
// has started or returned for quiet.
func settle(t *testing.T, tl *shardTimeline, count int, members []*timedMember, within time.Duration) {
	t.Helper()
	testutil.Eventually(t, within, fmt.Sprintf("the %d shards owned by the %d members, settled", count, len(members)), func() bool {
		total, by, changed := tl.owned()
		if total != count || len(by) != len(members) {
			return false
		}
		for _, m := range members {
			if by[m.id] == 0 {
				return false
			}
		}
		return time.Since(changed) >= 500*time.Millisecond
	})
}

func durations(ds []time.Duration) string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond).String()
	}
	return fmt.Sprint(out)
}

// A joining instance owns its share of the set soon after its process starts: each trial
// is a new Agent (and a new pool) started at the trial's t0 with Shards called at once,
// at the default settings, joining three members of 64 shards; the time is from t0 to
// the start of the last of the callbacks it owns once the set has settled. The target
// is 1.5 s; this test holds every trial to it.
func TestShardsJoinOwnsItsShareSoonAfterProcessStart(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 16)
	ctx := testutil.Context(t, 3*time.Minute)
	tl := newShardTimeline()
	const shards = 64
	var members []*timedMember
	for range 3 {
		members = append(members, startTimedMember(t, liveness.AgentConfig{Pool: pool, DirectDSN: db.DSN}, "join", shards, tl))
	}
	settle(t, tl, shards, members, time.Minute)
	var took []time.Duration
	for range 5 {
		t0 := time.Now()
		jpool, err := pgxpool.New(ctx, db.DSN)
		if err != nil {
			t.Fatal(err)
		}
		joiner := startTimedMember(t, liveness.AgentConfig{Pool: jpool, DirectDSN: db.DSN}, "join", shards, tl)
		settle(t, tl, shards, append(members, joiner), time.Minute)
		took = append(took, tl.lastStartOf(joiner.id).Sub(t0))
		joiner.stop()
		<-joiner.done
		jpool.Close()
		settle(t, tl, shards, members, time.Minute)
	}
	tl.checkNoOverlap(t)
	t.Logf("a joiner owned its share %s after its start (5 trials)", durations(took))
	for _, d := range took {
		if d > 1500*time.Millisecond {
			t.Errorf("a joiner owned its share %s after its start; want at most 1.5 s (all trials: %s)", d, durations(took))
			break
		}
	}
}

// ownedOnlyBy waits until the count shards are owned by members alone (by callbacks
// that all started after from, when restarted), and returns when the last of those
// callbacks that started after from did.
func ownedOnlyBy(t *testing.T, tl *shardTimeline, count int, from time.Time, restarted bool, within time.Duration, what string,
	members ...uuid.UUID) time.Time {
	t.Helper()
	var last time.Time
	testutil.Eventually(t, within, what, func() bool {
		tl.mu.Lock()
		defer tl.mu.Unlock()
		if len(tl.owner) != count {
			return false
		}
		last = time.Time{}
		for shard, id := range tl.owner {
			at := tl.since[shard]
			if !slices.Contains(members, id) || restarted && !at.After(from) {
				return false
			}
			if at.After(from) && at.After(last) {
				last = at
			}
		}
		return true
	})
	return last
}

// gapStats says how many shards moved and their longest and median gaps.
func gapStats(gaps []shardGap) (longest, median time.Duration) {
	if len(gaps) == 0 {
		return 0, 0
	}
	return gaps[0].d, gaps[len(gaps)/2].d
}

// A shard that moves between live members is unowned only from the old owner's callback's
// return to the new one's start, however many notifications come at once: three members
// join two at once (64 shards: dozens of moves, each a free and a taken notification to
// every member), then two of the five stop at once. The target is 0.2 s for every
// move, which the log line compares each phase with; what this test holds the moves to
// leaves room for a loaded machine, whose statements alone take a tenth of a second at
// times: the median within 0.5 s, the longest within 1.5 s (a notification that waited
// out a holdoff made each move of a burst take a second).
func TestShardsHandoverGapInABurst(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 24)
	tl := newShardTimeline()
	const shards = 64
	cfg := liveness.AgentConfig{Pool: pool, DirectDSN: db.DSN}
	members := []*timedMember{startTimedMember(t, cfg, "burst", shards, tl), startTimedMember(t, cfg, "burst", shards, tl)}
	settle(t, tl, shards, members, time.Minute)

	joined := time.Now()
	for range 3 {
		members = append(members, startTimedMember(t, cfg, "burst", shards, tl))
	}
	settle(t, tl, shards, members, time.Minute)
	joins := tl.gapsSince(joined)

	stopped := time.Now()
	var wg sync.WaitGroup
	for _, m := range []*timedMember{members[0], members[3]} {
		wg.Go(func() { m.stop(); <-m.done })
	}
	wg.Wait()
	members = []*timedMember{members[1], members[2], members[4]}
	settle(t, tl, shards, members, time.Minute)
	stops := tl.gapsSince(stopped)
	tl.checkNoOverlap(t)

	for _, phase := range []struct {
		what string
		gaps []shardGap
	}{{"three joining at once", joins}, {"two stopping at once", stops}} {
		longest, median := gapStats(phase.gaps)
		over := 0
		for _, g := range phase.gaps {
			if g.d > 200*time.Millisecond {
				over++
			}
		}
		t.Logf("%s: %d shards moved, each unowned for at most %s (median %s); %d moves over the 0.2 s target",
			phase.what, len(phase.gaps), longest.Round(time.Millisecond), median.Round(time.Millisecond), over)
		switch {
		case len(phase.gaps) == 0:
			t.Errorf("%s: no shard moved", phase.what)
		case median > 500*time.Millisecond || longest > 1500*time.Millisecond:
			t.Errorf("%s: shards unowned for %s at the median, %s at most (shard %s); want at most 0.5 s and 1.5 s",
				phase.what, median, longest, phase.gaps[0].shard)
		}
	}
}

// A crashed owner's shards all move once it is dead by the verdict: about a lock grace
// after its lock vanished (the watcher stamps the vanishing within a tick, and notifies
// the death at once). The crash is the server's view of one: the member's every
// connection (its pool's and its lock's) goes through a proxy that closes them all at
// once. The target is 1.5 s, from the crash to the start of the last of its shards'
// new owners' callbacks, which the log line compares with; this test allows a loaded
// machine 2 s.
func TestShardsOfACrashedOwnerMoveSoon(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 16)
	tl := newShardTimeline()
	const shards = 64
	cfg := liveness.AgentConfig{Pool: pool, DirectDSN: db.DSN}
	members := []*timedMember{startTimedMember(t, cfg, "crash", shards, tl), startTimedMember(t, cfg, "crash", shards, tl)}
	proxy := netfault.NewProxy(t, db.DSN, 0)
	t.Cleanup(proxy.Close)
	crashing := startTimedMember(t, liveness.AgentConfig{Pool: pgtest.Pool(t, proxy.DSN(), 4), DirectDSN: proxy.DSN()},
		"crash", shards, tl)
	settle(t, tl, shards, append(members, crashing), time.Minute)
	// A member may own shards before its row records its lock held: the fleet judges it
	// by its heartbeat alone until then, and its crash moves its shards only at their
	// leases' expiry. This test is about a member whose lock is held and recorded so; it
	// waits for both (alive by pg_locks is not enough: the beat that records the claim
	// may still be on its way, and the crash may cut it).
	testutil.Eventually(t, 30*time.Second, "the crashing member alive by its lock, its row recording it held", func() bool {
		var recorded bool
		err := pool.QueryRow(context.Background(), `SELECT holds_alive_lock FROM liveness.instances WHERE instance_id = $1`,
			crashing.id).Scan(&recorded)
		return err == nil && recorded && testdb.States(t, pool)[crashing.id.String()] == string(liveness.StateAlive)
	})
	_, by, _ := tl.owned()
	var watchers []string // who leads the watchers at the crash, for the diagnosis
	if rows, err := pool.Query(context.Background(), `SELECT name || ': ' || coalesce(holder_instance_id::text, 'none')
	    || CASE WHEN holder_instance_id = $1 THEN ' (the crashing member)' ELSE '' END
	  FROM liveness.leases WHERE name LIKE 'pg_liveness.watcher.%' ORDER BY name`, crashing.id); err == nil {
		for rows.Next() {
			var w string
			if rows.Scan(&w) == nil {
				watchers = append(watchers, w)
			}
		}
		rows.Close()
	}

	crashing.crashed.Store(true)
	crashed := time.Now()
	// A crash ends every connection at once. Closed one by one, the lock's session could
	// end first, and the member, still running, record its lock lost through a pool
	// connection not closed yet: the fleet would then rightly judge it by its heartbeat.
	proxy.Freeze()
	proxy.Close()
	// What the fleet's watchers see 2.5 s after the crash, while the shards should have
	// moved and their leases have not expired: logged if they had not moved by then.
	var early []string
	diagnosed := make(chan struct{})
	go func() {
		defer close(diagnosed)
		time.Sleep(2500*time.Millisecond - time.Since(crashed))
		if movedFrom(tl, shards, crashing.id) {
			return
		}
		early = crashDiagnosis(pool, crashing.id, members)
	}()
	moved := ownedOnlyBy(t, tl, shards, crashed, false, time.Minute, "the crashed member's shards owned by the others",
		members[0].id, members[1].id)
	tl.checkNoOverlap(t)
	<-diagnosed
	took := moved.Sub(crashed)
	t.Logf("the crashed member's %d shards all moved %s after the crash (the target: 1.5 s)", by[crashing.id],
		took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("the crashed member's shards all moved %s after the crash; want at most 2 s; the watchers at the crash: %v",
			took, watchers)
		for _, line := range early {
			t.Logf("2.5 s after the crash: %s", line)
		}
		// What the schema recorded of the crashed instance, for the diagnosis: its death
		// (when and how), and its member lease's end.
		rows, err := pool.Query(context.Background(), `SELECT at, kind, coalesce(lease_name, ''), coalesce(how, ''),
		       coalesce(reason, ''), since FROM liveness.history
		 WHERE instance_id = $1 AND at > now() - interval '1 minute' AND (lease_name IS NULL OR lease_name LIKE '%/member/%')
		 ORDER BY at`, crashing.id)
		if err == nil {
			for rows.Next() {
				var at time.Time
				var since *time.Time
				var kind, lease, how, reason string
				if rows.Scan(&at, &kind, &lease, &how, &reason, &since) == nil {
					t.Logf("history: %s after the crash: %s %s how=%s reason=%s since=%v", at.Sub(crashed).Round(time.Millisecond),
						kind, lease, how, reason, since)
				}
			}
			rows.Close()
		}
	}
}

// After a restart of the server every shard is owned again soon after the server is back
// (every member lost its lock with the restart, so every callback was cancelled): the
// releases that failed while the server was down are sent again every 0.2 s, and each
// member joins as soon as its agent can prove life again, its lock claimed again as soon
// as its heartbeat gets through. The target is 1 s from the server's return, which
// the log line compares with; this test allows a loaded machine 2 s.
func TestShardsOwnedAgainSoonAfterAServerRestart(t *testing.T) {
	srv := pgtest.NewServer(t)
	db := pgtest.NewDBOn(t, srv)
	testdb.Migrate(t, db.DSN, defaults.Schema)
	tl := newShardTimeline()
	const shards = 16
	var members []*timedMember
	for range 2 {
		members = append(members, startTimedMember(t, liveness.AgentConfig{Pool: pgtest.Pool(t, db.DSN, 8), DirectDSN: db.DSN},
			"restart", shards, tl))
	}
	settle(t, tl, shards, members, time.Minute)
	stopped := time.Now()
	if err := srv.StopMode("fast"); err != nil {
		t.Fatal(err)
	}
	// Down longer than a leader's trust outlives its last proof (three quarters of the lock
	// grace), so that every lease is lost (a shorter restart costs nobody anything), and
	// long enough that the lock's reconnect backoff has grown past a second.
	time.Sleep(3 * time.Second)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	last := ownedOnlyBy(t, tl, shards, stopped, true, time.Minute, "every shard owned again after the restart",
		members[0].id, members[1].id)
	tl.checkNoOverlap(t)
	t.Logf("the server was down %s; every shard owned again %s after it was back (the target: 1 s)",
		back.Sub(stopped).Round(time.Millisecond), last.Sub(back).Round(time.Millisecond))
	if last.Sub(back) > 2*time.Second {
		t.Errorf("every shard owned again %s after the server's return; want at most 2 s", last.Sub(back))
	}
}

// movedFrom says whether every one of the count shards is owned, none by id.
func movedFrom(tl *shardTimeline, count int, id uuid.UUID) bool {
	total, by, _ := tl.owned()
	return total == count && by[id] == 0
}

// crashDiagnosis is what the schema and the surviving members say about a crashed
// member's death: the last watcher tick, its row, its stamp, who holds its lock key, the
// watcher leases, and the survivors' watcher-related log lines.
func crashDiagnosis(pool *pgxpool.Pool, id uuid.UUID, survivors []*timedMember) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []string
	for _, q := range []string{
		`SELECT 'last tick ' || round(extract(epoch FROM clock_timestamp() - watched_at)::numeric, 3) || ' s ago, '
		        || lock_count || ' locks' FROM liveness.alive_lock_watch WHERE $1::uuid IS NOT NULL`,
		`SELECT 'row: holds ' || holds_alive_lock || ', lock_pid ' || coalesce(lock_pid::text, 'null') || ', beat '
		        || round(extract(epoch FROM clock_timestamp() - last_heartbeat_at)::numeric, 3) || ' s ago'
		   FROM liveness.instances WHERE instance_id = $1`,
		`SELECT 'stamp: missing since ' || round(extract(epoch FROM clock_timestamp() - missing_since)::numeric, 3)
		        || ' s ago, lock_pid ' || coalesce(lock_pid::text, 'null') || ', notified ' || (notified_at IS NOT NULL)
		   FROM liveness.alive_lock_absences WHERE instance_id = $1`,
		`SELECT 'its lock key held by ' || l.pid || ' (' || coalesce(a.application_name, '?') || ', ' || coalesce(a.state, '?') || ')'
		   FROM liveness.instances i JOIN liveness.bigint_advisory_locks l
		     ON l.granted AND l.classid = i.lock_classid AND l.objid = i.lock_objid
		   LEFT JOIN pg_stat_activity a ON a.pid = l.pid WHERE i.instance_id = $1`,
		`SELECT 'lease ' || name || ': ' || coalesce(holder_instance_id::text, 'none') || ', expires in '
		        || round(extract(epoch FROM expires_at - clock_timestamp())::numeric, 3) || ' s'
		   FROM liveness.leases WHERE name LIKE 'pg_liveness.watcher.%' AND $1::uuid IS NOT NULL ORDER BY name`,
		`SELECT 'verdict: ' || state FROM liveness.instance_states() WHERE instance_id = $1`,
	} {
		rows, err := pool.Query(ctx, q, id)
		if err != nil {
			out = append(out, fmt.Sprintf("%.40s…: %v", q, err))
			continue
		}
		for rows.Next() {
			var line string
			if rows.Scan(&line) == nil {
				out = append(out, line)
			}
		}
		rows.Close()
	}
	for _, m := range survivors {
		if m.logs == nil {
			continue
		}
		for _, line := range strings.Split(m.logs.String(), "\n") {
			if strings.Contains(line, "watch") || strings.Contains(line, "tick") || strings.Contains(line, "dead") {
				out = append(out, fmt.Sprintf("member %s: %s", m.id.String()[:8], line))
			}
		}
	}
	return out
}
