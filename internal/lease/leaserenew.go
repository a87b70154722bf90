// A held lease: renewed every ttl/4 within its trust window until it is released, lost
// (a Loss) or left to expire, and how it ends.

package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
)

// minRenewAttempt is the shortest a renewal attempt may wait for its answer: slow links
// answer slowly, and a short ttl leaves no room for retries anyway.
const minRenewAttempt = 2 * time.Second

// errLeftToExpire is the cause of a lease's context when its holder stopped renewing it
// without deleting its row: the lease is free once it expires.
var errLeftToExpire = errors.New("liveness: lease left to expire")

// Why a lease was lost: Loss.Reason (the library's LeaseLostError.Reason, which says
// what each means), and the keys of Stats.Lost.
const (
	ReasonExpired = "expired" // the local trust window ran out without a renewal
	ReasonTaken   = "taken"   // a renewal found another holder or epoch, or no row
	ReasonError   = "error"   // a renewal failed and the lease could not be confirmed
	// ReasonNotAlive: the holder's instance could no longer prove that it is alive (its
	// alive lock vanished without a heartbeat in time, or its heartbeat aged), so it
	// stepped down before the fleet could call it dead and take the lease over.
	ReasonNotAlive = "not_alive"
)

// Loss is why a lease was lost, as this package finds it; users see it as
// Errors.LostLease made it (the library's *LeaseLostError, of the same fields).
type Loss struct {
	Name   string
	Epoch  int64
	Reason string
	Err    error
}

// Error names the lease, the epoch, the reason and the error behind it, if any.
func (e *Loss) Error() string {
	msg := fmt.Sprintf("liveness: lease %q (epoch %d) lost: %s", e.Name, e.Epoch, e.Reason)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap reaches Err.
func (e *Loss) Unwrap() error { return e.Err }

// lose ends the lease for reason, err behind it.
func (le *Lease) lose(reason string, err error) {
	le.end(&Loss{Name: le.Name, Epoch: le.Epoch, Reason: reason, Err: err})
}

// Loss is why the lease was lost; nil while it is held, and when it ended otherwise
// (released, left to expire, its parent context ended).
func (le *Lease) Loss() *Loss {
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.loss
}

// TTL is the lease's ttl.
func (le *Lease) TTL() time.Duration { return le.ttl }

// Context is cancelled when the lease is lost, released, or its parent context ends;
// its cause is then Err's.
func (le *Lease) Context() context.Context { return le.ctx }

// Err is nil while the lease is held. Afterwards it is what Errors.LostLease made of its
// Loss when the lease was lost, Errors.Released after Release, or the parent context's
// cause.
func (le *Lease) Err() error {
	if le.ctx.Err() == nil {
		return nil
	}
	return context.Cause(le.ctx)
}

// ExpiresAt is the database time the lease expires at, as of the last successful
// renewal.
func (le *Lease) ExpiresAt() time.Time {
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.expiresAt
}

// Release stops the renewals, waits for the renewer to exit, cancels the lease's context
// and deletes the row if it still belongs to this acquisition (name, holder and epoch), so
// a late Release never deletes a newer holder's lease. It is safe to call more than once
// and after a loss; later calls return the first call's error.
func (le *Lease) Release(ctx context.Context) error {
	le.releaseOnce.Do(func() {
		le.end(le.leases.errs.Released)
		<-le.renewerDone
		err := le.DeleteRow(ctx)
		le.mu.Lock()
		le.releaseErr = err
		le.mu.Unlock()
	})
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.releaseErr
}

// DeleteRow sends the release statement: the row goes if it still belongs to this
// acquisition (name, holder and epoch). It may be sent again after a failure; once a
// newer acquisition holds the row, it deletes nothing.
func (le *Lease) DeleteRow(ctx context.Context) error {
	if _, err := le.leases.pool.Exec(ctx, le.leases.stmts.release, le.Name, le.Holder, le.Epoch, le.endReason()); err != nil {
		return fmt.Errorf("liveness: release lease %q: %w", le.Name, logging.RedactError(err))
	}
	return nil
}

// endReason is what the history records of a release: the string of a lease this
// process lost before it let it go (a stepped-down leader's), "" for a plain release.
func (le *Lease) endReason() string {
	if lost := le.Loss(); lost != nil {
		return lost.Reason
	}
	return ""
}

// LeaveToExpire stops the renewals without deleting the row, so that the lease is free
// only once it expires. For a holder instance it also clears the row's
// holder_instance_id: otherwise the lease would be free as soon as the instance is dead
// (its process stopping), which is what leaving it to expire must prevent. ctx bounds
// that statement.
func (le *Lease) LeaveToExpire(ctx context.Context) error {
	le.end(errLeftToExpire)
	<-le.renewerDone
	if le.leases.id == nil {
		return nil
	}
	if _, err := le.leases.pool.Exec(ctx, le.leases.stmts.detach, le.Name, le.Holder, le.Epoch); err != nil {
		return fmt.Errorf("liveness: leave lease %q to expire: %w", le.Name, logging.RedactError(err))
	}
	return nil
}

// renewLoop renews every ttl/4, and ttl/16 after a failed attempt, until the lease's
// context ends, and ends the lease as soon as the instance can no longer prove life. It
// is owned by the lease: Release waits for it.
func (le *Lease) renewLoop() {
	defer close(le.renewerDone)
	every, retry := le.ttl/4, le.ttl/16
	t := time.NewTimer(every)
	defer t.Stop()
	if le.group != nil {
		// Its group renews it: this loop only ends it when life is lost or ctx ends.
		defer le.group.remove(le)
		t.Stop()
	}
	var over <-chan struct{} // the leadership's trust ran out
	if le.life != nil {
		over = le.life.Over()
	}
	for {
		select {
		case <-le.ctx.Done():
			le.end(nil) // the parent context ended, unless the lease already had
			return
		case <-over:
			le.lose(ReasonNotAlive, nil)
			over = nil
			continue
		case <-t.C:
		}
		if le.renew() {
			t.Reset(every)
		} else {
			t.Reset(retry)
		}
	}
}

// endWhenNotAlive ends the lease the moment its leadership is over, while a renewal is in
// flight: renewLoop looks at it only between renewals, and a renewal stuck on a cut-off
// network waits up to ttl/5, far past the moment the fleet may call this instance dead.
// The returned func stops the watch and waits for it; ending the lease cancels ctx, which
// ends the renewal.
func (le *Lease) endWhenNotAlive(ctx context.Context, life Leadership) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-life.Over():
			le.lose(ReasonNotAlive, nil)
		case <-ctx.Done():
		case <-quit:
		}
	}()
	return func() { close(quit); <-done }
}

// renew sends one renewal and reports whether it succeeded.
func (le *Lease) renew() bool {
	sent := time.Now()
	le.mu.Lock()
	until := le.trustUntil
	le.lastErr = nil // an unanswered attempt counts as "expired", not "error"
	le.mu.Unlock()

	// One attempt waits at most a fifth of the ttl: after a network blip, a statement
	// stuck on its connection can stay unanswered for seconds of TCP retransmission
	// backoff, while a new attempt, on a new connection, gets through at once.
	deadline := sent.Add(max(le.ttl/5, minRenewAttempt))
	if until.Before(deadline) {
		deadline = until
	}
	rctx, cancel := context.WithDeadline(le.ctx, deadline)
	defer cancel()
	if le.life != nil {
		defer le.endWhenNotAlive(rctx, le.life)()
	}
	var expiresAt time.Time
	err := le.leases.pool.QueryRow(rctx, le.leases.stmts.renew, le.Name, le.Holder, le.Epoch, le.ttl.Seconds()).Scan(&expiresAt)
	switch {
	case err == nil:
		le.extend(expiresAt, sent)
		return true
	case errors.Is(err, pgx.ErrNoRows):
		le.lose(ReasonTaken, nil)
		return false
	case le.ctx.Err() != nil:
		return false // released, lost or the parent ended: the loop exits
	case rctx.Err() != nil:
		// Unanswered within the attempt: try again, on another connection; if the window
		// runs out meanwhile the lease is lost as expired, not as an error.
		le.leases.log.Debug("lease renewal unanswered; retrying", "lease", le.Name, "epoch", le.Epoch)
		return false
	default:
		le.renewFailed(err, until)
		return false
	}
}

// extend takes a renewal sent at sent that answered expiresAt: the trust window runs
// from when it was sent (the server's now() came later). A window that ran out before the
// answer was taken stays over, whether or not its timer has fired yet: the lease is lost,
// however the renewal went.
func (le *Lease) extend(expiresAt, sent time.Time) {
	roundTrip := time.Since(sent)
	le.mu.Lock()
	defer le.mu.Unlock()
	if !le.ended && !time.Now().Before(le.trustUntil) {
		le.endLocked(le.windowLostLocked())
		return
	}
	if !le.ended {
		le.expiresAt = expiresAt
		le.fenceUntil = fenceUntil(expiresAt, roundTrip, le.margin)
		le.trustUntil = sent.Add(le.ttl - le.margin)
		le.window.Reset(time.Until(le.trustUntil))
	}
}

// renewFailed records a renewal's error, so that a window that runs out says why, unless
// the answer came past the window (until), which is no answer.
func (le *Lease) renewFailed(err error, until time.Time) {
	err = logging.RedactError(err)
	le.mu.Lock()
	if time.Now().Before(until) {
		le.lastErr = err
	}
	le.mu.Unlock()
	le.leases.log.Debug("lease renewal failed; retrying", "lease", le.Name, "epoch", le.Epoch, "err", err)
}

// windowClosed runs when the trust window may have run out.
func (le *Lease) windowClosed() {
	le.mu.Lock()
	defer le.mu.Unlock()
	if le.ended || time.Now().Before(le.trustUntil) {
		return // a renewal extended the window in time, while this timer fired
	}
	le.endLocked(le.windowLostLocked())
}

// windowLostLocked is the loss of a trust window that ran out: expired, or the last
// attempt's error.
func (le *Lease) windowLostLocked() *Loss {
	lost := &Loss{Name: le.Name, Epoch: le.Epoch, Reason: ReasonExpired}
	if le.lastErr != nil {
		lost.Reason, lost.Err = ReasonError, le.lastErr
	}
	return lost
}

func (le *Lease) end(cause error) {
	le.mu.Lock()
	defer le.mu.Unlock()
	le.endLocked(cause)
}

// endLocked ends the lease once: it stops the window timer, cancels the context with
// cause (a *Loss made into the error users see) and updates the counts. A nil cause, or
// a context the parent already ended, means the parent context ended it; that is not a
// loss.
func (le *Lease) endLocked(cause error) {
	if le.ended {
		return
	}
	le.ended = true
	le.window.Stop()
	if last := le.lifeShares == nil || le.lifeShares.Add(-1) == 0; le.life != nil && last {
		defer le.life.Stop() // after the cancel: the job's context ends first
	}
	if le.inBatch {
		le.group.remove(le)
		close(le.renewerDone)
	}
	var lost *Loss
	if le.ctx.Err() != nil || !errors.As(cause, &lost) {
		lost = nil
	}
	// Count and log first: whoever wakes on Done must see the loss.
	le.leases.noteEnded(le.statName(), le.Epoch, lost)
	var outlived *OutlivedError
	if lost != nil {
		le.loss = lost
		cause = le.leases.errs.LostLease(*lost)
		attrs := []any{"lease", le.Name, "epoch", le.Epoch, "reason", lost.Reason}
		if lost.Err != nil {
			attrs = append(attrs, "err", lost.Err)
		}
		switch {
		case errors.As(lost.Err, &outlived):
			// The fenced transaction's watch has said why, in its own line.
		case le.group != nil:
			// A shard set's: its member says it once for all the leases it lost together.
			le.leases.log.Debug("lease lost; cancelling its context", attrs...)
		default:
			le.leases.log.Warn("lease lost; cancelling its context", attrs...)
		}
	}
	le.cancel(cause) // no-op when the parent already cancelled it
}
