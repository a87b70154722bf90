package lease

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
)

// SQLStateCommitLate is the SQLSTATE of a COMMIT that the server refused because it
// came past the deadline of a fence in its transaction (the library's SQLStateCommitLate).
const SQLStateCommitLate = "LVF03"

// The SQLSTATEs of a refused strict fence (lease_fence_strict): the lease is not held
// under the epoch; the fence reached the server past its deadline.
const (
	sqlStateNotHeld   = "LVF01"
	sqlStateFenceLate = "LVF02"
)

// fenceEndTimeout bounds the ROLLBACK sent after a refusal, which runs even when the
// caller's context has ended: the connection goes back to its pool only once it has.
const fenceEndTimeout = 5 * time.Second

// Refusal is a write fenced under a lease that was refused, as this package finds it;
// users see it as Errors.Refused made it (the library's *FencedError, of the same
// fields, which says what each means).
type Refusal struct {
	Lease    string
	Epoch    int64
	Held     bool
	AtCommit bool
	Err      error
}

// Exec runs sql with args as one fenced transaction under this lease, in one round
// trip: the library's Lease.Exec, which documents it.
func (le *Lease) Exec(ctx context.Context, db *pgxpool.Pool, sql string, args ...any) (pgconn.CommandTag, error) {
	if blankSQL(sql) {
		return pgconn.CommandTag{}, fmt.Errorf("liveness: fenced write under lease %q: the statement is empty "+
			"(blank, or comments only): nothing to write", le.Name)
	}
	if cause := le.Err(); cause != nil {
		return pgconn.CommandTag{}, le.refused(false, cause)
	}
	conn, err := db.Acquire(ctx)
	if err != nil {
		return pgconn.CommandTag{}, fmt.Errorf("liveness: fenced write under lease %q: %w", le.Name, logging.RedactError(err))
	}
	defer conn.Release()
	// Ended before the release: a connection it cancelled a statement on is closed.
	w := le.watchTx(conn.Conn().PgConn(), time.Now())
	defer w.end(conn)
	tag, err, slow := le.execPipelined(ctx, conn.Conn(), w, sql, args)
	if slow {
		le.leases.log.Debug("fenced write outlasted the deadline it was sent with: rolled back, and run once more with a "+
			"COMMIT of its own", "lease", le.Name, "epoch", le.Epoch, "err", logging.RedactError(err))
		return le.execInTransaction(ctx, conn.Conn(), w, sql, args)
	}
	return tag, err
}

// execPipelined is Exec's one round trip: lease_fence_exec and sql in one pipeline, one
// implicit transaction. slow reports a write rolled back at its commit for coming past
// the deadline that left with it, while the lease is still held: Exec's cue to try once
// more with a fresh deadline at COMMIT (execInTransaction); err is then not counted as a
// refusal.
func (le *Lease) execPipelined(ctx context.Context, conn *pgx.Conn, w *txWatch, sql string, args []any) (tag pgconn.CommandTag, err error, slow bool) {
	deadline, _ := le.fenceDeadline() // after the wait for the connection: it does not count
	b := &pgx.Batch{}
	b.Queue(le.leases.stmts.fenceExec, le.Name, le.Holder, le.Epoch, deadline.Truncate(time.Microsecond))
	b.Queue(sql, args...)
	br := conn.SendBatch(ctx, b)
	_, err = br.Exec()
	ran := false
	if err == nil {
		tag, err = br.Exec()
		ran = err == nil
	}
	if cerr := br.Close(); err == nil { // Close repeats the first error; a refused commit comes here
		err = cerr
	}
	if err == nil && conn.PgConn().TxStatus() != 'I' {
		// sql opened a transaction block of its own (BEGIN): nothing of it is committed.
		endTx(ctx, conn)
		return pgconn.CommandTag{}, fmt.Errorf("liveness: fenced write under lease %q: the statement left a transaction "+
			"open (transaction control is not allowed in Exec; use BeginTx): rolled back", le.Name), false
	}
	if err == nil {
		return tag, nil, false
	}
	endTx(ctx, conn)
	if w.fired() { // cancelled past its bound: nothing committed
		return pgconn.CommandTag{}, le.refused(false, err), false
	}
	var pg *pgconn.PgError
	if ran && errors.As(err, &pg) && pg.Code == SQLStateCommitLate && le.Err() == nil {
		return pgconn.CommandTag{}, err, true
	}
	return pgconn.CommandTag{}, le.fenceFailed(err), false
}

// execInTransaction is Exec's second try, for a statement slower than its deadline's
// margin: BEGIN, the fence and sql in one round trip, the COMMIT with the deadline as of
// then in a second.
func (le *Lease) execInTransaction(ctx context.Context, conn *pgx.Conn, w *txWatch, sql string, args []any) (pgconn.CommandTag, error) {
	deadline, _ := le.fenceDeadline()
	deadline = deadline.Truncate(time.Microsecond) // as the server keeps it
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(le.leases.stmts.fenceStrict, le.Name, le.Holder, le.Epoch, deadline, le.idleLimit())
	b.Queue(sql, args...)
	br := conn.SendBatch(ctx, b)
	var tag pgconn.CommandTag
	_, err := br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil { // Close repeats the first error
		err = cerr
	}
	if err != nil {
		endTx(ctx, conn)
		if w.fired() { // no COMMIT was sent: nothing committed
			return pgconn.CommandTag{}, le.refused(false, err)
		}
		return pgconn.CommandTag{}, le.fenceFailed(err)
	}
	if err := le.commit(ctx, conn, w, deadline); err != nil {
		return pgconn.CommandTag{}, err
	}
	return tag, nil
}

// BeginTx begins a transaction on a connection of its own from db, fenced under this
// lease: the library's Lease.BeginTx, which documents it.
func (le *Lease) BeginTx(ctx context.Context, db *pgxpool.Pool, opts pgx.TxOptions) (pgx.Tx, error) {
	if cause := le.Err(); cause != nil {
		return nil, le.refused(false, cause)
	}
	conn, err := db.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("liveness: fenced transaction under lease %q: %w", le.Name, logging.RedactError(err))
	}
	w := le.watchTx(conn.Conn().PgConn(), time.Now())
	tx, err := conn.BeginTx(ctx, opts)
	if err != nil {
		w.end(conn)
		conn.Release()
		return nil, fmt.Errorf("liveness: fenced transaction under lease %q: %w", le.Name, logging.RedactError(err))
	}
	deadline, _ := le.fenceDeadline()
	deadline = deadline.Truncate(time.Microsecond) // as the server keeps it
	var held bool
	if err := tx.QueryRow(ctx, le.leases.stmts.fenceStrict, le.Name, le.Holder, le.Epoch, deadline, le.idleLimit()).Scan(&held); err != nil {
		endTx(ctx, conn.Conn())
		w.end(conn)
		conn.Release()
		return nil, le.fenceFailed(err)
	}
	return &fencedTx{Tx: tx, lease: le, conn: conn, watch: w, fenced: deadline}, nil
}

// BeginFunc runs fn in a transaction of BeginTx and commits it when fn returns nil, or
// rolls it back: the library's Lease.BeginFunc, which documents it.
func (le *Lease) BeginFunc(ctx context.Context, db *pgxpool.Pool, fn func(pgx.Tx) error) error {
	tx, err := le.BeginTx(ctx, db, pgx.TxOptions{})
	if err != nil {
		return err
	}
	defer func() { // also when fn panics; after Commit, a no-op
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fenceEndTimeout)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	if err := fn(tx); err != nil {
		if tx.(*fencedTx).watch.fired() {
			return le.refused(false, err) // cancelled past its bound: nothing committed
		}
		return err
	}
	return tx.Commit(ctx)
}

// fencedTx is BeginTx's transaction: its COMMIT carries the deadline as of when it is
// sent, and it gives its connection back when it ends.
type fencedTx struct {
	pgx.Tx
	lease *Lease
	conn  *pgxpool.Conn
	watch *txWatch
	// fenced is the deadline its fence queued the check at commit with.
	fenced time.Time
	done   bool
}

func (t *fencedTx) Commit(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	t.done = true
	defer t.conn.Release()
	defer t.watch.end(t.conn)
	return t.lease.commit(ctx, t.conn.Conn(), t.watch, t.fenced)
}

func (t *fencedTx) Rollback(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	t.done = true
	defer t.conn.Release()
	defer t.watch.end(t.conn)
	return t.Tx.Rollback(ctx)
}

// commit sends the COMMIT of a fenced transaction on conn, with the deadline as of now
// in the same simple query: the check at commit (migration 0009) holds it to that one.
// A lease that has ended sends the zero time, which refuses it. When the deadline is
// still fenced, the one the fence queued the check with, the COMMIT goes alone: the
// check holds it to that very deadline, and the transaction costs one statement less.
func (le *Lease) commit(ctx context.Context, conn *pgx.Conn, w *txWatch, fenced time.Time) error {
	sql := "COMMIT" // a failed transaction's COMMIT rolls it back, and nothing may run before it
	if deadline, _ := le.fenceDeadline(); conn.PgConn().TxStatus() != 'E' &&
		(deadline.IsZero() || !deadline.Truncate(time.Microsecond).Equal(fenced)) {
		q := le.leases.stmts.fenceCommit
		// Digits, colons, a minus sign and hex only: nothing to quote.
		lit := "'" + le.commitDeadline(deadline) + "'"
		sql = q[0] + lit + q[1] + "; COMMIT"
	}
	tag, err := conn.Exec(ctx, sql)
	if err != nil {
		endTx(ctx, conn)
		var pg *pgconn.PgError
		switch {
		case errors.As(err, &pg) && pg.Code == sqlStateIdleInTxTimeout:
			// The server ended the session: the transaction idled past the fence's limit
			// (the lease's ttl), and was rolled back.
			return le.refused(true, err)
		case errors.As(err, &pg) && pg.Code == sqlStateQueryCanceled && w.fired():
			// The transaction outlived its bound and its watch cancelled it: rolled back.
			return le.refused(true, err)
		case pgconn.SafeToRetry(err) && ctx.Err() == nil && conn.IsClosed():
			// The COMMIT was not sent, on a connection that is closed (the server ended
			// the session past the idle limit, and a statement before it read so):
			// nothing committed.
			return le.refused(true, err)
		}
		return le.fenceFailed(err)
	}
	if tag.String() == "ROLLBACK" { // the transaction had failed before its COMMIT
		if w.fired() {
			return le.refused(true, pgx.ErrTxCommitRollback)
		}
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// SQLSTATEs the server ends a fenced transaction with, of which nothing committed:
// idle_in_transaction_session_timeout (the fence's idle limit), and a statement the
// transaction's watch cancelled (txWatch).
const (
	sqlStateIdleInTxTimeout = "25P03"
	sqlStateQueryCanceled   = "57014"
)

// OutlivedError is why a lease ended whose fenced transaction stayed open past its
// bound, the lease's ttl (Loss.Err, with Reason "expired").
type OutlivedError struct {
	age, bound time.Duration
}

func (e *OutlivedError) Error() string {
	return fmt.Sprintf("a fenced transaction under it was open %s, past its bound (the lease's TTL, %s): its statement "+
		"was cancelled", e.age.Round(time.Millisecond), e.bound)
}

// txWatch bounds one fenced transaction (of Exec, BeginTx or BeginFunc) to its lease's
// ttl from its start: the transaction holds the lease row FOR KEY SHARE, so that a
// takeover waits for it, and one that never ended (a statement stuck on a lock, a hung
// holder's job) would hold back every other holder forever. Past the bound its running
// statement is cancelled on the server (a cancel request: ending the job's context only
// closes this end of the connection, and the server would run the statement on), then
// the lease ends (ReasonExpired, with an *OutlivedError), with one log line; its COMMIT is
// refused. A shorter transaction costs the lease nothing: its renewals do not wait for
// the fence.
type txWatch struct {
	timer *time.Timer
	done  chan struct{} // closed once a firing has finished

	mu              sync.Mutex
	stopped, firing bool
}

// watchTx starts the watch of a fenced transaction on conn that began at began.
func (le *Lease) watchTx(conn *pgconn.PgConn, began time.Time) *txWatch {
	w := &txWatch{done: make(chan struct{})}
	w.timer = time.AfterFunc(le.ttl-time.Since(began), func() {
		w.mu.Lock()
		if w.stopped {
			w.mu.Unlock()
			return
		}
		w.firing = true
		w.mu.Unlock()
		defer close(w.done)
		age := time.Since(began)
		cctx, cancel := context.WithTimeout(context.Background(), fenceEndTimeout)
		err := conn.CancelRequest(cctx)
		cancel()
		attrs := []any{"lease", le.Name, "epoch", le.Epoch, "age", age.Round(time.Millisecond), "bound", le.ttl}
		if err != nil {
			attrs = append(attrs, "cancel_err", logging.RedactError(err))
		}
		le.leases.log.Warn("fenced transaction open past its bound, the lease's TTL: its statement is cancelled and "+
			"the lease ends, so that no takeover waits for it any longer", attrs...)
		le.lose(ReasonExpired, &OutlivedError{age: age, bound: le.ttl})
	})
	return w
}

// fired reports whether the watch cancelled the transaction, waiting for it to be done.
func (w *txWatch) fired() bool {
	w.mu.Lock()
	firing := w.firing
	w.mu.Unlock()
	if firing {
		<-w.done
	}
	return firing
}

// end stops the watch once the transaction is over. When it fired, conn is closed rather
// than given back to its pool: the cancel request may still reach the server and cancel
// whatever the connection would run next.
func (w *txWatch) end(conn *pgxpool.Conn) {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	w.timer.Stop()
	if w.fired() {
		cctx, cancel := context.WithTimeout(context.Background(), fenceEndTimeout)
		defer cancel()
		if c := conn.Hijack(); c != nil {
			_ = c.Close(cctx)
		}
	}
}

// commitDeadline is pg_liveness.commit_deadline's value for deadline:
// '<epoch>:<Unix microseconds>:<signature>', signed with the fence's commit key (migration
// 0017), which only this acquisition's token gives, so that the check at commit takes it.
func (le *Lease) commitDeadline(deadline time.Time) string {
	payload := strconv.FormatInt(le.Epoch, 10) + ":" + strconv.FormatInt(deadline.UnixMicro(), 10)
	key := sha256.Sum256([]byte("pg_liveness.commit:" + le.Holder))
	sig := sha256.Sum256([]byte(hex.EncodeToString(key[:]) + ":" + payload))
	return payload + ":" + hex.EncodeToString(sig[:])
}

// endTx rolls back what is left of a transaction on conn after an error, or closes conn
// when that fails, so that the pool never gets a connection inside a transaction back.
func endTx(ctx context.Context, conn *pgx.Conn) {
	if conn.IsClosed() || conn.PgConn().TxStatus() == 'I' {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fenceEndTimeout)
	defer cancel()
	if _, err := conn.Exec(rctx, "ROLLBACK"); err != nil {
		_ = conn.Close(rctx)
	}
}

// fenceFailed turns a fenced write's error into a refusal when the fence refused it,
// and ends the lease when the fence found it not held.
func (le *Lease) fenceFailed(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch pg.Code {
		case sqlStateNotHeld:
			le.lose(ReasonTaken, nil)
			return le.refused(false, err)
		case sqlStateFenceLate:
			return le.refused(false, err)
		case SQLStateCommitLate:
			return le.refused(true, err)
		}
	}
	return fmt.Errorf("liveness: fenced write under lease %q: %w", le.Name, logging.RedactError(err))
}

// refused counts a refused write and returns its error, as Errors.Refused makes it.
func (le *Lease) refused(atCommit bool, err error) error {
	cause := le.Err()
	r := Refusal{Lease: le.Name, Epoch: le.Epoch, Held: cause == nil, AtCommit: atCommit, Err: logging.RedactError(err)}
	var outlived *OutlivedError
	le.leases.noteRefused(le.statName(), r, errors.As(cause, &outlived)) // its watch has said why
	return le.leases.errs.Refused(r)
}

// noteRefused counts a refused write, and logs the first one of each lease name at
// warning level (but one whose cause a line has told already): a healthy leader should
// see none, so the first says that writes are being dropped (by the lease's end, or by a
// network slower than the deadline allows).
func (l *Leases) noteRefused(statName string, fe Refusal, told bool) {
	l.mu.Lock()
	c := l.countsOf(statName)
	c.refused++
	first := !c.refusalTold && !told
	c.refusalTold = c.refusalTold || first
	l.mu.Unlock()
	if first {
		l.log.Warn("fenced write refused (logged once per lease; see the lease's refused count)",
			"lease", fe.Lease, "epoch", fe.Epoch, "held", fe.Held, "at_commit", fe.AtCommit, "err", fe.Err)
	}
}

// blankSQL reports whether sql holds nothing but white space and comments (-- to the end
// of the line, and /* */, which nest in PostgreSQL).
func blankSQL(sql string) bool {
	for {
		sql = strings.TrimLeftFunc(sql, unicode.IsSpace)
		switch {
		case sql == "":
			return true
		case strings.HasPrefix(sql, "--"):
			_, rest, ok := strings.Cut(sql, "\n")
			if !ok {
				return true
			}
			sql = rest
		case strings.HasPrefix(sql, "/*"):
			depth, i := 0, 0
			for i < len(sql) {
				switch {
				case strings.HasPrefix(sql[i:], "/*"):
					depth, i = depth+1, i+2
				case strings.HasPrefix(sql[i:], "*/"):
					depth, i = depth-1, i+2
				default:
					i++
				}
				if depth == 0 {
					break
				}
			}
			if depth > 0 {
				return false // an unclosed comment: the server says what is wrong
			}
			sql = sql[i:]
		default:
			return false
		}
	}
}

// splitParam splits a statement around its one $1.
func splitParam(sql string) [2]string {
	before, after, ok := strings.Cut(sql, "$1")
	if !ok || strings.Contains(after, "$1") {
		panic("liveness: statement without exactly one $1: " + sql)
	}
	return [2]string{before, after}
}
