// The elector: ElectorConfig, and a campaign for one lease name, which follows until it
// takes the lease and leads until its job has returned, then follows again.

package liveness

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
)

// ElectorConfig configures a campaign for one lease name (Agent.Elect). Zero values take
// the defaults.
type ElectorConfig struct {
	// Lease is the name campaigned for; required.
	Lease string
	// TTL of the lease, renewed every TTL/4; 15 s if zero. A crashed leader's
	// lease does not wait for it: it is free once the leader is dead by the one verdict.
	TTL time.Duration
	// RetryPeriod is how often a follower tries to take the lease and reads who leads
	// while its Agent has no session listening to the schema's events (it is
	// reconnecting, or runs ModeHeartbeatTableOnly); 1 s if zero.
	// It then bounds how long a free lease stays untaken.
	RetryPeriod time.Duration
	// QuietPeriod replaces RetryPeriod while the events are listened to and the Agent's
	// alive lock has been held for 2 s, after a try the database refused because another
	// live instance leads (1 min if zero; never shorter than
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
	// self is the lease this process leads under (its Epoch, its Context, which ends
	// with it): fence the job's writes with self.Exec, self.BeginFunc or self.Fence. Its
	// Release steps down as returning does, and the callback must still return.
	OnStartedLeading func(ctx context.Context, self *Lease)
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

// validate checks the configuration; errors are *ConfigError.
func (c ElectorConfig) validate() error {
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
	if err := cfg.validate(); err != nil {
		return err
	}
	cfg.TTL = cmp.Or(cfg.TTL, defaults.ElectorTTL)
	cfg.RetryPeriod = cmp.Or(cfg.RetryPeriod, defaults.ElectorRetryPeriod)
	cfg.QuietPeriod = max(cmp.Or(cfg.QuietPeriod, defaults.ElectorQuietPeriod), cfg.RetryPeriod)
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
