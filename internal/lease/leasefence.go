// A lease's fence: Lease.Fence, and the deadline past which a write fenced under the lease
// is refused (FenceDeadline).

package lease

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
)

// Fence runs <schema>.fence in tx for this acquisition: the library's Lease.Fence, which
// documents it.
func (le *Lease) Fence(ctx context.Context, tx pgx.Tx) error {
	if cause := le.Err(); cause != nil {
		le.leases.noteRefused(le.statName(), Refusal{Lease: le.Name, Epoch: le.Epoch, Err: cause}, false)
		return le.notHeld(cause)
	}
	deadline, late := le.fenceDeadline()
	var held, inTime bool
	if err := tx.QueryRow(ctx, le.leases.stmts.fence, le.Name, le.Holder, le.Epoch, deadline, le.idleLimit()).Scan(&held, &inTime); err != nil {
		return fmt.Errorf("liveness: fence lease %q: %w", le.Name, logging.RedactError(err))
	}
	switch {
	case !held:
		le.lose(ReasonTaken, nil)
	case !inTime:
		// The fence reached the server after this process stopped trusting the lease, or
		// just as it does: whatever the row says, the writes must not count.
		le.lose(late, nil)
	}
	if cause := le.Err(); cause != nil { // it ended, here or while the statement ran
		le.leases.noteRefused(le.statName(), Refusal{Lease: le.Name, Epoch: le.Epoch, Err: cause}, false)
		return le.notHeld(cause)
	}
	return nil
}

// FenceDeadline is the moment, on the server's clock, past which a write fenced under
// this lease must be refused: the library's Lease.FenceDeadline, which documents it.
func (le *Lease) FenceDeadline() time.Time {
	deadline, _ := le.fenceDeadline()
	return deadline
}

// fenceDeadline is FenceDeadline, with the reason the lease counts as lost once the
// server's clock passes it.
func (le *Lease) fenceDeadline() (time.Time, string) {
	le.mu.Lock()
	deadline, ended := le.fenceUntil, le.ended
	le.mu.Unlock()
	if ended || le.ctx.Err() != nil {
		return time.Time{}, ReasonExpired
	}
	reason := ReasonExpired
	if le.life != nil {
		d, ok := le.life.FenceDeadline()
		if !ok {
			return time.Time{}, ReasonNotAlive
		}
		if d.Before(deadline) {
			deadline, reason = d, ReasonNotAlive
		}
	}
	return deadline, reason
}

// fenceUntil carries the end of a trust window of ttl − margin, counted from when a
// statement that answered expiresAt (its server's now() + ttl) was sent roundTrip ago,
// over to the server's clock. The server's now() ran after the statement was sent, so its
// clock reads expiresAt − roundTrip − margin no later than the window's local end.
func fenceUntil(expiresAt time.Time, roundTrip, margin time.Duration) time.Time {
	return expiresAt.Add(-roundTrip - margin)
}

// notHeld is Fence's error for a lease that ended with cause: the loss users see, or
// an error errors.Is Errors.Lost.
func (le *Lease) notHeld(cause error) error {
	if le.Loss() != nil {
		return cause
	}
	return fmt.Errorf("%w: lease %q (epoch %d) is not held: %w", le.leases.errs.Lost, le.Name, le.Epoch, cause)
}

// idleLimit is how long a fenced transaction may idle between its statements before the
// server ends its session (idle_in_transaction_session_timeout, set by the fence for the
// transaction only): the lease's ttl. A holder that hangs with a fenced transaction open
// holds the lease row's lock, and so every takeover; the limit ends that hold no later
// than the lease itself would have ended.
func (le *Lease) idleLimit() string { return strconv.FormatInt(le.ttl.Milliseconds(), 10) + "ms" }
