package liveness

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
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
)

// DefaultShardsPollPeriod is how often Agent.Shards reads its set's members without a
// notification: the fallback for a notification lost while its session did not listen.
// A set of more than 100 members polls every members times shardPollSpacing instead (at
// most maxShardPollPeriod), so that the set's reads stay about ten a second.
const DefaultShardsPollPeriod = 10 * time.Second

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
	// DefaultElectorTTL if zero. A hung member's shards move once their leases expire, at
	// most TTL after its last renewal; a crashed member's once it is dead by the verdict.
	TTL time.Duration
	// PollPeriod is how often the members are read without a notification;
	// DefaultShardsPollPeriod if zero.
	PollPeriod time.Duration

	// OnStartedOwning runs, in its own goroutine, each time this process comes to own a
	// shard; required. The shard's lease is released only after it has returned, and
	// until then it is renewed for as long as this instance can prove life. Its context is
	// cancelled when the shard is to move (a member joined or left, and the shard now
	// belongs to another), when Shards' context ends or the Agent stops (then the lease
	// stays renewed while the callback winds down, for at most AgentConfig.JobWindDown),
	// or when the lease is lost (a *LeaseLostError: stop at once). Returning on its own
	// gives the shard up: it is released, and may come back. Fence the shard's writes with
	// shard.Exec or shard.BeginFunc.
	OnStartedOwning func(ctx context.Context, shard Shard)
	// OnStoppedOwning runs after OnStartedOwning has returned and the lease was let go,
	// with the reason, as ElectorConfig.OnStoppedLeading's. Optional.
	OnStoppedOwning func(shard string, reason error)
}

// Shard is one shard this process owns: its name, and the leadership of its lease (its
// epoch and the fence for the shard's writes).
type Shard struct {
	Name string
	Leadership
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
// lease row, renewed in one statement with the member's others, and a callback.
const MaxShards = 100_000

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
// Whatever the number of shards, a member's leases are renewed in one statement every
// TTL/4, and owning shards costs what leading costs (the alive lock proved every quarter
// of the lock grace); the members are read (one statement, O(members)) when they change
// and every PollPeriod. It returns nil when ctx ends or the agent stops, once every
// callback has returned and its lease was let go; a *ConfigError for a bad cfg.
func (a *Agent) Shards(ctx context.Context, cfg ShardsConfig) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	cfg.TTL = cmp.Or(cfg.TTL, DefaultElectorTTL)
	cfg.PollPeriod = cmp.Or(cfg.PollPeriod, DefaultShardsPollPeriod)
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
	s := &shardSet{agent: a, cfg: cfg, names: names, owned: map[string]*ownedShard{},
		group: newLeaseGroup(a.leases, cfg.TTL, cfg.Set+"/*"), stats: a.shardStats(cfg.Set, len(names))}
	defer a.dropShardStats(cfg.Set, s.stats)
	return s.run(setCtx)
}

// shardSet is one call of Agent.Shards; its state is owned by run's goroutine.
type shardSet struct {
	agent  *Agent
	cfg    ShardsConfig
	names  []string
	group  *leaseGroup
	member *Lease
	owned  map[string]*ownedShard
	stats  *shardSetCounts
	ended  chan string // a shard whose callback returned
}

// ownedShard is a shard this process holds the lease of.
type ownedShard struct {
	lease  *Lease
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when the callback has returned
	moving bool          // its callback was asked to stop: the shard belongs to another member now
}

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
	prefix := s.cfg.Set + "/"
	wake, unsubscribe := s.agent.events.subscribe(func(ev event) bool {
		return (ev.Kind == eventFree || ev.Kind == eventTaken) && strings.HasPrefix(ev.ID, prefix)
	})
	defer unsubscribe()
	s.ended = make(chan string, len(s.names)+1)
	var renewing sync.WaitGroup
	groupCtx, stopGroup := context.WithCancel(context.WithoutCancel(ctx))
	renewing.Go(func() { s.group.run(groupCtx) })
	defer func() {
		s.leave(ctx)
		stopGroup()
		renewing.Wait()
	}()
	poll := time.NewTimer(0)
	defer poll.Stop()
	var limit wakeLimiter
	for ctx.Err() == nil {
		s.reap()
		if s.member == nil || s.member.ctx.Err() != nil {
			s.dropAll(ctx) // not a member: no shard may stay
			s.join(ctx)
		}
		if s.member != nil && s.member.ctx.Err() == nil {
			if members, ok := s.readMembers(ctx); ok {
				s.rebalance(ctx, members)
			}
		}
		// A large set's members poll rarer: about ten reads a second for the set.
		period := min(max(s.cfg.PollPeriod, time.Duration(s.stats.members.Load())*shardPollSpacing), maxShardPollPeriod)
		poll.Reset(period/2 + rand.N(period/2+1))
		var memberLost <-chan struct{}
		if s.member != nil {
			memberLost = s.member.ctx.Done()
		}
		select {
		case <-ctx.Done():
		case <-poll.C:
		case <-memberLost:
		case name := <-s.ended:
			s.reapOne(name)
		case <-wake:
			// Notifications are hints: a flood of them costs one read per wakeHoldoff.
			select {
			case <-ctx.Done():
			case <-time.After(limit.delay(time.Now())):
			}
		}
	}
	return nil
}

// join takes the set's member lease, or leaves s.member nil (tried again at the next
// turn of the loop).
func (s *shardSet) join(ctx context.Context) {
	if !s.agent.leading.enter() {
		return
	}
	name := s.cfg.Set + "/member/" + s.agent.cfg.InstanceID.String()
	le, err := s.agent.leases.acquireIn(ctx, context.WithoutCancel(ctx), name, s.cfg.TTL, s.group)
	if err != nil {
		s.agent.leading.leave()
		s.member = nil
		if ctx.Err() == nil && !errors.Is(err, ErrLeaseHeld) && !errors.Is(err, errNotAlive) {
			s.agent.leases.log.Debug("shards: cannot take the member lease; retrying", "set", s.cfg.Set, "err", err)
		}
		return
	}
	s.member = le
}

// readMembers reads the set's live members, sorted.
func (s *shardSet) readMembers(ctx context.Context) ([]uuid.UUID, bool) {
	low := s.cfg.Set + "/member/"
	high := low[:len(low)-1] + string(rune(low[len(low)-1]+1))
	qctx, cancel := context.WithTimeout(ctx, s.cfg.TTL/4)
	defer cancel()
	rows, err := s.agent.leases.pool.Query(qctx, s.agent.leases.stmts.shardMembers, low, high)
	if err != nil {
		if ctx.Err() == nil {
			s.agent.leases.log.Debug("shards: cannot read the members", "set", s.cfg.Set, "err", err)
		}
		return nil, false
	}
	members, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		if ctx.Err() == nil {
			s.agent.leases.log.Debug("shards: cannot read the members", "set", s.cfg.Set, "err", err)
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
	me := s.agent.cfg.InstanceID
	mine := map[string]bool{}
	if slices.Contains(members, me) {
		for _, name := range s.names {
			if shardOwner(s.cfg.Set, name, members) == me {
				mine[name] = true
			}
		}
	}
	for name, o := range s.owned {
		if !mine[name] && !o.moving {
			o.moving = true
			o.cancel(errShardMoved)
		}
	}
	for _, name := range s.names {
		if !mine[name] || s.owned[name] != nil || ctx.Err() != nil {
			continue
		}
		if s.member.ctx.Err() != nil {
			return
		}
		s.take(ctx, name)
	}
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

// take tries the shard's lease and, once it holds it, starts its callback.
func (s *shardSet) take(ctx context.Context, name string) {
	if !s.agent.leading.enter() {
		return
	}
	le, err := s.agent.leases.acquireIn(ctx, context.WithoutCancel(ctx), s.cfg.Set+"/"+name, s.cfg.TTL, s.group)
	if err != nil {
		s.agent.leading.leave()
		if ctx.Err() == nil && !errors.Is(err, ErrLeaseHeld) && !errors.Is(err, errNotAlive) {
			s.agent.leases.log.Debug("shards: cannot take a shard; retrying", "set", s.cfg.Set, "shard", name, "err", err)
		}
		return
	}
	job, cancel := context.WithCancelCause(le.ctx)
	o := &ownedShard{lease: le, cancel: cancel, done: make(chan struct{})}
	s.owned[name] = o
	s.stats.acquired.Add(1)
	s.stats.owned.Store(int64(len(s.owned)))
	self := Shard{Name: name, Leadership: Leadership{Leader: Leader{Lease: le.Name, InstanceID: s.agent.cfg.InstanceID,
		Host: s.agent.leases.host, Epoch: le.Epoch, TakenAt: le.TakenAt, ExpiresAt: le.ExpiresAt()}, lease: le}}
	s.agent.leases.log.Debug("shards: owning", "set", s.cfg.Set, "shard", name, "epoch", le.Epoch)
	go func() {
		defer func() { s.ended <- name }()
		defer close(o.done)
		defer cancel(nil)
		s.cfg.OnStartedOwning(job, self)
	}()
}

// reap lets go of the shards whose callbacks have returned.
func (s *shardSet) reap() {
	for {
		select {
		case name := <-s.ended:
			s.reapOne(name)
		default:
			return
		}
	}
}

// reapOne lets go of a shard whose callback has returned.
func (s *shardSet) reapOne(name string) {
	if o := s.owned[name]; o != nil {
		<-o.done // closed before its name is sent
		s.letGo(name, o)
	}
}

// letGo releases a shard whose callback has returned, and reports why it stopped.
func (s *shardSet) letGo(name string, o *ownedShard) {
	reason := o.lease.Err()
	switch {
	case errors.Is(reason, ErrLeaseLost):
		s.stats.lost.Add(1)
	case o.moving:
		reason = errShardMoved
		s.stats.released.Add(1)
	default:
		reason = ErrLeaseReleased
		s.stats.released.Add(1)
	}
	rctx, cancel := context.WithTimeout(context.Background(), runReleaseTimeout)
	_ = o.lease.Release(rctx) // a lost lease deletes nothing; a failed release expires
	cancel()
	s.agent.leading.leave()
	delete(s.owned, name)
	s.stats.owned.Store(int64(len(s.owned)))
	if s.cfg.OnStoppedOwning != nil {
		s.cfg.OnStoppedOwning(name, reason)
	}
}

// dropAll stops every callback and lets go of every shard, and of the member lease: this
// process is no member (its member lease was lost).
func (s *shardSet) dropAll(ctx context.Context) {
	cause := context.Cause(ctx)
	if cause == nil {
		cause = &LeaseLostError{Name: s.cfg.Set + "/member/" + s.agent.cfg.InstanceID.String(), Reason: LostTaken}
		if s.member != nil {
			if err := s.member.Err(); err != nil {
				cause = err
			}
		}
	}
	for _, o := range s.owned {
		o.cancel(cause)
	}
	s.waitAll(s.agent.cfg.JobWindDown)
	if s.member != nil {
		rctx, cancel := context.WithTimeout(context.Background(), runReleaseTimeout)
		_ = s.member.Release(rctx)
		cancel()
		s.agent.leading.leave()
		s.member = nil
	}
}

// waitAll waits, at most windDown, for every callback to return and lets go of its
// shard; a callback still running then has its lease left to expire.
func (s *shardSet) waitAll(windDown time.Duration) {
	deadline := time.NewTimer(windDown)
	defer deadline.Stop()
	for len(s.owned) > 0 {
		select {
		case name := <-s.ended:
			if o := s.owned[name]; o != nil {
				s.letGo(name, o)
			}
		case <-deadline.C:
			for name, o := range s.owned {
				rctx, cancel := context.WithTimeout(context.Background(), runReleaseTimeout)
				err := o.lease.leaveToExpire(rctx)
				cancel()
				s.agent.leading.leave()
				s.agent.leases.log.Error("a shard's callback did not return within its wind-down: its lease is left to "+
					"expire, and another member may own the shard then while this callback still runs",
					"set", s.cfg.Set, "shard", name, "wind_down", windDown, "err", err)
				delete(s.owned, name)
			}
			s.stats.owned.Store(0)
			return
		}
	}
}

// leave ends the set's part: every callback returns (the leases renewed meanwhile, for at
// most JobWindDown), the shards are released, and then the member lease.
func (s *shardSet) leave(ctx context.Context) {
	for _, o := range s.owned {
		o.cancel(context.Cause(ctx))
	}
	s.waitAll(s.agent.cfg.JobWindDown)
	if s.member != nil {
		rctx, cancel := context.WithTimeout(context.Background(), runReleaseTimeout)
		_ = s.member.Release(rctx)
		cancel()
		s.agent.leading.leave()
		s.member = nil
	}
	s.stats.members.Store(0)
}
