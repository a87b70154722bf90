package liveness

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/alivelock"
	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/lease"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/notify"
)

const (
	shardPollSpacing   = 100 * time.Millisecond
	maxShardPollPeriod = 10 * time.Minute
)

// ShardsConfig configures Agent.Shards: a set of shards spread over the service's
// instances that take part, each shard owned by one of them at a time.
type ShardsConfig struct {
	// Set names the shard set; required. Its leases are named "<Set>/<shard>", and its
	// members' "<Set>/member/<instance id>".
	Set string
	// Count shards named "0" to "<Count-1>", or the shards Names: exactly one of the two.
	Count int
	Names []string
	// TTL of every lease of the set, renewed every TTL/4 in one statement for all of them;
	// 15 s if zero. A hung member's shards move once their leases expire, at
	// most TTL after its last renewal; a crashed member's once it is dead by the verdict.
	TTL time.Duration
	// PollPeriod is how often the members are read without a notification;
	// 10 s if zero.
	PollPeriod time.Duration

	// OnStartedOwning runs, in its own goroutine, each time this process comes to own a
	// shard; required. The shard's lease is released only after it has returned, and
	// until then it is renewed for as long as this instance can prove life. Its context is
	// cancelled when the shard is to move (a member joined or left, and the shard now
	// belongs to another), when Shards' context ends or the Agent stops (then the lease
	// stays renewed while the callback winds down, for at most AgentConfig.JobWindDown),
	// or when the lease is lost (a *LeaseLostError: stop at once). Returning on its own
	// gives the shard up: it is released, and comes back (it is tried again within a
	// twentieth of a second). Fence the shard's writes with shard.Exec or
	// shard.BeginFunc; a fenced transaction lasts at most TTL (see Lease.Exec).
	OnStartedOwning func(ctx context.Context, shard Shard)
	// OnStoppedOwning runs after OnStartedOwning has returned and the lease was let go,
	// with the reason, as ElectorConfig.OnStoppedLeading's. Optional.
	OnStoppedOwning func(shard string, reason error)
}

// Shard is one shard this process owns: its name, and its lease (its
// epoch and the fence for the shard's writes).
type Shard struct {
	// Name is one of ShardsConfig.Names or, with ShardsConfig.Count, the shard's number
	// in decimal without leading zeros, "0" to "<Count-1>". It is a string: in SQL pass
	// it as an argument and compare it with a column of the shard's type, text (WHERE
	// shard = $1) or a number (WHERE shard = $1::integer: pgx sends the string, the
	// server reads the number; or strconv.Atoi in Go), never the column's text with it
	// (WHERE shard::text = $1 uses no index on shard).
	Name string
	// Lease is the shard's lease (its Epoch, its Context, which ends with it): fence the
	// shard's writes with its Exec, BeginFunc or Fence. Its Name is "<set>/<shard>".
	*Lease
}

// ShardSetStats is a point-in-time view of one shard set this agent takes part in.
type ShardSetStats struct {
	Set      string
	Members  int    // the set's live members, as last read
	Shards   int    // the set's shards
	Owned    int    // shards this process owns now
	Acquired uint64 // shards it came to own
	Released uint64 // shards it gave up (moved to another member, returned, or Shards ended)
	Lost     uint64 // shards whose lease it lost
}

// MaxShards is the most shards a set may have (ShardsConfig.Count, or Names): each is a
// lease row, renewed in one statement with the member's others, and a callback. At
// 100,000 a member's renewal outlasts its attempt window and the watcher's scan of the
// leases its tick's deadline, on today's schema. At 10,000 a member stops, releasing
// every lease, in 0.4-0.65 s on a 2-core machine (1.1-1.6 s before migration 0019).
const MaxShards = 10_000

// badName says what is wrong with a set's or a shard's name, or "": it must be text
// PostgreSQL stores as it is given (valid UTF-8 without NUL), and hold no /, which
// separates the parts of the set's lease names ("<set>/member/<id>", "<set>/<shard>"), so
// that no two sets' names can meet.
func badName(n string) string {
	switch {
	case n == "":
		return "must not be empty"
	case !utf8.ValidString(n):
		return "is not valid UTF-8"
	case strings.ContainsRune(n, 0):
		return "holds a NUL byte"
	case strings.Contains(n, "/"):
		return "holds a /, which separates the parts of the set's lease names"
	}
	return ""
}

func (c ShardsConfig) validate() error {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: "ShardsConfig." + field, Reason: fmt.Sprintf(format, args...)}
	}
	if why := badName(c.Set); why != "" {
		return bad("Set", "(%q) %s", c.Set, why)
	}
	switch {
	case c.OnStartedOwning == nil:
		return bad("OnStartedOwning", "must be set")
	case (c.Count > 0) == (len(c.Names) > 0):
		return bad("Count", "(%d) or ShardsConfig.Names (%d names): give exactly one", c.Count, len(c.Names))
	case c.Count < 0:
		return bad("Count", "(%d) must not be negative", c.Count)
	case c.Count > MaxShards || len(c.Names) > MaxShards:
		return bad("Count", "(%d, or %d names) must be at most MaxShards (%d)", c.Count, len(c.Names), MaxShards)
	case c.TTL != 0 && c.TTL < MinLeaseTTL:
		return bad("TTL", "(%s) must be at least %s", c.TTL, MinLeaseTTL)
	case c.TTL < 0 || c.PollPeriod < 0:
		return bad("TTL", "(%s) and ShardsConfig.PollPeriod (%s) must not be negative", c.TTL, c.PollPeriod)
	}
	seen := map[string]bool{}
	for _, n := range c.Names {
		if why := badName(n); why != "" {
			return bad("Names", "%q %s", n, why)
		}
		switch {
		case n == "member":
			return bad("Names", "%q is the members' part of the set's lease names", n)
		case seen[n]:
			return bad("Names", "%q appears twice", n)
		}
		seen[n] = true
	}
	return nil
}

// Shards takes part in the shard set cfg.Set until ctx ends or the agent stops: it holds
// the set's member lease, reads the set's live members when they change, and owns the
// shards that rendezvous hashing assigns to this instance among them (a member joining
// or leaving moves about one shard in members from the others), running
// cfg.OnStartedOwning for each. A shard is owned by one live instance at a time, outside
// the database too: its lease is released only after its callback has returned, so when
// a shard moves between live members (a join, a graceful stop) the new owner starts only
// after the old one's callback returned. A crashed member's shards move once it is dead
// by the verdict (about a lock grace after its session ended); a hung one's (SIGSTOP, a
// long pause) once their leases expire, whatever its membership says, since its member
// lease expires with them.
//
// How soon, at the defaults: a member joins as soon as its agent can prove life (its
// lock claimed and its first beat landed), so a new process owns its share a few tenths
// of a second after it starts, and after a server restart a few tenths of a second after
// the server is back (a member whose lock the restart freed joins again once it has
// claimed it, which its first beat to get through triggers). A shard that moves between
// live members is unowned from the old callback's return until the new owner's start:
// the release, its notification and one take, tens of milliseconds, whatever the burst
// of changes (the reads of the members and the tries that notifications ask for are
// paced, never waited for). A crashed member's shards move about 1.2 s after its
// process died (the lock grace, and the watcher's tick that stamps the vanishing).
//
// Whatever the number of shards, a member's leases are renewed in one statement every
// TTL/4, taken 1,000 a statement and released 5,000 a statement (its shards released
// together when their callbacks return together: a stop), and owning shards costs what
// leading costs (the alive lock proved every quarter of the lock grace); the members are
// read (one statement, O(members)) when they change and every PollPeriod. A failed join
// is logged once while the failure lasts; a release that fails (the server down) is sent
// again every 0.2 s until it lands or the lease expires. It returns nil when ctx ends or
// the agent stops, once every callback has returned and its lease was let go, with one
// line saying how the stop went; a *ConfigError for a bad cfg.
func (a *Agent) Shards(ctx context.Context, cfg ShardsConfig) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	cfg.TTL = cmp.Or(cfg.TTL, defaults.ElectorTTL)
	cfg.PollPeriod = cmp.Or(cfg.PollPeriod, defaults.ShardsPollPeriod)
	names := cfg.Names
	if len(names) == 0 {
		names = make([]string, cfg.Count)
		for i := range names {
			names[i] = strconv.Itoa(i)
		}
	}
	setCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(a.leading.stopping, func() { cancel(context.Cause(a.leading.stopping)) })
	defer stop()
	s := &shardSet{agent: a, cfg: cfg, names: names, owned: map[string]*ownedShard{}, due: map[string]bool{}, log: a.leases.log,
		group: lease.NewGroup(a.leases.in, cfg.TTL, cfg.Set+"/*"), stats: a.shardStats(cfg.Set, len(names))}
	defer a.dropShardStats(cfg.Set, s.stats)
	return s.run(setCtx)
}

// shardSet is one call of Agent.Shards; its state is owned by run's goroutine.
type shardSet struct {
	agent *Agent
	cfg   ShardsConfig
	names []string
	group *lease.Group
	log   *slog.Logger
	stats *shardSetCounts
	ended chan string // a shard whose callback returned

	member *Lease
	// members are the set's live members as last read while a member, mine the shards
	// rendezvous hashing gives this one among them, and wanted those of mine it does not
	// own yet (held by another, or freed and not taken yet).
	members []uuid.UUID
	mine    map[string]bool
	wanted  map[string]bool
	// due are the wanted shards to try at the next try: those notified free, or of its
	// own that came back; all of wanted when dueAll (a flood left some out).
	due    map[string]bool
	dueAll bool
	owned  map[string]*ownedShard
	// unreleased are leases whose release failed (the server restarting, out of reach):
	// sent again every shardReleaseRetry until it succeeds or they have expired, since
	// nobody may take a lease whose holder is alive, which this instance is again as soon
	// as the server answers.
	unreleased []unreleasedLease
	releaseAt  time.Time // the next try of unreleased

	joining, taking, releasing logging.Repeats
	joinFailures               int
}

// unreleasedLease is a lease whose release failed, until its row has surely expired.
type unreleasedLease struct {
	lease   *Lease
	expires time.Time
}

// ownedShard is a shard this process holds the lease of.
type ownedShard struct {
	lease  *Lease
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when the callback has returned
	// stopping: its callback was asked to stop; moving: because the shard belongs to
	// another member now.
	stopping, moving bool
}

// shardPacer spaces what notifications ask a member for (reads of the members, tries of
// the shards it waits for): a token bucket of burst tokens that refills at one per
// every. A burst of real changes (members joining at once, a member's shards released
// in a few statements) is acted on at once; a flood of payloads costs one statement per
// every. Owned by one goroutine.
type shardPacer struct {
	burst  float64
	every  time.Duration
	tokens float64
	last   time.Time
}

// at is when the next action may run: now, while a token is left.
func (p *shardPacer) at(now time.Time) time.Time {
	t := p.refill(now)
	if t >= 1 {
		return now
	}
	return now.Add(time.Duration((1 - t) * float64(p.every)))
}

// spend takes a token for an action that runs now.
func (p *shardPacer) spend(now time.Time) {
	p.tokens = max(p.refill(now)-1, 0)
	p.last = now
}

func (p *shardPacer) refill(now time.Time) float64 {
	if p.last.IsZero() {
		return p.burst
	}
	return min(p.burst, p.tokens+float64(now.Sub(p.last))/float64(p.every))
}

const (
	// The pace of reads of the members that notifications ask for: at once for a burst of
	// eight, then ten a second under a flood.
	shardReadBurst, shardReadEvery = 8, 100 * time.Millisecond
	// The pace of tries for the shards a member waits for (its own, still held by a member
	// that is giving them up), which notifications that they are free ask for: at once
	// for a burst of eight, then twenty a second. A member that waits for none of the
	// shards notified free sends nothing.
	shardTryBurst, shardTryEvery = 8, 50 * time.Millisecond
	// shardReadRetry is how soon a read of the members that failed is sent again.
	shardReadRetry = 250 * time.Millisecond
	// shardJoinRetry is how soon a join refused for a reason nothing notifies (its own
	// member lease from before not released yet, no proof of life in time) is tried again.
	shardJoinRetry = 100 * time.Millisecond
	// shardReleaseRetry is how often a release that failed is sent again.
	shardReleaseRetry = 200 * time.Millisecond
	// shardTakeBatch is the most shards taken in one statement (and one proof of the
	// alive lock): the server spends up to a few milliseconds on each, and a batch must be
	// answered well within the leases' trust window.
	shardTakeBatch = 1_000
	// A member that stops gathers the callbacks that return together, so that it releases
	// their leases in one statement: until none has returned for shardGatherQuiet, at
	// most shardGatherMax after the first.
	shardGatherQuiet = 20 * time.Millisecond
	shardGatherMax   = 250 * time.Millisecond
)

// shardSetCounts are a set's counts, read by Snapshot.
type shardSetCounts struct {
	set                      string
	shards                   int
	members, owned           atomic.Int64
	acquired, released, lost atomic.Uint64
}

func (a *Agent) shardStats(set string, shards int) *shardSetCounts {
	c := &shardSetCounts{set: set, shards: shards}
	a.shardsMu.Lock()
	defer a.shardsMu.Unlock()
	a.shardSets = append(a.shardSets, c)
	return c
}

func (a *Agent) dropShardStats(set string, c *shardSetCounts) {
	a.shardsMu.Lock()
	defer a.shardsMu.Unlock()
	a.shardSets = slices.DeleteFunc(a.shardSets, func(x *shardSetCounts) bool { return x == c })
}

// shardSnapshot is the sets' stats, sorted by set.
func (a *Agent) shardSnapshot() []ShardSetStats {
	a.shardsMu.Lock()
	defer a.shardsMu.Unlock()
	out := make([]ShardSetStats, 0, len(a.shardSets))
	for _, c := range a.shardSets {
		out = append(out, ShardSetStats{Set: c.set, Shards: c.shards, Members: int(c.members.Load()), Owned: int(c.owned.Load()),
			Acquired: c.acquired.Load(), Released: c.released.Load(), Lost: c.lost.Load()})
	}
	slices.SortFunc(out, func(x, y ShardSetStats) int { return strings.Compare(x.Set, y.Set) })
	return out
}

func (s *shardSet) run(ctx context.Context) error {
	prefix, memberPrefix := s.cfg.Set+"/", s.cfg.Set+"/member/"
	// A member lease taken (a join) or free (a departure, a death), or this process's
	// watcher calling holders dead while its session does not listen: read the members.
	membership, unsubscribeMembership := s.agent.events.Subscribe(func(ev notify.Event) bool {
		return ev.Kind == notify.DeadHere || (ev.Kind == notify.Free || ev.Kind == notify.Taken) && strings.HasPrefix(ev.ID, memberPrefix)
	})
	defer unsubscribeMembership()
	// A shard free: if it is one this member waits for, try it.
	freed, takeFreed, unsubscribeFreed := s.agent.events.SubscribeIDs(func(ev notify.Event) bool {
		return ev.Kind == notify.Free && strings.HasPrefix(ev.ID, prefix) && !strings.HasPrefix(ev.ID, memberPrefix)
	})
	defer unsubscribeFreed()
	s.ended = make(chan string, len(s.names)+1)
	var renewing sync.WaitGroup
	groupCtx, stopGroup := context.WithCancel(context.WithoutCancel(ctx))
	renewing.Go(func() { s.group.Run(groupCtx) })
	defer func() {
		s.leave(ctx)
		stopGroup()
		renewing.Wait()
	}()

	var (
		read        bool      // the members are to be read (at once after a join)
		try         bool      // a try for the wanted shards is due
		pollAt      time.Time // the next read without a notification
		joinAt      time.Time // a refused join's next try
		lifeChanged <-chan struct{}
		reads       = shardPacer{burst: shardReadBurst, every: shardReadEvery}
		tries       = shardPacer{burst: shardTryBurst, every: shardTryEvery}
	)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for ctx.Err() == nil {
		now := time.Now()
		if len(s.unreleased) > 0 && !now.Before(s.releaseAt) {
			s.retryReleases(ctx)
		}
		if s.member != nil && s.member.Context().Err() != nil {
			s.giveUp() // no member: no shard may stay
		}
		if s.member == nil && lifeChanged == nil && !now.Before(joinAt) {
			lifeChanged, joinAt = s.join(ctx)
			read = s.member != nil
		}
		if s.member != nil {
			switch {
			case read && !reads.at(now).After(now):
				read, try = false, false
				reads.spend(now)
				period := min(max(s.cfg.PollPeriod, time.Duration(s.stats.members.Load())*shardPollSpacing), maxShardPollPeriod)
				if members, ok := s.readMembers(ctx); ok {
					s.rebalance(ctx, members)
					pollAt = time.Now().Add(period/2 + rand.N(period/2+1))
				} else {
					pollAt = time.Now().Add(min(shardReadRetry, period)) // the server may be down: not ten a second
				}
			case try && !tries.at(now).After(now):
				try = false
				tries.spend(now)
				s.takeWanted(ctx, s.dueAll)
			}
		}

		// Wait for the next thing to do.
		next := now.Add(time.Hour)
		if s.member != nil {
			next = alivelock.Earliest(next, pollAt)
			if read {
				next = alivelock.Earliest(next, reads.at(now))
			}
			if try {
				next = alivelock.Earliest(next, tries.at(now))
			}
		} else if lifeChanged == nil {
			next = alivelock.Earliest(next, joinAt)
		}
		if len(s.unreleased) > 0 {
			next = alivelock.Earliest(next, s.releaseAt)
		}
		timer.Reset(max(time.Until(next), 0))
		var memberLost <-chan struct{}
		if s.member != nil {
			memberLost = s.member.Context().Done()
		}
		select {
		case <-ctx.Done():
		case <-timer.C:
			if s.member != nil && !time.Now().Before(pollAt) {
				read = true
			}
		case <-memberLost:
		case <-lifeChanged:
			lifeChanged, joinAt = nil, time.Time{}
		case name := <-s.ended:
			if s.reap(name) {
				try = true // a shard of its own came back: take it again
			}
		case <-membership:
			read = true
			if s.member == nil {
				joinAt = time.Time{} // its own member lease from before may be gone now
			}
		case <-freed:
			ids, all := takeFreed()
			s.dueAll = s.dueAll || all
			for _, id := range ids {
				if name := strings.TrimPrefix(id, prefix); s.wanted[name] {
					s.due[name] = true
				}
			}
			try = try || len(s.due) > 0 || s.dueAll && len(s.wanted) > 0
		}
	}
	return nil
}

// join takes the set's member lease, or leaves s.member nil and says when to try again:
// once lifeChanged is closed (this instance cannot prove life yet: an agent that has
// just started, or whose server has just come back and its lock not claimed again), or
// at retryAt. A join that fails is
// logged (once while the same failure lasts), and so is the first that succeeds after.
func (s *shardSet) join(ctx context.Context) (lifeChanged <-chan struct{}, retryAt time.Time) {
	if life := s.agent.leases.life; life != nil && !life.Alive() {
		ch := life.Changed()
		if !life.Alive() {
			return ch, time.Time{}
		}
	}
	if lock := s.agent.lock; lock != nil && lock.ClaimCount() > 0 {
		// A lock held before and lost (a restarted server): a member lease would be given
		// back at once for want of a proof, until it is claimed again.
		ch := lock.Changed()
		if !lock.Held() {
			return ch, time.Time{}
		}
	}
	if !s.agent.leading.enter() {
		return nil, time.Now().Add(time.Hour) // the agent stops: so does ctx
	}
	name := s.cfg.Set + "/member/" + s.agent.cfg.InstanceID.String()
	le, err := s.agent.leases.acquireIn(ctx, context.WithoutCancel(ctx), name, s.cfg.TTL, s.group)
	if err == nil {
		s.member, s.joinFailures = le, 0
		s.joining.Clear(s.log, "shards: joined the set", "set", s.cfg.Set)
		s.log.Debug("shards: joined the set", "set", s.cfg.Set, "epoch", le.Epoch)
		return nil, time.Time{}
	}
	s.agent.leading.leave()
	if ctx.Err() != nil {
		return nil, time.Time{}
	}
	var held *lease.HeldError
	switch {
	case errors.As(err, &held):
		// Its own member lease from before, whose release is being sent again, or the
		// fleet does not see this instance alive yet: nothing notifies the end of either.
		s.joining.Log(s.log, slog.LevelInfo, "held", "shards: cannot join the set yet: its member lease is held "+
			"(this instance's own from before, until its release lands, or the fleet does not see this instance "+
			"alive yet); retrying", "set", s.cfg.Set, "retry", shardJoinRetry)
		return nil, time.Now().Add(shardJoinRetry)
	case errors.Is(err, lease.ErrNotAlive):
		s.joining.Log(s.log, slog.LevelInfo, "not_alive", "shards: cannot join the set yet: this instance could "+
			"not prove life in time for its member lease; retrying", "set", s.cfg.Set, "retry", shardJoinRetry)
		return nil, time.Now().Add(shardJoinRetry)
	}
	// The server refuses, or does not answer: fewer tries, not more.
	s.joinFailures = min(s.joinFailures+1, 10)
	retry := min(shardJoinRetry<<s.joinFailures, s.cfg.PollPeriod)
	s.joining.Log(s.log, slog.LevelWarn, "error", "shards: cannot join the set: taking its member lease failed; "+
		"retrying", "set", s.cfg.Set, "retry", retry, "err", err)
	return nil, time.Now().Add(retry)
}

// readMembers reads the set's live members, sorted.
func (s *shardSet) readMembers(ctx context.Context) ([]uuid.UUID, bool) {
	low := s.cfg.Set + "/member/"
	high := low[:len(low)-1] + string(rune(low[len(low)-1]+1))
	qctx, cancel := context.WithTimeout(ctx, s.cfg.TTL/4)
	defer cancel()
	rows, err := s.agent.leases.pool.Query(qctx, s.agent.leases.stmts.shardMembers, low, high)
	var members []uuid.UUID
	if err == nil {
		members, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	}
	if err != nil {
		if ctx.Err() == nil {
			s.log.Debug("shards: cannot read the members", "set", s.cfg.Set, "err", err)
		}
		return nil, false
	}
	slices.SortFunc(members, func(x, y uuid.UUID) int { return strings.Compare(x.String(), y.String()) })
	s.stats.members.Store(int64(len(members)))
	return members, true
}

// rebalance gives up the shards that belong to another member now, and takes those that
// belong to this one and are free. A member not (yet) among the live members owns none.
func (s *shardSet) rebalance(ctx context.Context, members []uuid.UUID) {
	if s.mine == nil || !slices.Equal(members, s.members) {
		s.members, s.mine = members, map[string]bool{}
		if me := s.agent.cfg.InstanceID; slices.Contains(members, me) {
			for _, name := range s.names {
				if shardOwner(s.cfg.Set, name, members) == me {
					s.mine[name] = true
				}
			}
		}
	}
	for name, o := range s.owned {
		if !s.mine[name] && !o.stopping {
			o.stopping, o.moving = true, true
			o.cancel(errShardMoved)
		}
	}
	s.wanted = map[string]bool{}
	for name := range s.mine {
		if s.owned[name] == nil {
			s.wanted[name] = true
		}
	}
	s.takeWanted(ctx, true)
}

// errShardMoved cancels a shard's callback: the shard belongs to another member now.
var errShardMoved = errors.New("liveness: the shard belongs to another member now")

// shardOwner is the member rendezvous hashing assigns shard name of set to: the one with
// the highest hash of (set, shard, member). A join or a departure moves only the shards
// of the member that left, or those the new one now wins.
func shardOwner(set, name string, members []uuid.UUID) uuid.UUID {
	var best uuid.UUID
	var top uint64
	for _, m := range members {
		h := fnv.New64a()
		h.Write([]byte(set))
		h.Write([]byte{0})
		h.Write([]byte(name))
		h.Write([]byte{0})
		h.Write(m[:])
		if v := mix64(h.Sum64()); best == uuid.Nil || v > top {
			best, top = m, v
		}
	}
	return best
}

// mix64 spreads FNV's output (a finalizer of splitmix64), so that the highest hash is
// not biased by the member bytes FNV mixes last.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// takeWanted tries the leases of the wanted shards (all of them, or only those due),
// shardTakeBatch in one statement, and starts the callback of each taken. A try takes the
// row lock of each lease it tries until its statement ends, and a release of the other
// member waits for it: trying only the shards notified free keeps a handover from
// waiting for tries of the shards still held.
func (s *shardSet) takeWanted(ctx context.Context, all bool) {
	names := make([]string, 0, len(s.due))
	for name := range s.wanted {
		if all || s.due[name] {
			names = append(names, s.cfg.Set+"/"+name)
		}
	}
	clear(s.due)
	s.dueAll = false
	if all && len(names) > 0 {
		names = s.free(ctx, names)
	}
	if len(names) == 0 {
		return
	}
	slices.Sort(names)
	for batch := range slices.Chunk(names, shardTakeBatch) {
		if ctx.Err() != nil || s.member == nil || s.member.Context().Err() != nil || !s.agent.leading.enterN(len(batch)) {
			return
		}
		les, err := s.agent.leases.acquireMany(ctx, batch, s.group)
		s.agent.leading.leaveN(len(batch) - len(les))
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, lease.ErrNotAlive) {
				s.taking.Log(s.log, slog.LevelWarn, "error", "shards: cannot take shards; retrying at the next read of "+
					"the members", "set", s.cfg.Set, "err", err)
			}
			return
		}
		s.taking.Clear(s.log, "shards: taking shards again", "set", s.cfg.Set)
		for _, le := range les {
			s.start(strings.TrimPrefix(le.Name, s.cfg.Set+"/"), le)
		}
	}
}

// free is those of names (lease names of the set's shards) that are free now, or all of
// them when that cannot be read.
func (s *shardSet) free(ctx context.Context, names []string) []string {
	qctx, cancel := context.WithTimeout(ctx, s.cfg.TTL/4)
	defer cancel()
	rows, err := s.agent.leases.pool.Query(qctx, s.agent.leases.stmts.shardFree, names)
	var free []string
	if err == nil {
		free, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		if ctx.Err() == nil {
			s.log.Debug("shards: cannot read which shards are free; trying them all", "set", s.cfg.Set, "err", err)
		}
		return names
	}
	return free
}

// start runs the callback of a shard whose lease it has just taken.
func (s *shardSet) start(name string, le *Lease) {
	job, cancel := context.WithCancelCause(le.Context())
	o := &ownedShard{lease: le, cancel: cancel, done: make(chan struct{})}
	s.owned[name] = o
	delete(s.wanted, name)
	s.stats.acquired.Add(1)
	s.stats.owned.Store(int64(len(s.owned)))
	self := Shard{Name: name, Lease: le}
	s.log.Debug("shards: owning", "set", s.cfg.Set, "shard", name, "epoch", le.Epoch)
	go func() {
		defer func() { s.ended <- name }()
		defer close(o.done)
		defer cancel(nil)
		s.cfg.OnStartedOwning(job, self)
	}()
}

// reap lets go of the shard whose callback has just returned, and of every other whose
// callback has returned by now, in one statement. It reports whether one of them is
// this member's still (its callback returned on its own, or its lease was lost): it
// may be taken again.
func (s *shardSet) reap(first string) (cameBack bool) {
	names := []string{first}
	for more := true; more; {
		select {
		case name := <-s.ended:
			names = append(names, name)
		default:
			more = false
		}
	}
	return s.letGo(names, false)
}

// letGo releases the shards names, whose callbacks have returned, in one statement (with
// the member lease too when withMember), and reports why each stopped (OnStoppedOwning).
// The leases lost among them are told in one line.
func (s *shardSet) letGo(names []string, withMember bool) (cameBack bool) {
	type gone struct {
		name   string
		o      *ownedShard
		reason error
	}
	done := make([]gone, 0, len(names))
	les := make([]*Lease, 0, len(names))
	for _, name := range names {
		if o := s.owned[name]; o != nil {
			done = append(done, gone{name: name, o: o, reason: o.lease.Err()}) // before the release ends it
			les = append(les, o.lease)
		}
	}
	withMember = withMember && s.member != nil
	if withMember {
		les = append(les, s.member)
	}
	if len(les) == 0 {
		return false
	}
	err := s.agent.leases.releaseMany(context.Background(), les) // a lost lease deletes nothing
	if err != nil {
		s.keepReleasing(les, err)
	}
	if withMember {
		s.agent.leading.leave()
		s.member = nil
	}
	s.agent.leading.leaveN(len(done))
	var lost []string
	reasons := map[string]int{}
	for i := range done {
		g := &done[i]
		delete(s.owned, g.name)
		var ll *LeaseLostError
		var outlived *lease.OutlivedError
		switch {
		case errors.As(g.reason, &ll):
			s.stats.lost.Add(1)
			if !errors.As(ll.Err, &outlived) { // a fenced transaction past its bound: said already
				lost = append(lost, g.name)
				reasons[ll.Reason]++
			}
		case g.o.moving:
			g.reason = errShardMoved
			s.stats.released.Add(1)
		default:
			g.reason = ErrLeaseReleased
			s.stats.released.Add(1)
		}
		if s.mine[g.name] && s.member != nil && !g.o.moving {
			s.wanted[g.name], s.due[g.name], cameBack = true, true, true
		}
	}
	s.stats.owned.Store(int64(len(s.owned)))
	if len(lost) > 0 {
		s.log.Warn("shards: leases lost; their callbacks have returned", "set", s.cfg.Set, "count", len(lost),
			"reasons", fmt.Sprint(reasons), "shards", sample(lost))
	}
	if s.cfg.OnStoppedOwning != nil {
		for _, g := range done {
			s.cfg.OnStoppedOwning(g.name, g.reason)
		}
	}
	return cameBack
}

// sample is at most ten of names, for a log line.
func sample(names []string) string {
	if len(names) <= 10 {
		return strings.Join(names, ",")
	}
	return strings.Join(names[:10], ",") + fmt.Sprintf(",... (%d more)", len(names)-10)
}

// keepReleasing sends the release of les again until it succeeds or their rows have
// expired: a lease lost while the server did not answer (a restart, a failover) is one
// whose release failed, and its row would otherwise keep its shard, or this member's
// next join, from anyone until it expired.
func (s *shardSet) keepReleasing(les []*Lease, err error) {
	expires := time.Now().Add(s.cfg.TTL)
	for _, le := range les {
		s.unreleased = append(s.unreleased, unreleasedLease{lease: le, expires: expires})
	}
	s.releaseAt = time.Now().Add(shardReleaseRetry)
	s.releasing.Log(s.log, slog.LevelInfo, "failed", "shards: release failed; sending it again until it lands or "+
		"the leases expire", "set", s.cfg.Set, "leases", len(s.unreleased), "err", err)
}

// retryReleases sends the failed releases again, in one statement.
func (s *shardSet) retryReleases(ctx context.Context) {
	now := time.Now()
	s.unreleased = slices.DeleteFunc(s.unreleased, func(u unreleasedLease) bool { return !now.Before(u.expires) })
	les := make([]*Lease, len(s.unreleased))
	for i, u := range s.unreleased {
		les[i] = u.lease
	}
	err := s.agent.leases.deleteRows(ctx, les)
	if err != nil && len(les) > 0 {
		s.releasing.Log(s.log, slog.LevelInfo, "failed", "shards: release failed; sending it again until it lands or "+
			"the leases expire", "set", s.cfg.Set, "leases", len(les), "err", err)
		s.releaseAt = time.Now().Add(shardReleaseRetry)
		return
	}
	s.unreleased = nil
	s.releasing.Clear(s.log, "shards: released after all", "set", s.cfg.Set, "leases", len(les))
}

// giveUp ends this process's membership, whose member lease was lost: every callback is
// cancelled with the loss (their shards are let go as they return), the member lease is
// released, and the member joins again as soon as it can.
func (s *shardSet) giveUp() {
	cause := s.member.Err()
	stopping := 0
	for _, o := range s.owned {
		if !o.stopping {
			o.stopping = true
			o.cancel(cause)
			stopping++
		}
	}
	s.log.Warn("shards: this instance is no member of the set any more: its member lease was lost; its shards' "+
		"callbacks are cancelled, and it joins again as soon as it can", "set", s.cfg.Set, "stopping", stopping, "err", cause)
	s.releaseMember()
	s.members, s.mine, s.wanted = nil, nil, nil
	clear(s.due)
	s.dueAll = false
	s.stats.members.Store(0)
}

// releaseMember releases the member lease (sent again later if that fails).
func (s *shardSet) releaseMember() {
	if s.member == nil {
		return
	}
	if err := s.agent.leases.releaseMany(context.Background(), []*Lease{s.member}); err != nil {
		s.keepReleasing([]*Lease{s.member}, err)
	}
	s.agent.leading.leave()
	s.member = nil
}

// leave ends the set's part when ctx has ended: every callback is cancelled, and the
// shards are released as their callbacks return (their leases renewed meanwhile, for at
// most JobWindDown), in one statement for the callbacks that return together; the member
// lease goes with the first of them, so that the others see the departure and find those
// shards free at once, and take each later one as soon as it is released. One line says
// how it went.
func (s *shardSet) leave(ctx context.Context) {
	began := time.Now()
	if len(s.owned) == 0 {
		s.releaseMember()
	}
	cause := context.Cause(ctx)
	for _, o := range s.owned {
		if !o.stopping {
			o.stopping = true
			o.cancel(cause)
		}
	}
	windDown := s.agent.cfg.JobWindDown
	deadline := time.NewTimer(windDown)
	defer deadline.Stop()
	released := 0
	var stragglers []string
	for len(s.owned) > 0 && stragglers == nil {
		select {
		case name := <-s.ended:
			names := s.gather(name)
			released += len(names)
			s.letGo(names, true)
		case <-deadline.C:
			les := make([]*Lease, 0, len(s.owned))
			for name, o := range s.owned {
				stragglers = append(stragglers, name)
				les = append(les, o.lease)
			}
			err := s.agent.leases.leaveManyToExpire(context.Background(), les)
			s.agent.leading.leaveN(len(les))
			clear(s.owned)
			s.stats.owned.Store(0)
			slices.Sort(stragglers)
			s.log.Error("shards: callbacks did not return within their wind-down: their leases are left to expire, "+
				"and another member may own those shards then while these callbacks still run", "set", s.cfg.Set,
				"count", len(stragglers), "wind_down", windDown, "shards", sample(stragglers), "released", released, "err", err)
		}
	}
	s.releaseMember() // when the wind-down ran out before any callback returned
	if len(s.unreleased) > 0 {
		s.retryReleases(context.Background()) // once more: the instance's end frees them otherwise
	}
	s.stats.members.Store(0)
	if stragglers == nil && released > 0 {
		s.log.Info("shards: left the set; every shard released", "set", s.cfg.Set, "released", released,
			"took", time.Since(began).Round(time.Millisecond))
	}
}

// gather is first and the names of the other callbacks that return with it: until none
// has for shardGatherQuiet, at most shardGatherMax, or every owned shard's has.
func (s *shardSet) gather(first string) []string {
	names := []string{first}
	limit := time.NewTimer(shardGatherMax)
	defer limit.Stop()
	quiet := time.NewTimer(shardGatherQuiet)
	defer quiet.Stop()
	for len(names) < len(s.owned) {
		select {
		case name := <-s.ended:
			names = append(names, name)
			quiet.Reset(shardGatherQuiet)
		case <-quiet.C:
			return names
		case <-limit.C:
			return names
		}
	}
	return names
}
