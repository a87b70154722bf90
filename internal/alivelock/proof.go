// One claim or verification of the alive lock: what the server answered and on which
// backend, whose session holds the key when it is not this one's, and the proof recorded.

package alivelock

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// judgeHolder asks who holds the key a claim found held, and reports it: a session the
// instance's row records as its claimant is this instance's (a duplicate, or its previous
// session not yet ended); any other is a stranger's, whose lock counts for nobody and
// which must not make this process give up as a duplicate would. It returns false when
// the connection must be dropped.
func (a *Direct) judgeHolder(ctx context.Context, conn *pgx.Conn, backendPID int64) bool {
	qctx, cancel := context.WithTimeout(ctx, a.statementTimeout())
	defer cancel()
	var holderPID int32
	var claimed bool
	err := conn.QueryRow(qctx, a.holderSQL, a.instanceID).Scan(&holderPID, &claimed)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return true // freed meanwhile: the next claim takes it
	case err != nil && (ctx.Err() != nil || conn.IsClosed()):
		return false
	case err != nil:
		// Not known: treat it as before this question existed, a duplicate.
		claimed = true
		a.log.Debug("cannot read who holds the alive lock's key", "error", err)
	}
	a.stranger.Store(!claimed)
	a.setDuplicate(claimed)
	a.reportHolder(backendPID, holderPID)
	return true
}

// reportHolder logs what the last look at the key's holder found (once per condition;
// repeats at debug level).
func (a *Direct) reportHolder(backendPID int64, holderPID int32) {
	if a.stranger.Load() {
		a.report("stranger", slog.LevelError,
			"alive lock's key held by a session that did not claim it for this instance (another role's "+
				"session, or an older binary's): that lock counts for nobody, and this instance is judged "+
				"by its heartbeat until the key is free; retrying",
			"backend_pid", backendPID, "holder_pid", holderPID)
		return
	}
	a.report("duplicate", slog.LevelWarn,
		"alive lock held by another session: a duplicate instance id, or this instance's previous "+
			"session not yet ended; retrying, the heartbeat goes on at the fast cadence",
		"backend_pid", backendPID, "holder_pid", holderPID)
}

// noteProof records a claim or verification that answered "held", sent at sent, with
// the server's clock and the round trip of that statement.
func (a *Direct) noteProof(sent time.Time, claim uint64) {
	a.recordProof(Proof{Sent: sent, Claim: claim, ServerClock: a.lastServerClock, RoundTrip: a.lastRoundTrip})
}

// answer is what a claim or a verification came to.
type answer int

const (
	// answerDrop: the connection failed, or ctx ended. Drop it and connect again.
	answerDrop answer = iota
	// answerNone: no answer to act on, already reported and Held cleared: the server
	// refused the statement (the objects may be missing), or it ran on another backend
	// than the session's own (a pooler). The connection stays.
	answerNone
	// answerHeld: this session holds the lock.
	answerHeld
	// answerNotHeld: it does not: another session holds it (a claim), or it vanished
	// (a verification).
	answerNotHeld
)

// ask sends the claim or the verification sql and checks that it ran on the session's
// own backend. With answerHeld and answerNotHeld it returns that backend's pid; the
// caller acts on the answer and then settles the first claim.
func (a *Direct) ask(ctx context.Context, conn *pgx.Conn, sql string, args ...any) (answer, int64) {
	// The server frees the lock of a client it has not heard from for its keepalive
	// time; the client socket gives up one probe earlier, counted from the last exchange.
	// A statement sent late in that span must not push this side's trust past it: at
	// trustUntil the lock stops counting as held. The session is kept, though, until the
	// socket or the statement timeout gives up: a blip shorter than that ends in an answer
	// on the same session. Dropping it at trustUntil would end the session on the server
	// as soon as the link came back (the close is queued behind the unanswered
	// statement), and free the lock until a new session claimed it, for long enough that
	// the fleet called a live, connected instance dead.
	sent := time.Now()
	trustUntil := a.lastExchange.Add(a.clientUserTimeout)
	if limit := sent.Add(a.statementTimeout()); trustUntil.After(limit) {
		trustUntil = limit
	}
	if least := sent.Add(time.Second); trustUntil.Before(least) {
		trustUntil = least
	}
	qctx, cancel := context.WithTimeout(ctx, a.statementTimeout())
	defer cancel()
	distrusted := make(chan struct{})
	distrust := time.AfterFunc(time.Until(trustUntil), func() {
		defer close(distrusted)
		a.setHeld(false)
		a.report("unanswered", slog.LevelWarn,
			"alive lock statement unanswered past the time the lock can be trusted; not trusting it "+
				"until the session answers", "waited", time.Since(sent).Round(time.Millisecond))
	})
	startupPID := int64(conn.PgConn().PID())
	var backendPID int64
	var ok *bool // NULL from the claim when this is not our own session
	var serverClock time.Time
	err := conn.QueryRow(qctx, sql, args...).Scan(&backendPID, &ok, &serverClock)
	// The timer's setHeld and report are the owner's, done while it waited on the
	// statement: it goes on only once they are.
	if !distrust.Stop() {
		<-distrusted
	}
	if err != nil {
		a.setHeld(false)
		if ctx.Err() != nil {
			return answerDrop, 0
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && !conn.IsClosed() {
			// The server answered, so the connection is fine; the objects may be missing
			// (migrations not applied yet). Try again on the next claim.
			a.settledOnce()
			a.report("error:"+pgErr.Code, slog.LevelError,
				"alive lock claim failed; the heartbeat goes on at the fast cadence",
				"error", err)
			return answerNone, 0
		}
		a.report("lost", slog.LevelWarn, "alive lock connection failed; reconnecting", "error", err)
		return answerDrop, 0
	}
	a.lastExchange = sent
	a.lastServerClock, a.lastRoundTrip = serverClock, time.Since(sent)
	if backendPID != startupPID {
		a.setHeld(false)
		a.report("pooled", slog.LevelError,
			"alive lock not held: statements on its connection run on another backend than the one the "+
				"server opened for it, so the direct DSN most likely points at PgBouncer in transaction "+
				"pooling mode (or another pooler); point the direct DSN at PostgreSQL itself",
			"startup_pid", startupPID, "backend_pid", backendPID)
		a.settledOnce()
		return answerNone, 0
	}
	if ok != nil && *ok {
		return answerHeld, backendPID
	}
	return answerNotHeld, backendPID
}
