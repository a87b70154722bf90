package liveness

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// Defaults of ElectorConfig.
const (
	DefaultElectorTTL         = 15 * time.Second
	DefaultElectorRetryPeriod = time.Second
	DefaultElectorQuietPeriod = time.Minute
)

// ElectorConfig configures a campaign for one lease name (Agent.Elect). Zero values take
// the defaults.
type ElectorConfig struct {
	// Lease is the name campaigned for; required.
	Lease string
	// TTL of the lease, renewed every TTL/4; DefaultElectorTTL if zero. A crashed leader's
	// lease does not wait for it: it is free once the leader is dead by the one verdict.
	TTL time.Duration
	// RetryPeriod is how often a follower tries to take the lease and reads who leads
	// while its Agent has no session listening to the schema's events (it is
	// reconnecting, or runs ModeHeartbeatTableOnly); DefaultElectorRetryPeriod if zero.
	// It then bounds how long a free lease stays untaken.
	RetryPeriod time.Duration
	// QuietPeriod replaces RetryPeriod while the events are listened to and the Agent's
	// alive lock has been held for 2 s, after a try the database refused because another
	// live instance leads (DefaultElectorQuietPeriod if zero; never shorter than
	// RetryPeriod; in a fleet of more than 300 agents, as the Agent's sentry reads its
	// size, the fleet's size times 200 ms, at most 30 min, so that the fleet's followers
	// of a lease poll it about five times a second in all, whatever its size). Everything
	// that frees a lease is notified then (a release, a holder dead by the verdict, an
	// expiry seen by the fleet's watcher), and a notification wakes the followers at
	// once, and a session that listens again wakes them all for a try, so their polls
	// only cover a notification lost while listening: a fleet's followers cost the
	// database O(1) each, rarely, instead of a try a second each.
	QuietPeriod time.Duration

	// OnStartedLeading runs, in its own goroutine, each time this process becomes the
	// leader; required. The lease is released only after it has returned, and until then
	// it is renewed for as long as this instance can prove life. Its context is cancelled
	// when leadership is to end:
	//
	//   - The campaign ends (its context, or the Agent's Run's): the lease stays renewed
	//     while the callback winds down, for at most AgentConfig.JobWindDown; past that,
	//     the lease is left to expire and Elect returns ErrWindDownExceeded.
	//   - The lease is lost (a *LeaseLostError): the callback must stop at once; the
	//     package documentation says how long it has before another process may start.
	//
	// Returning on its own steps down: the lease is released and the campaign goes on.
	// Fence the job's writes with self.Exec or self.BeginFunc.
	OnStartedLeading func(ctx context.Context, self Leadership)
	// OnStoppedLeading runs after OnStartedLeading has returned and the lease was let go,
	// with the reason: a *LeaseLostError (errors.Is ErrLeaseLost), ErrLeaseReleased (the
	// callback returned on its own), or the cause of the context that ended the campaign.
	// Optional.
	OnStoppedLeading func(reason error)
	// OnNewLeader runs, in the campaign's goroutine, each time this process sees a change
	// of who leads: a follower seeing another process lead, this process itself when it
	// starts leading (before OnStartedLeading), and nobody (a Leader with a zero
	// InstanceID and Epoch 0) when it sees no leader: after its own leadership ended,
	// unless another process has already taken over, and when a look finds the lease
	// free or its holder dead. Every process thus sees the leaders in the same order,
	// itself included. It must not block. Optional.
	OnNewLeader func(Leader)

	// slot, when set, is shared by campaigns of one process of which at most one may
	// lead or try at a time (the watcher's two): a campaign tries only after taking it.
	slot *campaignSlot
}

// Leader is who holds a lease, as the database says.
type Leader struct {
	Lease      string
	InstanceID uuid.UUID // uuid.Nil when the holder recorded none (older software, or none leads)
	Host       string
	Epoch      int64 // the fencing token of this leadership; 0 when none leads
	TakenAt    time.Time
	ExpiresAt  time.Time
}

// Leadership is this process's leadership of a lease, given to OnStartedLeading: who it
// is, and the fence for the job's writes.
type Leadership struct {
	Leader
	lease *Lease
}

// Fence makes the writes that follow it in tx count only while this leadership holds
// its lease, and refuses tx's COMMIT past the deadline as of the fence: see Lease.Fence.
// Exec, BeginTx and BeginFunc fence a transaction of their own, with a
// fresh deadline at COMMIT. During a wind-down (the campaign ended, the lease still
// renewed) it still succeeds; after a loss it fails with an error that is errors.Is
// ErrLeaseLost.
func (l Leadership) Fence(ctx context.Context, tx pgx.Tx) error {
	if l.lease == nil {
		return fmt.Errorf("%w: a Leadership that no campaign gave out holds no lease", ErrLeaseLost)
	}
	return l.lease.Fence(ctx, tx)
}

// FenceDeadline is Lease.FenceDeadline of the leadership's lease: the moment, on the
// database server's clock, past which its fenced writes must be refused. The zero time
// (which refuses every write) for a Leadership no campaign gave out.
func (l Leadership) FenceDeadline() time.Time {
	if l.lease == nil {
		return time.Time{}
	}
	return l.lease.FenceDeadline()
}

// ConfigError is a configuration value the library refuses. Field names the config
// field ("AgentConfig.Timing.StaleThreshold", "ReaderConfig.Whizbang.Prefix"), never a
// flag: a binary maps fields to its flags.
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string { return "liveness: " + e.Field + " " + e.Reason }

// Validate checks the configuration; errors are *ConfigError.
func (c ElectorConfig) Validate() error {
	switch {
	case c.Lease == "":
		return &ConfigError{Field: "ElectorConfig.Lease", Reason: "must be set"}
	case c.OnStartedLeading == nil:
		return &ConfigError{Field: "ElectorConfig.OnStartedLeading", Reason: "must be set"}
	case c.TTL < 0:
		return &ConfigError{Field: "ElectorConfig.TTL", Reason: fmt.Sprintf("(%s) must not be negative", c.TTL)}
	case c.TTL != 0 && c.TTL < MinLeaseTTL:
		return &ConfigError{Field: "ElectorConfig.TTL", Reason: fmt.Sprintf("(%s) must be at least %s", c.TTL, MinLeaseTTL)}
	case c.RetryPeriod < 0:
		return &ConfigError{Field: "ElectorConfig.RetryPeriod", Reason: fmt.Sprintf("(%s) must not be negative", c.RetryPeriod)}
	case c.QuietPeriod < 0:
		return &ConfigError{Field: "ElectorConfig.QuietPeriod", Reason: fmt.Sprintf("(%s) must not be negative", c.QuietPeriod)}
	}
	return nil
}

// ErrWindDownExceeded is returned by Agent.Elect when OnStartedLeading had not returned
// AgentConfig.JobWindDown after its context was cancelled because the campaign ended.
// Its lease was left to expire, not released: another process may take it once it
// expires, and the callback, still running, may then overlap with the next leader.
// OnStoppedLeading is not called for that leadership.
var ErrWindDownExceeded = errors.New("liveness: OnStartedLeading did not return within AgentConfig.JobWindDown")

// leadGate lets a campaign hold a lease only while its Agent runs: enter is false once
// the Agent stops, and the Agent waits, before it stops proving life, until every
// campaign that entered has left (let go of its lease).
type leadGate interface {
	enter() bool
	leave()
}

// openGate is the gate of a campaign without an Agent (the package's tests).
type openGate struct{}

func (openGate) enter() bool { return true }
func (openGate) leave()      {}

// elect campaigns for cfg.Lease until ctx ends, leading whenever it holds the lease: a
// follower tries every RetryPeriod, a leader runs OnStartedLeading until it returns,
// then follows again. It returns nil when ctx ends, once its last leadership has let go
// of its lease and OnStoppedLeading has run; ErrWindDownExceeded (wrapped) when the
// callback outlived windDown; or a *ConfigError.
func (l *Leases) elect(ctx context.Context, cfg ElectorConfig, windDown time.Duration, gate leadGate) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg.TTL = cmp.Or(cfg.TTL, DefaultElectorTTL)
	cfg.RetryPeriod = cmp.Or(cfg.RetryPeriod, DefaultElectorRetryPeriod)
	cfg.QuietPeriod = max(cmp.Or(cfg.QuietPeriod, DefaultElectorQuietPeriod), cfg.RetryPeriod)
	e := &campaign{leases: l, cfg: cfg, windDown: windDown, gate: gate}
	for {
		lease := e.follow(ctx)
		if lease == nil {
			return nil // ctx ended
		}
		err := e.lead(ctx, lease)
		if e.cfg.slot != nil {
			e.cfg.slot.Store(slotFree)
		}
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// campaignSlot is shared by campaigns of which at most one may try or lead at a time.
type campaignSlot = atomic.Int32

const (
	slotFree int32 = iota
	slotTrying
	slotLeading
	// slotRecheck is how soon a campaign looks at the slot again while the other one
	// tries.
	slotRecheck = 50 * time.Millisecond
)

// campaign is one call of elect. Its state is owned by that call's goroutine.
type campaign struct {
	leases   *Leases
	cfg      ElectorConfig
	windDown time.Duration
	gate     leadGate
	seen     Leader // the last leader reported to OnNewLeader
}

// follow tries to take the lease, with jitter so that followers do not hit the row in
// step, and reports leader changes: every QuietPeriod while the Agent listens to the
// schema's events, every RetryPeriod while it does not (the poll is then all there is).
// A notification that the lease is free (released, its holder dead, or expired) wakes it
// for a try within freeSpread: the fleet's followers are all woken at once, and the first
// to try takes the lease, whose taken:<name> sends back to waiting those that have not
// tried yet. It returns the lease once taken, with the gate entered, or nil when ctx ends.
func (e *campaign) follow(ctx context.Context) *Lease {
	lease := e.cfg.Lease
	freed, unsubscribeFree := e.leases.events.subscribe(func(ev event) bool { return ev.Kind == eventFree && ev.ID == lease })
	defer unsubscribeFree()
	taken, unsubscribeTaken := e.leases.events.subscribe(func(ev event) bool { return ev.Kind == eventTaken && ev.ID == lease })
	defer unsubscribeTaken()
	try, quiet := true, false
	failures := 0 // tries in a row that failed (not refused): the server is down or overloaded
	// Wake-ups are hints anyone with the channel's name can send: a flood of them costs
	// one try per wakeHoldoff (after a burst of wakeBurst), whatever their rate; those
	// that come sooner are folded into one try when the limiter allows it.
	var limit wakeLimiter
	var held <-chan time.Time // the folded wake-up's turn
	for ctx.Err() == nil {
		// A try refused because this instance cannot prove life yet (an agent that has
		// just started) is made again as soon as it can, not a RetryPeriod later.
		var lifeChanged <-chan struct{}
		if e.leases.life != nil && !e.leases.life.Alive() {
			lifeChanged = e.leases.life.Changed()
			if e.leases.life.Alive() {
				lifeChanged = nil
			}
		}
		recheck := false
		switch {
		case !try:
		case e.cfg.slot == nil || e.cfg.slot.CompareAndSwap(slotFree, slotTrying):
			var lease *Lease
			var failed bool
			if lease, quiet, failed = e.try(ctx); lease != nil {
				if e.cfg.slot != nil {
					e.cfg.slot.Store(slotLeading)
				}
				return lease
			}
			if e.cfg.slot != nil {
				e.cfg.slot.Store(slotFree)
			}
			if ctx.Err() != nil {
				return nil
			}
			if failed {
				failures = min(failures+1, 11)
			} else {
				failures = 0
			}
		case e.cfg.slot.Load() == slotTrying:
			// The other campaign is only trying: its answer comes within a round trip.
			recheck = true
		}
		period := e.cfg.RetryPeriod
		switch {
		case e.leases.events.Listening() && quiet && e.steady():
			period = max(e.cfg.QuietPeriod, fleetQuietPeriod(e.leases.fleetSize()))
		case failures > 0:
			// A server that does not answer, or answers late, gets fewer tries, not more:
			// a fleet retrying every second would keep an overloaded server overloaded.
			period = min(e.cfg.RetryPeriod<<(failures-1), e.cfg.QuietPeriod)
		}
		wait := period/2 + rand.N(period/2+1)
		if recheck {
			wait = slotRecheck
		}
		try = true
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		case <-freed:
			if held != nil {
				try = false // folded into the try already due
				continue
			}
			if d := limit.delay(time.Now()); d > 0 {
				held, try = time.After(d), false
				continue
			}
			try = e.awaitTurn(ctx, taken)
		case <-held:
			held = nil
			try = e.awaitTurn(ctx, taken)
		case <-taken:
			// Someone else took it: nothing to try, but who leads changed.
			try = false
			if held == nil && limit.delay(time.Now()) == 0 {
				e.observe(ctx)
			}
		case <-lifeChanged:
		}
	}
	return nil
}

// wakeHoldoff is the time in which a follower's wake-up limiter (wakeLimiter) regains
// one try (or look at who leads): a flood of free:<name> or taken:<name> payloads costs
// each follower one statement per wakeHoldoff after a short burst, not one per payload.
const wakeHoldoff = time.Second

// Followers' quiet polls only cover a notification lost while listening, so a fleet's
// followers of one lease share a pace: each polls at most once per fleet size times
// quietSpacing (and never rarer than maxQuietPeriod), so that the fleet's polls of a
// lease come about once per quietSpacing whatever its size, instead of growing with it.
const (
	quietSpacing   = 200 * time.Millisecond
	maxQuietPeriod = 30 * time.Minute
)

// fleetQuietPeriod is the quiet period a fleet of n (0: unknown) calls for.
func fleetQuietPeriod(n int) time.Duration {
	return min(time.Duration(n)*quietSpacing, maxQuietPeriod)
}

// steadyAfter is how long an Agent's alive lock must have been held before its followers
// poll only every QuietPeriod: a refused try before that may be the fleet's verdict on
// this very instance (its lock just re-claimed, after a server restart, say), which no
// notification will tell the end of.
const steadyAfter = 2 * time.Second

// steady reports whether a refused try means that someone else holds the lease: the
// Agent's alive lock has been held for steadyAfter.
func (e *campaign) steady() bool {
	m, ok := e.leases.life.(interface{ steadyFor() time.Duration })
	return ok && m.steadyFor() >= steadyAfter
}

// awaitTurn waits a random part of freeSpread after a wake-up that the lease is free,
// and reports whether to try it: not when it was taken meanwhile (then who leads is
// read instead).
func (e *campaign) awaitTurn(ctx context.Context, taken <-chan struct{}) bool {
	select {
	case <-taken: // from before this wake-up: not news
	default:
	}
	spread := min(e.cfg.RetryPeriod/4, freeSpread)
	select {
	case <-ctx.Done():
		return false
	case <-time.After(rand.N(spread + 1)):
		return true
	case <-taken:
		e.observe(ctx)
		return false
	}
}

// freeSpread is how long, at most, a follower woken by free:<name> waits before it tries:
// spread over it, a fleet's followers try one after another rather than all at once, and
// most see taken:<name> before their turn.
const freeSpread = 250 * time.Millisecond

// try takes the lease once, with the gate entered, or reports who leads and returns nil.
// quiet is true only when the try was refused because another instance, alive by the
// verdict, leads: its end is notified (free:<name>), so the next try may wait for
// QuietPeriod. Any other refusal (the row is still this instance's own, from a leadership
// whose release failed; the database does not yet judge this instance alive, its lock
// just re-claimed) or a failure (a pool's dead connections after a server restart) ends
// with nothing notified, and the next try comes after RetryPeriod.
func (e *campaign) try(ctx context.Context) (lease *Lease, quiet, failed bool) {
	if !e.gate.enter() {
		return nil, false, false // the Agent stops: ctx ends with it
	}
	// The lease outlives the campaign's context: it is let go only once the job has
	// returned (lead).
	lease, err := e.leases.acquire(ctx, context.WithoutCancel(ctx), e.cfg.Lease, e.cfg.TTL)
	if err == nil {
		return lease, false, false
	}
	e.gate.leave()
	switch {
	case errors.Is(err, errNotAlive):
		e.observe(ctx)
	case errors.Is(err, ErrLeaseHeld):
		// The refusal says who holds the lease: only a live holder other than this
		// instance notifies the end of its hold (free:<name>).
		var held *leaseHeldError
		quiet := errors.As(err, &held) && held.live && held.holder != uuid.Nil && held.holder != e.leases.instanceID()
		e.observe(ctx)
		return nil, quiet, false
	case ctx.Err() == nil:
		e.leases.log.Debug("campaign: acquire failed; retrying", "lease", e.cfg.Lease, "err", err)
		return nil, false, true
	}
	return nil, false, false
}

// lead runs OnStartedLeading under the lease. When the callback returns, the lease is
// released and OnStoppedLeading runs; when the campaign ends first, the callback's
// context is cancelled while the lease stays renewed, for at most windDown, after which
// the lease is left to expire and lead returns ErrWindDownExceeded. Either way the gate
// is left once the lease is let go.
func (e *campaign) lead(ctx context.Context, lease *Lease) error {
	self := Leadership{Leader: Leader{Lease: lease.Name, InstanceID: e.leases.instanceID(), Host: e.leases.host,
		Epoch: lease.Epoch, TakenAt: lease.TakenAt, ExpiresAt: lease.ExpiresAt()}, lease: lease}
	if ctx.Err() != nil { // the campaign ended as the lease was taken: nothing ran under it
		_ = e.release(ctx, lease)
		e.gate.leave()
		return nil
	}
	e.leases.log.Info("started leading", "lease", lease.Name, "epoch", lease.Epoch)
	e.report(self.Leader)
	// The job's context ends with the lease (a loss) or with the campaign; the lease's
	// own context does not end with the campaign, so renewals go on while the job winds
	// down.
	job, cancelJob := context.WithCancelCause(lease.ctx)
	defer cancelJob(nil)
	stopJob := context.AfterFunc(ctx, func() { cancelJob(context.Cause(ctx)) })
	defer stopJob()
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.cfg.OnStartedLeading(job, self)
	}()

	over, windDown := ctx.Done(), (<-chan time.Time)(nil)
	for returned := false; !returned; {
		select {
		case <-done:
			returned = true
		case <-over:
			over = nil
			t := time.NewTimer(e.windDown)
			defer t.Stop()
			windDown = t.C
		case <-windDown:
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runReleaseTimeout)
			err := lease.leaveToExpire(rctx)
			cancel()
			e.gate.leave()
			e.leases.log.Error("the job did not return within its wind-down: its lease is left to expire, and "+
				"another process may take it then while this job still runs", "lease", lease.Name,
				"epoch", lease.Epoch, "wind_down", e.windDown, "expires_at", lease.ExpiresAt(), "err", err)
			return fmt.Errorf("%w (%s): lease %q (epoch %d) left to expire at %s", ErrWindDownExceeded, e.windDown,
				lease.Name, lease.Epoch, lease.ExpiresAt().Format(time.RFC3339Nano))
		}
	}
	reason := lease.Err()
	switch {
	case errors.Is(reason, ErrLeaseLost):
	case ctx.Err() != nil:
		reason = context.Cause(ctx)
	default:
		reason = ErrLeaseReleased
	}
	released := e.release(ctx, lease)
	e.gate.leave()
	e.leases.log.Info("stopped leading", "lease", lease.Name, "epoch", lease.Epoch, "reason", reason)
	if e.cfg.OnStoppedLeading != nil {
		e.cfg.OnStoppedLeading(reason)
	}
	if !released {
		e.retryRelease(ctx, lease)
	}
	e.observeAfter(ctx, self.Leader)
	// A leader that just stepped down lets the others in before trying again.
	select {
	case <-ctx.Done():
	case <-time.After(e.cfg.RetryPeriod):
	}
	return nil
}

// release deletes the lease's row, with its own deadline even when the campaign is over,
// and reports whether it did.
func (e *campaign) release(ctx context.Context, lease *Lease) bool {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runReleaseTimeout)
	defer cancel()
	if err := lease.Release(rctx); err != nil {
		if ctx.Err() != nil {
			e.leases.log.Warn("campaign: release failed; the lease will expire", "lease", lease.Name, "err", err)
		} else {
			e.leases.log.Info("campaign: release failed; retrying until it expires", "lease", lease.Name, "err", err)
		}
		return false
	}
	return true
}

// releaseRetry is the pause between a failed release and the next attempt.
const releaseRetry = 500 * time.Millisecond

// retryRelease sends the release again, until it succeeds, the row has surely expired
// (a ttl from now) or the campaign ends. A lease lost while the database did not answer
// (a restart, a failover, a partition) is one whose first release failed; left alone its
// row would stand until it expired, a ttl after its last renewal, though its job has
// ended: and nobody may take a lease whose holder instance is alive, which this one is
// again as soon as the database answers. The job has returned before this runs, so the
// row's going lets the next leader in without two jobs at once.
func (e *campaign) retryRelease(ctx context.Context, lease *Lease) {
	expired := time.Now().Add(lease.ttl)
	for time.Now().Before(expired) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(releaseRetry):
		}
		rctx, cancel := context.WithTimeout(ctx, min(runReleaseTimeout, time.Until(expired)))
		err := lease.deleteRow(rctx)
		cancel()
		if err == nil {
			e.leases.log.Info("campaign: released the lease after all", "lease", lease.Name, "epoch", lease.Epoch)
			return
		}
		e.leases.log.Debug("campaign: release failed; retrying", "lease", lease.Name, "err", err)
	}
	e.leases.log.Warn("campaign: release failed until the lease expired", "lease", lease.Name, "epoch", lease.Epoch)
}

// observe reads who leads and reports a change, when OnNewLeader is set.
func (e *campaign) observe(ctx context.Context) {
	if e.cfg.OnNewLeader != nil {
		e.readLeader(ctx)
	}
}

// readLeader reads who leads, reports a change, and returns the leader (the zero Leader,
// but its name, when nobody leads); ok is false when it could not be read.
func (e *campaign) readLeader(ctx context.Context) (leader Leader, ok bool) {
	qctx, cancel := context.WithTimeout(ctx, e.cfg.RetryPeriod)
	defer cancel()
	leader, err := readLeader(qctx, e.leases.pool, e.leases.stmts.leader, e.cfg.Lease)
	if err != nil && !errors.Is(err, ErrNoLeader) {
		if ctx.Err() == nil {
			e.leases.log.Debug("campaign: cannot read the leader", "lease", e.cfg.Lease, "err", err)
		}
		return leader, false
	}
	e.report(leader)
	return leader, true
}

// observeAfter reports who leads once this process's leadership self has ended: the
// next leader if the lease has one already, otherwise nobody.
func (e *campaign) observeAfter(ctx context.Context, self Leader) {
	if e.cfg.OnNewLeader == nil {
		return
	}
	none := Leader{Lease: self.Lease}
	if ctx.Err() != nil {
		e.report(none)
		return
	}
	qctx, cancel := context.WithTimeout(ctx, e.cfg.RetryPeriod)
	defer cancel()
	leader, err := readLeader(qctx, e.leases.pool, e.leases.stmts.leader, e.cfg.Lease)
	if err != nil || leader.Epoch == self.Epoch {
		leader = none // this process knows it no longer leads, whatever the row still says
	}
	e.report(leader)
}

func (e *campaign) report(l Leader) {
	if e.cfg.OnNewLeader == nil || (l.Epoch == e.seen.Epoch && l.InstanceID == e.seen.InstanceID) {
		return
	}
	e.seen = l
	e.cfg.OnNewLeader(l)
}

// ErrNoLeader is returned by Reader.Leader when nobody holds the lease: no row, an
// expired one, or a holder that is dead by the one verdict.
var ErrNoLeader = errors.New("liveness: no leader")

// readLeader returns the lease's live holder, or ErrNoLeader with the zero Leader (but
// its name).
func readLeader(ctx context.Context, db Querier, sql, name string) (Leader, error) {
	rows, err := db.Query(ctx, sql, name)
	if err != nil {
		return Leader{Lease: name}, fmt.Errorf("liveness: read leader of %q: %w", name, err)
	}
	row, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[store.LeaderRow])
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Leader{Lease: name}, ErrNoLeader
	case err != nil:
		return Leader{Lease: name}, fmt.Errorf("liveness: read leader of %q: %w", name, err)
	case !row.Held || !row.HolderAlive:
		return Leader{Lease: name}, ErrNoLeader
	}
	l := Leader{Lease: name, Host: row.HolderHost, Epoch: row.Epoch, TakenAt: row.TakenAt, ExpiresAt: row.ExpiresAt}
	if row.HolderInstanceID != nil {
		l.InstanceID = *row.HolderInstanceID
	}
	return l, nil
}
