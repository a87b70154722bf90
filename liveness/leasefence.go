// A lease's fence: Lease.Fence, and the deadline past which a write fenced under the lease
// is refused (FenceDeadline).

package liveness

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
)

// Fence makes the writes that follow it in tx count only while this lease is held: it
// runs <schema>.fence in tx, which acts only for this acquisition's holder token and
// locks the lease row FOR KEY SHARE, keeping any takeover from committing until tx ends
// (the renewals go on), so every write fenced under this epoch commits before the next
// holder's first. Call it in the transaction that writes, before the writes, and roll
// back when it fails.
//
// It fails with an error that is errors.Is ErrLeaseLost when the lease is not held: it
// has ended in this process (lost, released, its context ended), its row no longer has
// this epoch (taken over, deleted, expired by the database clock), or the fence reached
// the server after FenceDeadline (held back by the network past the moment this process
// stopped trusting the lease); the lease is then ended. Any other error is the
// statement's. tx must be on the leases' database.
//
// The deadline is checked when the fence runs, and again at COMMIT (a deferred check the
// fence queues, migration 0009): a COMMIT that reaches the server past FenceDeadline as
// of the fence, held back by the network say, fails with SQLSTATE SQLStateCommitLate
// and rolls tx back, even when Fence's error was ignored. That deadline is fixed when
// Fence runs, so tx must commit within the horizon FenceDeadline states; BeginTx,
// BeginFunc and Exec carry a fresh one with their COMMIT instead, take their connection
// before reading it, and say a refusal with a *FencedError: prefer them. A SET
// CONSTRAINTS in tx that would run the check early (ALL IMMEDIATE, or naming it) fails
// with SQLSTATE LVF04 and aborts tx; name your own constraints instead. PREPARE
// TRANSACTION fails with LVF05.
//
// lease_is_held looks only at the row's epoch and expiry, not at the holder's life: while
// the holder is dead by the verdict but nobody has taken the lease yet, a write fenced
// under its epoch is still accepted. It still lands before any other holder's, because
// the takeover waits for the fenced transaction.
func (le *Lease) Fence(ctx context.Context, tx pgx.Tx) error {
	if cause := le.Err(); cause != nil {
		le.leases.noteRefused(le.statName(), &FencedError{Lease: le.Name, Epoch: le.Epoch, Err: cause}, false)
		return le.notHeld(cause)
	}
	deadline, late := le.fenceDeadline()
	var held, inTime bool
	if err := tx.QueryRow(ctx, le.leases.stmts.fence, le.Name, le.Holder, le.Epoch, deadline, le.idleLimit()).Scan(&held, &inTime); err != nil {
		return fmt.Errorf("liveness: fence lease %q: %w", le.Name, logging.RedactError(err))
	}
	switch {
	case !held:
		le.end(&LeaseLostError{Name: le.Name, Epoch: le.Epoch, Reason: lostTaken})
	case !inTime:
		// The fence reached the server after this process stopped trusting the lease, or
		// just as it does: whatever the row says, the writes must not count.
		le.end(&LeaseLostError{Name: le.Name, Epoch: le.Epoch, Reason: late})
	}
	if cause := le.Err(); cause != nil { // it ended, here or while the statement ran
		le.leases.noteRefused(le.statName(), &FencedError{Lease: le.Name, Epoch: le.Epoch, Err: cause}, false)
		return le.notHeld(cause)
	}
	return nil
}

// FenceDeadline is the moment, on the database server's clock, past which a write fenced
// under this lease must be refused: the end of the lease's trust window or, under an
// Agent, the moment the instance could no longer count on the fleet seeing it alive (three
// quarters of the lock grace after the alive lock's last proof, while it leads),
// whichever comes first. Each is carried over from this host's clock to the server's with
// times the server returned (its clock during the last renewal, proof and beat, less
// their round trips), so no clock synchronisation is assumed, only that the two clocks
// run at about the same rate (Margin covers the difference). A write sent before the
// lease ends but held back by the network (a partition that heals, TCP retransmitting
// what was in flight) would otherwise be accepted after this process was told it lost
// the lease, as long as nobody has taken the lease meanwhile.
//
// How far ahead it is: for a healthy leader of an Agent, half to three quarters of the
// lock grace (0.5 to 0.75 s at the default 1 s), less the last proof's round trip. The
// lock is proved every quarter grace, and the deadline is three quarters after the last
// proof was sent: the fleet may call the instance dead one grace after its lock vanished
// unseen, which may happen just after that proof, and the last quarter is the job's time
// to notice its cancelled context. Without an Agent, the trust window's end: ttl − margin
// after the last renewal was sent, renewed every ttl/4. It cannot lie further ahead
// without accepting writes after this process stopped trusting the lease.
//
// Only the time a fence or a COMMIT takes to reach the server counts against it when it
// is read just before each is sent, which Exec, BeginTx and BeginFunc do: they take their
// connection first, read the deadline for the fence, and read it again for the COMMIT. A
// deadline read before waiting for a connection, or a transaction's statements that wait
// for row locks after Fence, spend the horizon: a healthy leader's slow write is refused.
//
// Fence, Exec, BeginTx and BeginFunc pass it themselves; hand-written fence SQL is not
// needed. It moves with every renewal, proof and beat: take it for each write. Once the
// lease has ended it is the zero time, which refuses every write.
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
		return time.Time{}, lostExpired
	}
	reason := lostExpired
	if le.life != nil {
		d, ok := le.life.fenceDeadline()
		if !ok {
			return time.Time{}, lostNotAlive
		}
		if d.Before(deadline) {
			deadline, reason = d, lostNotAlive
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

// notHeld is Fence's error for a lease that ended with cause.
func (le *Lease) notHeld(cause error) error {
	var lost *LeaseLostError
	if errors.As(cause, &lost) {
		return cause
	}
	return fmt.Errorf("%w: lease %q (epoch %d) is not held: %w", ErrLeaseLost, le.Name, le.Epoch, cause)
}

// idleLimit is how long a fenced transaction may idle between its statements before the
// server ends its session (idle_in_transaction_session_timeout, set by the fence for the
// transaction only): the lease's ttl. A holder that hangs with a fenced transaction open
// holds the lease row's lock, and so every takeover; the limit ends that hold no later
// than the lease itself would have ended.
func (le *Lease) idleLimit() string { return strconv.FormatInt(le.ttl.Milliseconds(), 10) + "ms" }
