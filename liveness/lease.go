package liveness

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// MinLeaseTTL is the shortest ttl a lease may have.
const MinLeaseTTL = 100 * time.Millisecond

// minRenewAttempt is the shortest a renewal attempt may wait for its answer: slow links
// answer slowly, and a short ttl leaves no room for retries anyway.
const minRenewAttempt = 2 * time.Second

// runReleaseTimeout bounds one statement that lets a lease go (a release, an abandoned
// acquisition's delete, a lease left to expire), which runs even when the caller's
// context has ended (shutdown), so that other instances can take the lease at once.
const runReleaseTimeout = 5 * time.Second

// ErrLeaseLost matches (errors.Is) every *LeaseLostError, and every error of a fence that
// found its lease not held.
var ErrLeaseLost = errors.New("liveness: lease lost")

// ErrLeaseReleased is the cause of a lease's context after Release.
var ErrLeaseReleased = errors.New("liveness: lease released")

// ErrLeaseHeld is returned by Leases.TryAcquire when another holder has the lease.
var ErrLeaseHeld = errors.New("liveness: the lease is held by another holder")

// errNotAlive refuses an acquisition while the holder instance cannot prove life.
var errNotAlive = errors.New("liveness: this instance cannot prove it is alive")

// errLeftToExpire is the cause of a lease's context when its holder stopped renewing it
// without deleting its row: the lease is free once it expires.
var errLeftToExpire = errors.New("liveness: lease left to expire")

// LeaseLostError is the cause of a lost lease's context. Reasons:
//
//   - LostTaken: a renewal or a fence reached the database and found the lease no longer
//     held under its epoch. Another holder took the lease over, the row was deleted, or
//     it had expired by the database clock.
//   - LostError: the trust window ran out while the most recent renewal attempt had
//     failed with an error (connection refused, pool closed, SQL error). Err is that
//     error. A failed renewal is retried every ttl/16 until the window runs out.
//   - LostExpired: the trust window ran out with no failed attempt to blame: a renewal
//     was still unanswered (a hung network, a stalled server) or none could be sent in
//     time (a paused process).
//   - LostNotAlive: the holder is an Agent's instance that could no longer prove life;
//     it stepped down before the fleet could call it dead and take the lease.
type LeaseLostError struct {
	Name   string
	Epoch  int64
	Reason LostReason
	Err    error
}

func (e *LeaseLostError) Error() string {
	msg := fmt.Sprintf("liveness: lease %q (epoch %d) lost: %s", e.Name, e.Epoch, e.Reason)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is makes errors.Is(err, ErrLeaseLost) true.
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }

func (e *LeaseLostError) Unwrap() error { return e.Err }

// LeasesConfig configures Leases: leases without an alive lock, as the field report's
// design has them. A lease is then free only once it expires; an Agent's campaigns
// (Agent.Elect) are taken over as soon as their holder is dead.
type LeasesConfig struct {
	// Pool runs every lease statement, each on a connection borrowed for that statement
	// alone; no connection is held while a lease is held.
	Pool *pgxpool.Pool
	// Schema holds the migrations' objects; empty means DefaultSchema.
	Schema string
	// Margin is taken off the ttl to get the local trust window. It covers clock-rate
	// differences between this host and the server, and the time a job needs to notice
	// its cancelled context. 0 means ttl/10. It must be below ttl/2.
	Margin time.Duration
	// Logger receives a warning for each lost lease, passwords removed; nil discards.
	Logger *slog.Logger

	// Set by the Agent only: its instance is recorded as the holder of every lease taken,
	// so that readers show who leads and a dead holder's lease can be taken before it
	// expires; a lease is taken only while that instance is alive by the one verdict, and
	// ends the moment life says it can no longer prove that.
	instanceID uuid.UUID
	life       lifeGate
}

// lifeGate says whether this instance can still count on the fleet seeing it alive, and
// what a leadership must wait for before its lease may be trusted (lifeMonitor).
type lifeGate interface {
	Alive() bool
	Changed() <-chan struct{} // closed at the next change of Alive
	// hold is taken just before an acquisition is sent, and lead once it has succeeded
	// (answered at answered): it returns when the lease may be trusted, with done to call
	// when the lease ends, or an error when it may not.
	hold() holdMark
	lead(ctx context.Context, mark holdMark, answered time.Time) (done func(), err error)
	// fenceDeadline is when, on the server's clock, life stops vouching for a leader, if
	// it bounds that at all (lifeMonitor.fenceDeadline).
	fenceDeadline() (deadline time.Time, ok bool)
}

// Leases takes and keeps table leases: singleton jobs held by a row in <schema>.leases,
// never by a connection. Every time is the database's now(); only the local trust window
// uses this host's monotonic clock.
//
// The trust window ends ttl − margin after the last successful acquire or renew
// statement was sent. The server evaluated now() for that statement after it was sent,
// so the window closes at least margin before the row expires by the database clock (at
// equal clock rates): the lease's context is cancelled before anyone else can take it.
type Leases struct {
	pool   *pgxpool.Pool
	stmts  leaseStatements
	margin time.Duration
	log    *slog.Logger
	host   string
	id     *uuid.UUID // the holder instance, or nil
	life   lifeGate
	events *events // the Agent's notifications, which wake its campaigns' followers; nil without
	// fleet is the fleet's size as the Agent's sentry last read it (0: unknown, or no
	// Agent): followers poll rarer in a larger fleet (quietPeriod).
	fleet *atomic.Int64

	mu    sync.Mutex
	names map[string]*leaseCounts
}

type leaseCounts struct {
	held    int
	epochs  map[int64]int // epochs held now, with how many acquisitions hold each
	lost    map[LostReason]uint64
	refused uint64 // fenced writes refused (noteRefused)
}

// NewLeases checks cfg and returns a Leases; errors are *ConfigError.
func NewLeases(cfg LeasesConfig) (*Leases, error) {
	if cfg.Pool == nil {
		return nil, &ConfigError{Field: "LeasesConfig.Pool", Reason: "must be set"}
	}
	if cfg.Margin < 0 {
		return nil, &ConfigError{Field: "LeasesConfig.Margin", Reason: fmt.Sprintf("(%s) must not be negative", cfg.Margin)}
	}
	log := logging.Wrap(cfg.Logger)
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	l := &Leases{
		pool:   cfg.Pool,
		stmts:  newLeaseStatements(cfg.Schema),
		margin: cfg.Margin,
		log:    log,
		host:   host,
		life:   cfg.life,
		names:  map[string]*leaseCounts{},
	}
	if cfg.instanceID != uuid.Nil {
		id := cfg.instanceID
		l.id = &id
	}
	return l, nil
}

// Lease is one acquisition of a named lease. Its context is cancelled when the lease is
// lost, released, or when the context given to TryAcquire ends.
type Lease struct {
	Name string
	// Holder is hostname:pid:64 random bits in hex, new on every acquisition; a ':' or
	// '%' in the host name is percent-escaped. It is a token, not an identity (and never
	// a label value): whoever presents it may renew or release this acquisition, so the
	// leases table keeps only its SHA-256 (migration 0015). Do not log or share it.
	Holder string
	// Epoch is the fencing token: it strictly increases across acquisitions, takeovers,
	// releases and deletes. Fence writes with Fence, or in SQL with
	// <schema>.lease_is_held(Name, Epoch).
	Epoch int64
	// TakenAt is the database time of the acquisition.
	TakenAt time.Time

	leases      *Leases
	ttl         time.Duration
	margin      time.Duration
	ctx         context.Context
	cancel      context.CancelCauseFunc
	window      *time.Timer // cancels the lease when the trust window runs out
	renewerDone chan struct{}
	leading     func()      // ends the leadership of the instance's life; called once the lease ends
	group       *leaseGroup // renews it with others in one statement; nil: renewLoop does

	mu         sync.Mutex
	expiresAt  time.Time // database time
	trustUntil time.Time // monotonic: start of the last successful statement + ttl - margin
	// fenceUntil is trustUntil on the server's clock: expiresAt less that statement's
	// round trip and the margin (FenceDeadline).
	fenceUntil time.Time
	lastErr    error // the most recent renewal attempt's error; nil once it is sent
	ended      bool

	releaseOnce sync.Once
	releaseErr  error
}

// holderID returns hostname:pid:64 random bits, with ':' and '%' in the host name
// percent-escaped so that the token always splits into its three parts.
func (l *Leases) holderID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("liveness: random holder id: %w", err)
	}
	host := strings.NewReplacer("%", "%25", ":", "%3A").Replace(l.host)
	return fmt.Sprintf("%s:%d:%016x", host, os.Getpid(), binary.BigEndian.Uint64(b[:])), nil
}

// marginFor validates name and ttl and returns the margin for ttl.
func (l *Leases) marginFor(name string, ttl time.Duration) (time.Duration, error) {
	if name == "" {
		return 0, errors.New("liveness: lease name is empty")
	}
	if ttl < MinLeaseTTL {
		return 0, fmt.Errorf("liveness: lease %q: ttl %v is below the minimum %v", name, ttl, MinLeaseTTL)
	}
	if l.margin == 0 {
		return ttl / 10, nil
	}
	// Below ttl/2 leaves the window room for the first renewal (at ttl/4) and retries.
	if l.margin >= ttl/2 {
		return 0, fmt.Errorf("liveness: lease %q: LeasesConfig.Margin %v must be below half the ttl %v", name, l.margin, ttl)
	}
	return l.margin, nil
}

// TryAcquire takes the lease name for ttl if nobody holds it or its holder let it
// expire, and returns ErrLeaseHeld when another holder has it. The lease renews itself
// every ttl/4 until Release, a loss, or the end of ctx, which stops the renewals and
// leaves the row to expire; call Release in every case.
func (l *Leases) TryAcquire(ctx context.Context, name string, ttl time.Duration) (*Lease, error) {
	return l.acquire(ctx, ctx, name, ttl)
}

// acquire sends the acquisition under ctx; the lease it returns lives under parent, whose
// end stops its renewals.
func (l *Leases) acquire(ctx, parent context.Context, name string, ttl time.Duration) (*Lease, error) {
	return l.acquireIn(ctx, parent, name, ttl, nil)
}

// acquireIn is acquire for a lease that group renews, with its other leases, in one
// statement (group's ttl is the lease's); a nil group is acquire.
func (l *Leases) acquireIn(ctx, parent context.Context, name string, ttl time.Duration, group *leaseGroup) (*Lease, error) {
	margin, err := l.marginFor(name, ttl)
	if err != nil {
		return nil, err
	}
	holder, err := l.holderID()
	if err != nil {
		return nil, err
	}
	if l.life != nil && !l.life.Alive() {
		// The fleet may be about to call this instance dead: lead nothing until it can
		// prove life again.
		return nil, errNotAlive
	}
	var mark holdMark
	if l.life != nil {
		mark = l.life.hold()
	}
	start := time.Now()
	trustUntil := start.Add(ttl - margin)
	// An answer after the trust window would be a lease we may not trust anyway.
	actx, cancel := context.WithDeadline(ctx, trustUntil)
	defer cancel()
	var (
		epochOrNil       *int64
		taken, expiresAt *time.Time
		heldByLive       bool
		heldBy           *uuid.UUID
	)
	err = l.sendAcquire(actx, trustUntil, func(ctx context.Context, conn *pgxpool.Conn) error {
		return conn.QueryRow(ctx, l.stmts.acquire, name, holder, ttl.Seconds(), l.id, l.host).
			Scan(&epochOrNil, &taken, &expiresAt, &heldByLive, &heldBy)
	})
	if err == nil && epochOrNil == nil {
		held := &leaseHeldError{live: heldByLive}
		if heldBy != nil {
			held.holder = *heldBy
		}
		return nil, held
	}
	var epoch int64
	if err == nil {
		epoch = *epochOrNil
	} else {
		taken, expiresAt = new(time.Time), new(time.Time)
	}
	fenceAt := fenceUntil(*expiresAt, time.Since(start), margin)
	if err == nil && actx.Err() != nil {
		// Taken as the caller gave up: give it back at once rather than at its ttl.
		dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), runReleaseTimeout)
		_, _ = l.pool.Exec(dctx, l.stmts.abandon, name, holder)
		dcancel()
		return nil, fmt.Errorf("liveness: acquire lease %q: %w", name, context.Cause(actx))
	}
	if err != nil {
		if actx.Err() != nil {
			// The insert may have committed before its answer was lost (the caller gave
			// up, or the window ran out): delete what this acquisition may hold, so that
			// the lease does not wait for its ttl.
			dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), runReleaseTimeout)
			_, _ = l.pool.Exec(dctx, l.stmts.abandon, name, holder)
			dcancel()
		}
		return nil, fmt.Errorf("liveness: acquire lease %q: %w", name, logging.RedactError(err))
	}
	leading := func() {}
	if l.life != nil {
		// The lease is not trusted, and no job runs under it, until the alive lock has been
		// proved held since before the acquisition ran: the fleet may call this instance
		// dead one lock grace after its lock vanished, however recently it was renewed.
		if leading, err = l.life.lead(actx, mark, time.Now()); err != nil {
			dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), runReleaseTimeout)
			_, _ = l.pool.Exec(dctx, l.stmts.abandon, name, holder)
			dcancel()
			l.log.Debug("lease given back: the alive lock was not proved held in time", "lease", name, "epoch", epoch, "err", err)
			return nil, errNotAlive
		}
	}

	lctx, lcancel := context.WithCancelCause(parent)
	le := &Lease{
		Name: name, Holder: holder, Epoch: epoch, TakenAt: *taken,
		leases: l, ttl: ttl, margin: margin,
		ctx: lctx, cancel: lcancel,
		renewerDone: make(chan struct{}),
		expiresAt:   *expiresAt, trustUntil: trustUntil, fenceUntil: fenceAt,
		leading: leading, group: group,
	}
	l.noteAcquired(le.statName(), epoch)
	le.mu.Lock()
	le.window = time.AfterFunc(time.Until(trustUntil), le.windowClosed)
	le.mu.Unlock()
	if group != nil {
		group.add(le)
	}
	go le.renewLoop()
	return le, nil
}

// leaseHeldError is a refused acquisition: errors.Is ErrLeaseHeld, and says whether a
// holder alive by the verdict holds the lease, and which instance the row names.
type leaseHeldError struct {
	live   bool
	holder uuid.UUID // uuid.Nil when the row names none, or there is no row
}

func (e *leaseHeldError) Error() string        { return ErrLeaseHeld.Error() }
func (e *leaseHeldError) Is(target error) bool { return target == ErrLeaseHeld }

// sendAcquire runs the acquisition on a connection taken from the pool under ctx, but
// lets the statement itself finish, up to until, even when ctx ends meanwhile: a statement
// given up in flight may still commit on the server after the abandon that follows it,
// leaving a row nobody renews for its whole ttl. The caller looks at ctx afterwards.
func (l *Leases) sendAcquire(ctx context.Context, until time.Time, send func(context.Context, *pgxpool.Conn) error) error {
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	sctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), until)
	defer cancel()
	return send(sctx, conn)
}

// instanceID is the holder instance recorded in the leases taken, or uuid.Nil.
// fleetSize is the fleet's size as last read, 0 when unknown.
func (l *Leases) fleetSize() int {
	if l.fleet == nil {
		return 0
	}
	return int(l.fleet.Load())
}

func (l *Leases) instanceID() uuid.UUID {
	if l.id == nil {
		return uuid.Nil
	}
	return *l.id
}

// Run runs fn under the lease name if it can be taken, and reports whether it ran. When
// another holder has the lease, Run skips the round: false, nil.
//
// fn's context is cancelled when the lease is lost or ctx ends. The lease stays renewed
// until fn returns, also after ctx has ended, and is released only then, with its own
// short deadline: nobody else runs under the lease while fn runs, unless the lease is
// lost (fn's context then says why). A process that dies leaves the lease to expire.
//
// The error joins fn's error, the *LeaseLostError if the lease was lost, and any
// release error.
func (l *Leases) Run(ctx context.Context, name string, ttl time.Duration, fn func(ctx context.Context, lease *Lease) error) (ran bool, err error) {
	lease, err := l.acquire(ctx, context.WithoutCancel(ctx), name, ttl)
	if errors.Is(err, ErrLeaseHeld) || errors.Is(err, errNotAlive) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	fnCtx, cancelFn := context.WithCancelCause(lease.ctx)
	stopFn := context.AfterFunc(ctx, func() { cancelFn(context.Cause(ctx)) })
	defer func() {
		stopFn()
		cancelFn(nil)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runReleaseTimeout)
		defer cancel()
		relErr := lease.Release(rctx)
		var lost error
		if cause := context.Cause(lease.ctx); errors.Is(cause, ErrLeaseLost) {
			lost = cause
			// fn gave up because the loss cancelled its context: the loss is the error, so
			// that filtering out context.Canceled never hides a lost lease.
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				err = nil
			}
		}
		err = errors.Join(err, lost, relErr)
	}()
	return true, fn(fnCtx, lease)
}

// Context is cancelled when the lease is lost, released, or its parent context ends.
func (le *Lease) Context() context.Context { return le.ctx }

// Err is nil while the lease is held. Afterwards it is a *LeaseLostError when the lease
// was lost, ErrLeaseReleased after Release, or the parent context's cause.
func (le *Lease) Err() error {
	if le.ctx.Err() == nil {
		return nil
	}
	return context.Cause(le.ctx)
}

// Fence makes the writes that follow it in tx count only while this lease is held: it
// runs <schema>.lease_is_held(Name, Epoch) in tx, whose FOR SHARE lock on the lease row
// keeps any takeover from committing until tx ends, so every write fenced under this
// epoch commits before the next holder's first. Call it in the transaction that writes,
// before the writes, and roll back when it fails.
//
// It fails with an error that is errors.Is ErrLeaseLost when the lease is not held: it
// has ended in this process (lost, released, its context ended), its row no longer has
// this epoch (taken over, deleted, expired by the database clock), or the fence reached
// the server after FenceDeadline (held back by the network past the moment this process
// stopped trusting the lease); the lease is then ended. Any other error is the
// statement's. tx must be on the leases' database. Keep fenced transactions short: the
// row lock holds back this lease's renewals too.
//
// The deadline is checked when the fence runs, and again at COMMIT (a deferred check the
// fence queues, migration 0009): a COMMIT that reaches the server past FenceDeadline as
// of the fence, held back by the network say, fails with SQLSTATE SQLStateCommitLate
// and rolls tx back, even when Fence's error was ignored. That deadline is fixed when
// Fence runs, so tx must commit within the horizon FenceDeadline states; BeginTx,
// BeginFunc and Exec carry a fresh one with their COMMIT instead, take their connection
// before reading it, and say a refusal with a *FencedError: prefer them. Setting the
// constraints IMMEDIATE (SET CONSTRAINTS ALL IMMEDIATE) in tx moves the check from COMMIT
// to that statement, which defeats it.
//
// lease_is_held looks only at the row's epoch and expiry, not at the holder's life: while
// the holder is dead by the verdict but nobody has taken the lease yet, a write fenced
// under its epoch is still accepted. It still lands before any other holder's, because
// the takeover waits for the fenced transaction.
func (le *Lease) Fence(ctx context.Context, tx pgx.Tx) error {
	if cause := le.Err(); cause != nil {
		le.leases.noteRefused(le.statName(), &FencedError{Lease: le.Name, Epoch: le.Epoch, Err: cause})
		return le.notHeld(cause)
	}
	deadline, late := le.fenceDeadline()
	var held, inTime bool
	if err := tx.QueryRow(ctx, le.leases.stmts.fence, le.Name, le.Epoch, deadline, le.idleLimit()).Scan(&held, &inTime); err != nil {
		return fmt.Errorf("liveness: fence lease %q: %w", le.Name, logging.RedactError(err))
	}
	switch {
	case !held:
		le.end(&LeaseLostError{Name: le.Name, Epoch: le.Epoch, Reason: LostTaken})
	case !inTime:
		// The fence reached the server after this process stopped trusting the lease, or
		// just as it does: whatever the row says, the writes must not count.
		le.end(&LeaseLostError{Name: le.Name, Epoch: le.Epoch, Reason: late})
	}
	if cause := le.Err(); cause != nil { // it ended, here or while the statement ran
		le.leases.noteRefused(le.statName(), &FencedError{Lease: le.Name, Epoch: le.Epoch, Err: cause})
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
func (le *Lease) fenceDeadline() (time.Time, LostReason) {
	le.mu.Lock()
	deadline, ended := le.fenceUntil, le.ended
	le.mu.Unlock()
	if ended || le.ctx.Err() != nil {
		return time.Time{}, LostExpired
	}
	reason := LostExpired
	if life := le.leases.life; life != nil {
		if d, ok := life.fenceDeadline(); ok && d.Before(deadline) {
			deadline, reason = d, LostNotAlive
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
		le.end(ErrLeaseReleased)
		<-le.renewerDone
		le.releaseErr = le.deleteRow(ctx)
	})
	return le.releaseErr
}

// deleteRow sends the release statement: the row goes if it still belongs to this
// acquisition (name, holder and epoch). It may be sent again after a failure; once a
// newer acquisition holds the row, it deletes nothing.
func (le *Lease) deleteRow(ctx context.Context) error {
	if _, err := le.leases.pool.Exec(ctx, le.leases.stmts.release, le.Name, le.Holder, le.Epoch); err != nil {
		return fmt.Errorf("liveness: release lease %q: %w", le.Name, logging.RedactError(err))
	}
	return nil
}

// leaveToExpire stops the renewals without deleting the row, so that the lease is free
// only once it expires. For a holder instance it also clears the row's
// holder_instance_id: otherwise the lease would be free as soon as the instance is dead
// (its process stopping), which is what leaving it to expire must prevent. ctx bounds
// that statement.
func (le *Lease) leaveToExpire(ctx context.Context) error {
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
	life := le.leases.life
	var lifeChanged <-chan struct{}
	for {
		if life != nil {
			lifeChanged = life.Changed() // before Alive, so that no change is missed
			if !life.Alive() {
				le.end(&LeaseLostError{Name: le.Name, Epoch: le.Epoch, Reason: LostNotAlive})
			}
		}
		select {
		case <-le.ctx.Done():
			le.end(nil) // the parent context ended, unless the lease already had
			return
		case <-lifeChanged:
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

// endWhenNotAlive ends the lease the moment life says this instance can no longer prove
// it, while a renewal is in flight: renewLoop looks at life only between renewals, and a
// renewal stuck on a cut-off network waits up to ttl/5, far past the moment the fleet may
// call this instance dead. The returned func stops the watch and waits for it; ending the
// lease cancels ctx, which ends the renewal.
func (le *Lease) endWhenNotAlive(ctx context.Context, life lifeGate) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			changed := life.Changed() // before Alive, so that no change is missed
			if !life.Alive() {
				le.end(&LeaseLostError{Name: le.Name, Epoch: le.Epoch, Reason: LostNotAlive})
				return
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return
			case <-quit:
				return
			}
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
	if life := le.leases.life; life != nil {
		defer le.endWhenNotAlive(rctx, life)()
	}
	var expiresAt time.Time
	err := le.leases.pool.QueryRow(rctx, le.leases.stmts.renew, le.Name, le.Holder, le.Epoch, le.ttl.Seconds()).Scan(&expiresAt)
	switch {
	case err == nil:
		le.extend(expiresAt, sent)
		return true
	case errors.Is(err, pgx.ErrNoRows):
		le.end(&LeaseLostError{Name: le.Name, Epoch: le.Epoch, Reason: LostTaken})
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

// idleLimit is how long a fenced transaction may idle between its statements before the
// server ends its session (idle_in_transaction_session_timeout, set by the fence for the
// transaction only): the lease's ttl. A holder that hangs with a fenced transaction open
// holds the lease row's lock, and so every takeover; the limit ends that hold no later
// than the lease itself would have ended.
func (le *Lease) idleLimit() string { return strconv.FormatInt(le.ttl.Milliseconds(), 10) + "ms" }

// statName is the name the lease counts under in Leases.Stats: its own, or for a lease a
// group renews (a shard set's) the group's, so that a thousand shards are one entry.
func (le *Lease) statName() string {
	if le.group != nil {
		return le.group.statName
	}
	return le.Name
}

// extend takes a renewal sent at sent that answered expiresAt: the trust window runs
// from when it was sent (the server's now() came later).
func (le *Lease) extend(expiresAt, sent time.Time) {
	roundTrip := time.Since(sent)
	le.mu.Lock()
	defer le.mu.Unlock()
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
		return // a renewal extended the window while this timer fired
	}
	lost := &LeaseLostError{Name: le.Name, Epoch: le.Epoch, Reason: LostExpired}
	if le.lastErr != nil {
		lost.Reason, lost.Err = LostError, le.lastErr
	}
	le.endLocked(lost)
}

func (le *Lease) end(cause error) {
	le.mu.Lock()
	defer le.mu.Unlock()
	le.endLocked(cause)
}

// endLocked ends the lease once: it stops the window timer, cancels the context with
// cause and updates the counts. A nil cause, or a context the parent already ended, means
// the parent context ended it; that is not a loss.
func (le *Lease) endLocked(cause error) {
	if le.ended {
		return
	}
	le.ended = true
	le.window.Stop()
	defer le.leading() // after the cancel: the job's context ends first
	var lost *LeaseLostError
	if le.ctx.Err() != nil || !errors.As(cause, &lost) {
		lost = nil
	}
	// Count and log first: whoever wakes on Done must see the loss.
	le.leases.noteEnded(le.statName(), le.Epoch, lost)
	if lost != nil {
		attrs := []any{"lease", le.Name, "epoch", le.Epoch, "reason", string(lost.Reason)}
		if lost.Err != nil {
			attrs = append(attrs, "err", lost.Err)
		}
		le.leases.log.Warn("lease lost; cancelling its context", attrs...)
	}
	le.cancel(cause) // no-op when the parent already cancelled it
}

func (l *Leases) counts(name string) *leaseCounts {
	c := l.names[name]
	if c == nil {
		c = &leaseCounts{epochs: map[int64]int{}, lost: map[LostReason]uint64{}}
		l.names[name] = c
	}
	return c
}

func (l *Leases) noteAcquired(name string, epoch int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.counts(name)
	c.held++
	c.epochs[epoch]++
}

func (l *Leases) noteEnded(name string, epoch int64, lost *LeaseLostError) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.counts(name)
	c.held--
	if c.epochs[epoch]--; c.epochs[epoch] <= 0 {
		delete(c.epochs, epoch)
	}
	if lost != nil {
		c.lost[lost.Reason]++
	}
}

// Stats lists every name this Leases has acquired, sorted by Name. Lost has every reason,
// zero included.
func (l *Leases) Stats() []LeaseStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]LeaseStats, 0, len(l.names))
	for name, c := range l.names {
		lost := map[LostReason]uint64{LostExpired: 0, LostTaken: 0, LostError: 0, LostNotAlive: 0}
		for r, n := range c.lost {
			lost[r] = n
		}
		var epoch int64
		for e := range c.epochs {
			epoch = max(epoch, e)
		}
		out = append(out, LeaseStats{Name: name, Held: c.held > 0, Epoch: epoch, Lost: lost, FencedRefused: c.refused})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// leaseStatements are the lease statements (internal/store/sql/leases.sql) rendered for one
// schema, once, when the Leases are built.
type leaseStatements struct {
	acquire, renew, release, abandon, leader, fence, detach string
	renewMany, shardMembers                                 string
	// fenceStrict is Exec's and BeginTx's fence; fenceCommit[0] + the deadline literal +
	// fenceCommit[1] + "; COMMIT" is their COMMIT (lease_fence_commit, its $1 inlined).
	fenceStrict string
	fenceCommit [2]string
}

func newLeaseStatements(schema string) leaseStatements {
	return leaseStatements{
		acquire: store.LeaseAcquire.In(schema).SQL,
		renew:   store.LeaseRenew.In(schema).SQL,
		release: store.LeaseRelease.In(schema).SQL,
		abandon: store.LeaseAbandon.In(schema).SQL,
		leader:  store.LeaseLeader.In(schema).SQL,
		fence:   store.LeaseFence.In(schema).SQL,
		detach:  store.LeaseDetach.In(schema).SQL,

		renewMany:    store.LeaseRenewMany.In(schema).SQL,
		shardMembers: store.ShardMembers.In(schema).SQL,

		fenceStrict: store.LeaseFenceStrict.In(schema).SQL,
		fenceCommit: splitParam(store.LeaseFenceCommit.In(schema).SQL),
	}
}
