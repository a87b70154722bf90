package liveness

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Defaults of ElectorConfig.
const (
	DefaultElectorTTL         = 15 * time.Second
	DefaultElectorRetryPeriod = time.Second
)

// ElectorConfig configures a campaign for one lease name. Zero values take the defaults.
type ElectorConfig struct {
	// Lease is the name campaigned for; required.
	Lease string
	// TTL of the lease, renewed every TTL/4; DefaultElectorTTL if zero. A crashed leader's
	// lease does not wait for it: it is free once the leader is dead by the one verdict.
	TTL time.Duration
	// RetryPeriod is how often a follower tries to take the lease and reads who leads;
	// DefaultElectorRetryPeriod if zero. It bounds how long a free lease stays untaken.
	RetryPeriod time.Duration
	// KeepLeaseOnStop leaves the lease to expire when the campaign's context ends,
	// instead of releasing it so that another process takes over at once.
	KeepLeaseOnStop bool

	// OnStartedLeading runs, in its own goroutine, each time this process becomes the
	// leader; required. Its context is cancelled when leadership ends (the lease was
	// lost, this instance could no longer prove life, or the campaign ended); it must
	// return soon after. The campaign waits for it before anyone else is let in by this
	// process, and fences nothing by itself: writes that must never come from two
	// leaders use <schema>.lease_is_held(Lease, epoch) with the epoch from Leader.
	OnStartedLeading func(ctx context.Context, self Leader)
	// OnStoppedLeading runs after OnStartedLeading has returned, with the reason:
	// a *LeaseLostError (errors.Is ErrLeaseLost), ErrLeaseReleased, or the campaign's
	// context cause. Optional.
	OnStoppedLeading func(reason error)
	// OnNewLeader runs when a follower sees a different leader (or none: a zero
	// InstanceID with Epoch 0). Optional.
	OnNewLeader func(Leader)
}

// Leader is who holds a lease, as the database says.
type Leader struct {
	Lease      string
	InstanceID uuid.UUID // uuid.Nil when the holder recorded none (older software)
	Host       string
	Epoch      int64 // the fencing token of this leadership
	TakenAt    time.Time
	ExpiresAt  time.Time
}

// ConfigError is a configuration value the library refuses. Field names the
// configuration field (for example "ElectorConfig.Lease"), never a command-line flag.
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string { return "liveness: " + e.Field + " " + e.Reason }

// Validate checks the configuration; errors are *ConfigError.
func (c ElectorConfig) Validate() error {
	switch {
	case c.Lease == "":
		return &ConfigError{"ElectorConfig.Lease", "must be set"}
	case c.OnStartedLeading == nil:
		return &ConfigError{"ElectorConfig.OnStartedLeading", "must be set"}
	case c.TTL < 0:
		return &ConfigError{"ElectorConfig.TTL", fmt.Sprintf("(%s) must not be negative", c.TTL)}
	case c.TTL != 0 && c.TTL < MinLeaseTTL:
		return &ConfigError{"ElectorConfig.TTL", fmt.Sprintf("(%s) must be at least %s", c.TTL, MinLeaseTTL)}
	case c.RetryPeriod < 0:
		return &ConfigError{"ElectorConfig.RetryPeriod", fmt.Sprintf("(%s) must not be negative", c.RetryPeriod)}
	}
	return nil
}

// Elect campaigns for cfg.Lease until ctx ends, leading whenever it holds the lease:
// a follower tries every RetryPeriod, a leader runs OnStartedLeading until leadership
// ends, then follows again. A process leads only while its instance is alive by the
// one verdict (its Leases must come from an Agent, or carry LeasesConfig.InstanceID and
// be used while the instance beats). It returns nil when ctx ends, after the last
// OnStoppedLeading, or a *ConfigError.
func (l *Leases) Elect(ctx context.Context, cfg ElectorConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg.TTL = cmp.Or(cfg.TTL, DefaultElectorTTL)
	cfg.RetryPeriod = cmp.Or(cfg.RetryPeriod, DefaultElectorRetryPeriod)
	e := &elector{leases: l, cfg: cfg, leaderSQL: l.stmts.leader}
	for {
		lease := e.follow(ctx)
		if lease == nil {
			return nil // ctx ended
		}
		e.lead(ctx, lease)
		if ctx.Err() != nil {
			return nil
		}
	}
}

type elector struct {
	leases    *Leases
	cfg       ElectorConfig
	leaderSQL string
	seen      Leader // the last leader reported to OnNewLeader
}

// follow tries to take the lease every RetryPeriod (with jitter, so that followers do
// not hit the row in step) and reports leader changes. It returns the lease once taken,
// or nil when ctx ends.
func (e *elector) follow(ctx context.Context) *Lease {
	for {
		lease, err := e.leases.TryAcquire(ctx, e.cfg.Lease, e.cfg.TTL)
		switch {
		case lease != nil:
			return lease
		case err != nil && ctx.Err() == nil:
			e.leases.log.Debug("campaign: acquire failed; retrying", "lease", e.cfg.Lease, "err", err)
		case err == nil:
			e.observe(ctx)
		}
		wait := e.cfg.RetryPeriod/2 + rand.N(e.cfg.RetryPeriod/2+1)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// lead runs OnStartedLeading under the lease until leadership ends, then releases the
// lease (unless the campaign ended with KeepLeaseOnStop) and reports why it stopped.
func (e *elector) lead(ctx context.Context, lease *Lease) {
	self := Leader{Lease: lease.Name, InstanceID: lease.HolderInstanceID, Host: e.leases.host,
		Epoch: lease.Epoch, TakenAt: lease.TakenAt, ExpiresAt: lease.ExpiresAt()}
	e.leases.log.Info("started leading", "lease", lease.Name, "epoch", lease.Epoch)
	e.report(self)
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.cfg.OnStartedLeading(lease.Context(), self)
	}()
	select {
	case <-lease.Done():
	case <-ctx.Done():
	case <-done: // the work returned on its own: step down and campaign again
	}
	keep := ctx.Err() != nil && e.cfg.KeepLeaseOnStop
	if !keep {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runReleaseTimeout)
		if err := lease.Release(rctx); err != nil {
			e.leases.log.Warn("campaign: release failed; the lease will expire", "lease", lease.Name, "err", err)
		}
		cancel()
	}
	<-done
	reason := lease.Err()
	if (keep && reason == nil) || (ctx.Err() != nil && errors.Is(reason, ErrLeaseReleased)) {
		// The campaign ended. Its context's end reaches the lease's context a moment
		// after its own Done, so the release above may have ended the lease first.
		reason = context.Cause(ctx)
	}
	e.leases.log.Info("stopped leading", "lease", lease.Name, "epoch", lease.Epoch, "reason", reason)
	if e.cfg.OnStoppedLeading != nil {
		e.cfg.OnStoppedLeading(reason)
	}
	// A leader that just stepped down lets the others in before trying again.
	select {
	case <-ctx.Done():
	case <-time.After(e.cfg.RetryPeriod):
	}
}

// observe reads who leads and reports a change.
func (e *elector) observe(ctx context.Context) {
	if e.cfg.OnNewLeader == nil {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, e.cfg.RetryPeriod)
	defer cancel()
	leader, err := readLeader(qctx, e.leases.pool, e.leaderSQL, e.cfg.Lease)
	if err != nil && !errors.Is(err, ErrNoLeader) {
		if ctx.Err() == nil {
			e.leases.log.Debug("campaign: cannot read the leader", "lease", e.cfg.Lease, "err", err)
		}
		return
	}
	e.report(leader)
}

func (e *elector) report(l Leader) {
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
	var (
		l           = Leader{Lease: name}
		id          *uuid.UUID
		held, alive bool
	)
	found, err := pgx.CollectExactlyOneRow(rows, func(row pgx.CollectableRow) (bool, error) {
		return true, row.Scan(&id, &l.Host, &l.Epoch, &l.TakenAt, &l.ExpiresAt, &held, &alive)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Leader{Lease: name}, ErrNoLeader
	case err != nil:
		return Leader{Lease: name}, fmt.Errorf("liveness: read leader of %q: %w", name, err)
	case !found || !held || !alive:
		return Leader{Lease: name}, ErrNoLeader
	}
	if id != nil {
		l.InstanceID = *id
	}
	return l, nil
}
