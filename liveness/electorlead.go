// A campaign's leader state: the job runs under the lease, which is let go only once the
// job has returned, or left to expire when it outlives its wind-down.

package liveness

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/lease"
)

// lead runs OnStartedLeading under the lease. When the callback returns, the lease is
// released and OnStoppedLeading runs; when the campaign ends first, the callback's
// context is cancelled while the lease stays renewed, for at most windDown, after which
// the lease is left to expire and lead returns ErrWindDownExceeded. Either way the gate
// is left once the lease is let go.
func (e *campaign) lead(ctx context.Context, le *Lease) error {
	self := Leader{Lease: le.Name, InstanceID: e.leases.instanceID(), Host: e.leases.in.Host(),
		Epoch: le.Epoch, TakenAt: le.TakenAt, ExpiresAt: le.ExpiresAt()}
	if ctx.Err() != nil { // the campaign ended as the lease was taken: nothing ran under it
		_ = e.release(ctx, le)
		e.gate.leave()
		return nil
	}
	e.leases.log.Info("started leading", "lease", le.Name, "epoch", le.Epoch)
	e.report(self)
	// The job's context ends with the lease (a loss) or with the campaign; the lease's
	// own context does not end with the campaign, so renewals go on while the job winds
	// down.
	job, cancelJob := context.WithCancelCause(le.Context())
	defer cancelJob(nil)
	stopJob := context.AfterFunc(ctx, func() { cancelJob(context.Cause(ctx)) })
	defer stopJob()
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.cfg.OnStartedLeading(job, le)
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
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lease.ReleaseTimeout)
			err := le.in.LeaveToExpire(rctx)
			cancel()
			e.gate.leave()
			e.leases.log.Error("the job did not return within its wind-down: its lease is left to expire, and "+
				"another process may take it then while this job still runs", "lease", le.Name,
				"epoch", le.Epoch, "wind_down", e.windDown, "expires_at", le.ExpiresAt(), "err", err)
			return fmt.Errorf("%w (%s): lease %q (epoch %d) left to expire at %s", ErrWindDownExceeded, e.windDown,
				le.Name, le.Epoch, le.ExpiresAt().Format(time.RFC3339Nano))
		}
	}
	reason := le.Err()
	switch {
	case errors.Is(reason, ErrLeaseLost):
	case ctx.Err() != nil:
		reason = context.Cause(ctx)
	default:
		reason = ErrLeaseReleased
	}
	released := e.release(ctx, le)
	e.gate.leave()
	e.leases.log.Info("stopped leading", "lease", le.Name, "epoch", le.Epoch, "reason", reason)
	if e.cfg.OnStoppedLeading != nil {
		e.cfg.OnStoppedLeading(reason)
	}
	if !released {
		e.retryRelease(ctx, le)
	}
	e.observeAfter(ctx, self)
	// A leader that just stepped down lets the others in before trying again.
	select {
	case <-ctx.Done():
	case <-time.After(e.cfg.RetryPeriod):
	}
	return nil
}

// release deletes the lease's row, with its own deadline even when the campaign is over,
// and reports whether it did.
func (e *campaign) release(ctx context.Context, le *Lease) bool {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lease.ReleaseTimeout)
	defer cancel()
	if err := le.Release(rctx); err != nil {
		if ctx.Err() != nil {
			e.leases.log.Warn("campaign: release failed; the lease will expire", "lease", le.Name, "err", err)
		} else {
			e.leases.log.Info("campaign: release failed; retrying until it expires", "lease", le.Name, "err", err)
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
func (e *campaign) retryRelease(ctx context.Context, le *Lease) {
	expired := time.Now().Add(le.in.TTL())
	for time.Now().Before(expired) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(releaseRetry):
		}
		rctx, cancel := context.WithTimeout(ctx, min(lease.ReleaseTimeout, time.Until(expired)))
		err := le.in.DeleteRow(rctx)
		cancel()
		if err == nil {
			e.leases.log.Info("campaign: released the lease after all", "lease", le.Name, "epoch", le.Epoch)
			return
		}
		e.leases.log.Debug("campaign: release failed; retrying", "lease", le.Name, "err", err)
	}
	e.leases.log.Warn("campaign: release failed until the lease expired", "lease", le.Name, "epoch", le.Epoch)
}
