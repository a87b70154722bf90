// The alive lock's session: connect, claim until the lock is held, hold it (verify) until
// it is not, and reconnect with backoff; the waits on the idle connection between them.

package alivelock

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pg-liveness/pg_liveness_exporter/internal/notify"
)

// Run connects, claims, verifies and reconnects (with backoff and jitter) until ctx is
// done; it then closes its connection, which releases the lock, and returns nil. Failures
// are logged, never returned: the heartbeat carries liveness while the lock is not held.
func (a *Direct) Run(ctx context.Context) error {
	if !a.running.CompareAndSwap(false, true) {
		return errors.New("liveness: alive lock: Run is already running")
	}
	defer a.running.Store(false)
	attempt := 0
	for {
		select {
		case <-a.serverBack: // from before this session: not news
		default:
		}
		began := time.Now()
		held := a.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		// A session that held the lock, or lasted, resets the backoff: the next loss is a
		// new incident, to be recovered from at once. A connection that keeps failing or
		// dropping at once backs off further.
		if held || time.Since(began) > ReconnectBackoffMax {
			attempt = 0
		}
		attempt++
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(Backoff(attempt)):
		case <-a.serverBack:
		}
	}
}

// Answered tells the session that the database answers again (a beat got through after
// failures): a lock lost with a restart is claimed again at once, not after the rest of
// a backoff that grew while the server was down. Safe from any goroutine.
func (a *Direct) Answered() {
	if a.Held() {
		return
	}
	select {
	case a.serverBack <- struct{}{}:
	default:
	}
}

// session runs one connection in two states, as long as the connection lasts: claiming
// until the lock is held, then holding (verifying) until it is not, and claiming again.
// Between statements a read on the idle connection notices at once when the server ends
// the session. It reports whether the lock was held at some point.
func (a *Direct) session(ctx context.Context) (held bool) {
	cctx, cancel := context.WithTimeout(ctx, ConnectTimeout)
	conn, err := pgx.ConnectConfig(cctx, a.connCfg)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			a.connectFailed(err)
		}
		return
	}
	if a.connectedOnce {
		a.reconnects.Add(1)
	}
	a.connectedOnce = true
	defer func() {
		a.events.SetListening(false)
		if ctx.Err() != nil {
			a.release() // shutting down: not a loss
		} else {
			a.setHeld(false)
		}
		closeCtx, cancel := context.WithTimeout(context.Background(), CloseTimeout)
		defer cancel()
		_ = conn.Close(closeCtx) // ends the session, which releases the lock
	}()
	if a.afterConnect != nil {
		a.afterConnect(ctx, conn)
	}

	a.lastExchange = time.Now()
	listening := false
	a.members.Store(false) // a new session listens to nothing
	for {
		if !a.runClaimingState(ctx, conn) {
			return held
		}
		held = true
		if !listening && a.events != nil {
			listening = a.listen(ctx, conn)
		}
		if listening {
			a.syncMembers(ctx, conn)
		}
		if !a.runHoldingState(ctx, conn, listening) {
			return held
		}
	}
}

// runClaimingState claims the lock until it is held, and returns true then. While another
// session holds it (a duplicate, or this instance's previous backend that has not exited
// yet) or the server refuses the claim, it claims again every ReclaimEvery (or
// verifyEvery, when shorter); every reclaimFast for reclaimFastFor while the holder is a
// session that claimed it for this instance. It returns false when the connection must
// be dropped.
func (a *Direct) runClaimingState(ctx context.Context, conn *pgx.Conn) bool {
	var askedHolder, refused time.Time
	for {
		ans, backendPID := a.ask(ctx, conn, a.claimSQL, a.instanceID, int64(conn.PgConn().PID()))
		switch ans {
		case answerDrop:
			return false
		case answerHeld:
			a.pid.Store(backendPID)
			a.noteProof(a.lastExchange, a.claims.Add(1))
			a.stranger.Store(false)
			a.setDuplicate(false)
			a.setHeld(true)
			a.report("held", slog.LevelInfo, "alive lock held", "backend_pid", backendPID)
			a.settledOnce()
			return true
		case answerNotHeld:
			if refused.IsZero() {
				refused = time.Now()
			}
			// Whose session holds the key decides what this is: a pg_locks read, so asked
			// at the first refusal and then rarely.
			if askedHolder.IsZero() || time.Since(askedHolder) >= HolderAskEvery {
				askedHolder = time.Now()
				if !a.judgeHolder(ctx, conn, backendPID) {
					return false
				}
			} else {
				a.reportHolder(backendPID, 0)
			}
			a.settledOnce()
		}
		every := min(a.verifyEvery, ReclaimEvery)
		if a.Duplicate() && time.Since(refused) < reclaimFastFor {
			every = min(every, reclaimFast)
		}
		if !a.wait(ctx, conn, every) {
			return false
		}
	}
}

// runHoldingState verifies every verifyEvery (leaderEvery while leading, and at once when
// a leadership begins or wants a proof), on the session's own backend, that the lock is
// still held. It returns true once it is not (it vanished, the server refused the
// verification, or the statements run on another backend), after the pause before the
// next claim, and false when the connection must be dropped.
func (a *Direct) runHoldingState(ctx context.Context, conn *pgx.Conn, listening bool) bool {
	for {
		every := a.verifyEvery
		if a.leading.Load() > 0 {
			every = a.leaderEvery
		}
		if !a.waitWakeable(ctx, conn, every) {
			return false
		}
		if listening {
			a.syncMembers(ctx, conn)
		}
		ans, backendPID := a.ask(ctx, conn, a.verifySQL, a.instanceID)
		switch ans {
		case answerDrop:
			return false
		case answerHeld:
			a.noteProof(a.lastExchange, a.claims.Load())
			a.setDuplicate(false)
			a.setHeld(true)
			a.report("held", slog.LevelInfo, "alive lock held", "backend_pid", backendPID)
			a.settledOnce()
			continue
		case answerNotHeld:
			a.setHeld(false)
			a.report("vanished", slog.LevelWarn, "alive lock no longer held by this session; re-claiming",
				"backend_pid", backendPID)
			a.settledOnce()
		}
		// Claim again soon, not at once: the backend that held it may just not have
		// exited yet.
		return a.wait(ctx, conn, min(a.verifyEvery, ReclaimEvery))
	}
}

// wait waits d on the idle connection, whose read notices at once when the server ends
// the session. It returns false when ctx ended or the connection was lost (reported).
func (a *Direct) wait(ctx context.Context, conn *pgx.Conn, d time.Duration) bool {
	return a.waitFor(ctx, conn, d, false)
}

// waitWakeable is wait, cut short by wake.
func (a *Direct) waitWakeable(ctx context.Context, conn *pgx.Conn, d time.Duration) bool {
	return a.waitFor(ctx, conn, d, true)
}

// errWoken ends a wait that wake cut short.
var errWoken = errors.New("liveness: alive lock: proof wanted")

func (a *Direct) waitFor(ctx context.Context, conn *pgx.Conn, d time.Duration, wakeable bool) bool {
	deadline := time.Now().Add(d)
	for {
		pctx, wake := context.WithCancelCause(ctx)
		if wakeable {
			a.wakeMu.Lock()
			woken := a.woken
			a.woken, a.wakeWait = false, wake
			if woken {
				a.wakeWait = nil
			}
			a.wakeMu.Unlock()
			if woken {
				wake(nil)
				return true
			}
		}
		wctx, cancel := context.WithDeadline(pctx, deadline)
		err := conn.PgConn().WaitForNotification(wctx)
		cancel()
		if wakeable {
			// From here on a wake sets woken, for the next wait; one that came before
			// has cancelled pctx with errWoken.
			a.wakeMu.Lock()
			a.wakeWait = nil
			a.wakeMu.Unlock()
		}
		woken := context.Cause(pctx) == errWoken
		wake(nil)
		switch {
		case ctx.Err() != nil:
			return false
		case woken && !conn.IsClosed():
			return true // a proof is wanted now
		case err == nil:
			// A notification: OnNotification has handed it on. Wait on: a fleet's events
			// must not make every agent verify early.
			continue
		case pgconn.Timeout(err) && !conn.IsClosed():
			return true // time for the next statement
		default:
			a.report("lost", slog.LevelWarn, "alive lock connection lost; reconnecting",
				"held_before", a.held.Load(), "error", err)
			return false
		}
	}
}

// listen LISTENs on the schema's events channel on the session's own backend (the
// claim just proved it is), and wakes every waiter: notifications sent while no session
// listened are lost, so they read the state again. A failure is logged and left: the
// waiters poll.
func (a *Direct) listen(ctx context.Context, conn *pgx.Conn) bool {
	qctx, cancel := context.WithTimeout(ctx, StatementTimeout)
	defer cancel()
	var channel string
	if err := conn.QueryRow(qctx, a.listenSQL).Scan(&channel); err != nil {
		if ctx.Err() == nil {
			a.log.Warn("cannot listen to the schema's events; waiters poll instead", "error", err)
		}
		return false
	}
	a.log.Debug("listening to the schema's events", "channel", channel)
	a.events.SetListening(true)
	a.events.Publish(notify.Event{Kind: notify.Resync})
	return true
}

// syncMembers listens to the members channel while something in the process waits for
// membership, and stops once nothing does (notify.Hub.MembersWanted). A LISTEN that takes
// effect wakes the membership waiters, which may have missed events before it. A failure
// is logged at debug level and tried again at the next verification: the waiters poll.
func (a *Direct) syncMembers(ctx context.Context, conn *pgx.Conn) {
	want := a.events.MembersWanted()
	if want == a.members.Load() {
		return
	}
	sql := a.unmembersSQL
	if want {
		sql = a.membersSQL
	}
	qctx, cancel := context.WithTimeout(ctx, StatementTimeout)
	defer cancel()
	var channel string
	if err := conn.QueryRow(qctx, sql).Scan(&channel); err != nil {
		a.log.Debug("cannot change listening to the members channel", "listen", want, "error", err)
		return
	}
	a.members.Store(want)
	if want {
		a.events.Publish(notify.Event{Kind: notify.Resync})
	}
}

// wake makes the session verify the lock now, when it holds it: the wait before the next
// verification ends at once, or, if none runs, the next one does not begin. Safe from
// any goroutine.
func (a *Direct) wake() {
	if a == nil {
		return
	}
	a.wakeMu.Lock()
	defer a.wakeMu.Unlock()
	if a.wakeWait != nil {
		a.wakeWait(errWoken)
		return
	}
	a.woken = true
}

func (a *Direct) connectFailed(err error) {
	// The first claim has an answer too: there will be none for now. The heartbeat need
	// not wait for it.
	a.settledOnce()
	if strings.Contains(err.Error(), "unsupported startup parameter") {
		a.report("connect:pooler", slog.LevelError,
			"alive lock cannot connect: the server refused the keepalive startup parameters, so the "+
				"direct DSN most likely points at PgBouncer; point it at PostgreSQL itself",
			"error", err)
		return
	}
	a.report("connect", slog.LevelWarn, "alive lock cannot connect; retrying", "error", err)
}

// report logs once per condition: a repeat of the previous condition goes to debug.
func (a *Direct) report(condition string, level slog.Level, msg string, attrs ...any) {
	a.condition.Log(a.log, level, condition, msg, attrs...)
}
