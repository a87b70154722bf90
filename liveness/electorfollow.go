// A campaign's follower state: when it tries to take the lease (a poll, a notification
// that the lease is free) and how often.

package liveness

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/lease"
	"github.com/pg-liveness/pg_liveness_exporter/internal/notify"
)

// follow tries to take the lease, with jitter so that followers do not hit the row in
// step, and reports leader changes: every QuietPeriod while the Agent listens to the
// schema's events, every RetryPeriod while it does not (then only this process's own
// watcher, calling a holder dead, wakes it sooner: dead:here). A notification that the
// lease is free (released, its holder dead, or expired) wakes it for a try within
// freeSpread: the fleet's followers are all woken at once, and the first to try takes
// the lease, whose taken:<name> sends back to waiting those that have not tried yet. It
// returns the lease once taken, with the gate entered, or nil when ctx ends.
func (e *campaign) follow(ctx context.Context) *Lease {
	name := e.cfg.Lease
	freed, unsubscribeFree := e.leases.events.Subscribe(func(ev notify.Event) bool { return ev.Kind == notify.Free && ev.ID == name })
	defer unsubscribeFree()
	taken, unsubscribeTaken := e.leases.events.SubscribeNews(func(ev notify.Event) bool { return ev.Kind == notify.Taken && ev.ID == name })
	defer unsubscribeTaken()
	deadHere, unsubscribeDeadHere := e.leases.events.SubscribeNews(func(ev notify.Event) bool { return ev.Kind == notify.DeadHere })
	defer unsubscribeDeadHere()
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
			var le *Lease
			var failed bool
			if le, quiet, failed = e.try(ctx); le != nil {
				if e.cfg.slot != nil {
					e.cfg.slot.Store(slotLeading)
				}
				return le
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
		case <-deadHere:
			// This process's watcher called a holder dead while nothing here listens: the
			// one wake-up that could not come from anyone else, so the limiter, which
			// is there for floods of payloads, does not hold it back.
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

// wakeLimiter bounds the work notifications cause, whatever their rate: a token bucket
// of wakeBurst tokens that refills at one per wakeHoldoff. A burst of legitimate changes
// (a member dies, its leases are freed, a new one joins) is acted on at once; a flood
// costs one action per wakeHoldoff. Owned by one goroutine.
type wakeLimiter struct {
	tokens float64
	last   time.Time
}

// wakeBurst is how many wake-ups are acted on at once before the limiter holds off.
const wakeBurst = 4

// delay takes a token and returns how long to wait before acting: zero while the
// bucket has one, else until it refills.
func (l *wakeLimiter) delay(now time.Time) time.Duration {
	if l.last.IsZero() {
		l.tokens, l.last = wakeBurst, now
	}
	l.tokens = min(wakeBurst, l.tokens+float64(now.Sub(l.last))/float64(wakeHoldoff))
	l.last = now
	if l.tokens >= 1 {
		l.tokens--
		return 0
	}
	wait := time.Duration((1 - l.tokens) * float64(wakeHoldoff))
	l.tokens = 0
	l.last = now.Add(wait)
	return wait
}

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
	m := e.leases.life
	return m != nil && m.steadyFor() >= steadyAfter
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
func (e *campaign) try(ctx context.Context) (le *Lease, quiet, failed bool) {
	if !e.gate.enter() {
		return nil, false, false // the Agent stops: ctx ends with it
	}
	// The lease outlives the campaign's context: it is let go only once the job has
	// returned (lead).
	le, err := e.leases.acquire(ctx, context.WithoutCancel(ctx), e.cfg.Lease, e.cfg.TTL)
	if err == nil {
		return le, false, false
	}
	e.gate.leave()
	switch {
	case errors.Is(err, lease.ErrNotAlive):
		e.observe(ctx)
	case errors.Is(err, ErrLeaseHeld):
		// The refusal says who holds the lease: only a live holder other than this
		// instance notifies the end of its hold (free:<name>).
		var held *lease.HeldError
		quiet := errors.As(err, &held) && held.Live && held.Holder != uuid.Nil && held.Holder != e.leases.instanceID()
		e.observe(ctx)
		return nil, quiet, false
	case ctx.Err() == nil:
		e.leases.log.Debug("campaign: acquire failed; retrying", "lease", e.cfg.Lease, "err", err)
		return nil, false, true
	}
	return nil, false, false
}
