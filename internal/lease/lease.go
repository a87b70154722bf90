// Leases, and taking a lease: Leases, the Lease type, Acquire and Run, what they need of
// the library (Gate, Errors), and the statements they send.

package lease

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// MinTTL is the shortest ttl a lease may have (the library's MinLeaseTTL).
const MinTTL = 100 * time.Millisecond

// ReleaseTimeout bounds one statement that lets a lease go (a release, an abandoned
// acquisition's delete, a lease left to expire), which runs even when the caller's
// context has ended (shutdown), so that other instances can take the lease at once.
const ReleaseTimeout = 5 * time.Second

// ErrNotAlive refuses an acquisition while the holder instance cannot prove life.
var ErrNotAlive = errors.New("liveness: this instance cannot prove it is alive")

// Config configures Leases. The library checks it (its LeasesConfig) before New.
type Config struct {
	// Pool runs every lease statement, each on a connection borrowed for that statement
	// alone; no connection is held while a lease is held.
	Pool *pgxpool.Pool
	// Schema holds the migrations' objects; empty means "liveness".
	Schema string
	// Margin is taken off the ttl to get the local trust window; 0 means ttl/10.
	Margin time.Duration
	// Logger receives a warning for each lost lease; it removes passwords already.
	Logger *slog.Logger
	// Errors makes the errors users see.
	Errors Errors

	// InstanceID, for an Agent's leases: its instance is recorded as the holder of every
	// lease taken, so that readers show who leads and a dead holder's lease can be taken
	// before it expires. Gate: a lease is taken only while that instance is alive by the
	// one verdict, and ends the moment the gate says it can no longer prove that. Both
	// zero without an Agent.
	InstanceID uuid.UUID
	Gate       Gate
}

// Errors makes the errors users see from what this package found: the library's public
// types and sentinels, which a package below it cannot name. Every error a lease's
// context ends with, and every refused fenced write, is made by it.
type Errors struct {
	// Held is what a refused acquisition matches (errors.Is).
	Held error
	// Lost is what a fence's error matches when the lease is not held.
	Lost error
	// Released is the cause of a released lease's context.
	Released error
	// LostLease is the cause of a lost lease's context.
	LostLease func(Loss) error
	// Refused is a refused fenced write's error.
	Refused func(Refusal) error
}

// Gate says whether this instance, leading nothing, can count on the fleet seeing it
// alive, and gives each lease it takes a Leadership that says so for a leader (the
// library's life monitor, over internal/lifegate).
type Gate interface {
	Alive() bool
	// Hold is taken just before an acquisition is sent, and Lead once it has succeeded
	// (answered at answered): Lead returns when the lease may be trusted, with the
	// leadership the lease follows (stopped when the lease ends), or an error when it may
	// not be trusted.
	Hold() HoldMark
	Lead(ctx context.Context, mark HoldMark, answered time.Time) (Leadership, error)
}

// HoldMark is what Gate.Hold saw before an acquisition was sent: whether the alive lock
// was held, and by which claim.
type HoldMark struct {
	Held  bool
	Claim uint64
}

// Leadership is one lease's trust in the gate: it ends for good the first time the
// clock reaches the leader's deadline in force.
type Leadership interface {
	// Over is closed once the leadership has ended.
	Over() <-chan struct{}
	// FenceDeadline is the moment, on the server's clock, past which a write fenced now
	// must be refused; false when it must be refused already.
	FenceDeadline() (time.Time, bool)
	// Stop is called once the lease has ended.
	Stop()
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
	stmts  statements
	margin time.Duration
	log    *slog.Logger
	errs   Errors
	host   string
	id     *uuid.UUID // the holder instance, or nil
	gate   Gate       // nil without an Agent

	mu    sync.Mutex
	names map[string]*counts
	// unanswered are, by lease name, the holder tokens of acquisitions that may hold a
	// row this process never learned of, until they are deleted or their ttl has passed
	// (giveBack).
	unanswered map[string][]unansweredTake
}

// unansweredTake is an acquisition that may hold a row nobody renews: its answer was
// lost, or it was taken when nobody wanted it any more, and the abandon has not landed.
type unansweredTake struct {
	holder  string
	expires time.Time
}

// New returns a Leases for cfg, which the library has checked.
func New(cfg Config) *Leases {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	l := &Leases{
		pool:   cfg.Pool,
		stmts:  newStatements(cfg.Schema),
		margin: cfg.Margin,
		log:    cfg.Logger,
		errs:   cfg.Errors,
		host:   host,
		gate:   cfg.Gate,
		names:  map[string]*counts{},
	}
	if cfg.InstanceID != uuid.Nil {
		id := cfg.InstanceID
		l.id = &id
	}
	return l
}

// Lease is one acquisition of a named lease. Its context is cancelled when the lease is
// lost, released, or when its parent context ends. Name, Holder, Epoch and TakenAt are
// the library's Lease's (which documents them).
type Lease struct {
	Name    string
	Holder  string // a token: whoever presents it may renew or release this acquisition
	Epoch   int64
	TakenAt time.Time

	leases      *Leases
	ttl         time.Duration
	margin      time.Duration
	ctx         context.Context
	cancel      context.CancelCauseFunc
	window      *time.Timer // cancels the lease when the trust window runs out
	renewerDone chan struct{}
	life        Leadership // the instance's trust as this lease's leader; nil without an Agent
	// lifeShares counts the leases of one batch (AcquireMany) that follow life and have
	// not ended: the last to end stops it. nil: this lease alone follows it.
	lifeShares *atomic.Int64
	group      *Group // renews it with others in one statement; nil: renewLoop does
	// inBatch: taken by AcquireMany, it has no renewLoop: its group renews it, its
	// batch's watch ends it with life, and it leaves its group when it ends.
	inBatch bool

	mu         sync.Mutex
	expiresAt  time.Time // database time
	trustUntil time.Time // monotonic: start of the last successful statement + ttl - margin
	// fenceUntil is trustUntil on the server's clock: expiresAt less that statement's
	// round trip and the margin (FenceDeadline).
	fenceUntil time.Time
	lastErr    error // the most recent renewal attempt's error; nil once it is sent
	ended      bool
	loss       *Loss // why it was lost, once it was (endLocked)

	releaseOnce sync.Once
	releaseErr  error // guarded by mu
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
	if ttl < MinTTL {
		return 0, fmt.Errorf("liveness: lease %q: ttl %v is below the minimum %v", name, ttl, MinTTL)
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

// Acquire takes the lease name for ttl if nobody holds it or its holder let it expire,
// and returns a *HeldError (errors.Is the library's ErrLeaseHeld) when another holder has
// it, ErrNotAlive while the instance cannot prove life. It sends the acquisition under
// ctx; the lease it returns lives under parent, whose end stops its renewals (and leaves
// the row to expire). The lease renews itself every ttl/4 until Release, a loss, or the
// end of parent.
func (l *Leases) Acquire(ctx, parent context.Context, name string, ttl time.Duration) (*Lease, error) {
	return l.AcquireIn(ctx, parent, name, ttl, nil)
}

// AcquireIn is Acquire for a lease that group renews, with its other leases, in one
// statement (group's ttl is the lease's); a nil group is Acquire.
func (l *Leases) AcquireIn(ctx, parent context.Context, name string, ttl time.Duration, group *Group) (*Lease, error) {
	margin, err := l.marginFor(name, ttl)
	if err != nil {
		return nil, err
	}
	holder, err := l.holderID()
	if err != nil {
		return nil, err
	}
	if l.gate != nil && !l.gate.Alive() {
		// The fleet may be about to call this instance dead: lead nothing until it can
		// prove life again.
		return nil, ErrNotAlive
	}
	var mark HoldMark
	if l.gate != nil {
		mark = l.gate.Hold()
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
	l.abandonUnanswered(ctx)
	err = l.sendAcquire(actx, trustUntil, func(ctx context.Context, conn *pgxpool.Conn) error {
		return conn.QueryRow(ctx, l.stmts.acquire, name, holder, ttl.Seconds(), l.id, l.host).
			Scan(&epochOrNil, &taken, &expiresAt, &heldByLive, &heldBy)
	})
	if err == nil && epochOrNil == nil {
		held := &HeldError{Live: heldByLive, Err: l.errs.Held}
		if heldBy != nil {
			held.Holder = *heldBy
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
		l.giveBack(ctx, []string{name}, []string{holder}, ttl)
		return nil, fmt.Errorf("liveness: acquire lease %q: %w", name, context.Cause(actx))
	}
	if err != nil {
		// The insert may have committed before its answer was lost (the caller gave up,
		// the window ran out, the connection was cut, the server is restarting): delete
		// what this acquisition may hold, so that the lease does not wait for its ttl.
		l.giveBack(ctx, []string{name}, []string{holder}, ttl)
		return nil, fmt.Errorf("liveness: acquire lease %q: %w", name, logging.RedactError(err))
	}
	var life Leadership
	if l.gate != nil {
		// The lease is not trusted, and no job runs under it, until the alive lock has been
		// proved held since before the acquisition ran: the fleet may call this instance
		// dead one lock grace after its lock vanished, however recently it was renewed.
		if life, err = l.gate.Lead(actx, mark, time.Now()); err != nil {
			l.giveBack(ctx, []string{name}, []string{holder}, ttl)
			l.log.Debug("lease given back: the alive lock was not proved held in time", "lease", name, "epoch", epoch, "err", err)
			return nil, ErrNotAlive
		}
	}

	le := l.newLease(parent, name, holder, epoch, *taken, *expiresAt, trustUntil, fenceAt, ttl, margin, life, nil, group)
	go le.renewLoop()
	return le, nil
}

// newLease is a lease just taken, its trust window running and its group (if any)
// renewing it; whoever calls it starts renewLoop, or, for a lease of a batch (shares of
// its leadership not nil: AcquireMany), ends it with its batch.
func (l *Leases) newLease(parent context.Context, name, holder string, epoch int64, taken, expiresAt, trustUntil,
	fenceAt time.Time, ttl, margin time.Duration, life Leadership, shares *atomic.Int64, group *Group) *Lease {
	lctx, lcancel := context.WithCancelCause(parent)
	le := &Lease{
		Name: name, Holder: holder, Epoch: epoch, TakenAt: taken,
		leases: l, ttl: ttl, margin: margin,
		ctx: lctx, cancel: lcancel,
		renewerDone: make(chan struct{}),
		expiresAt:   expiresAt, trustUntil: trustUntil, fenceUntil: fenceAt,
		life: life, lifeShares: shares, group: group, inBatch: shares != nil,
	}
	l.noteAcquired(le.statName(), epoch)
	le.mu.Lock()
	le.window = time.AfterFunc(time.Until(trustUntil), le.windowClosed)
	le.mu.Unlock()
	if group != nil {
		group.add(le)
	}
	return le
}

// HeldError is a refused acquisition: it says whether a holder alive by the verdict
// holds the lease, and which instance the row names. It unwraps to Err, the library's
// ErrLeaseHeld (Errors.Held).
type HeldError struct {
	Live   bool
	Holder uuid.UUID // uuid.Nil when the row names none, or there is no row
	Err    error
}

func (e *HeldError) Error() string { return e.Err.Error() }
func (e *HeldError) Unwrap() error { return e.Err }

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

// InstanceID is the holder instance recorded in the leases taken, or uuid.Nil.
func (l *Leases) InstanceID() uuid.UUID {
	if l.id == nil {
		return uuid.Nil
	}
	return *l.id
}

// Host is this host's name, as the leases taken record it.
func (l *Leases) Host() string { return l.host }

// Log is the leases' logger.
func (l *Leases) Log() *slog.Logger { return l.log }

// Pool is the pool the leases' statements run on.
func (l *Leases) Pool() *pgxpool.Pool { return l.pool }

// Run runs fn under the lease name if it can be taken, and reports whether it ran: the
// library's Leases.Run, which documents it.
func (l *Leases) Run(ctx context.Context, name string, ttl time.Duration, fn func(ctx context.Context, lease *Lease) error) (ran bool, err error) {
	lease, err := l.Acquire(ctx, context.WithoutCancel(ctx), name, ttl)
	var held *HeldError
	if errors.As(err, &held) || errors.Is(err, ErrNotAlive) {
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
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ReleaseTimeout)
		defer cancel()
		relErr := lease.Release(rctx)
		var lost error
		if lease.Loss() != nil {
			lost = context.Cause(lease.ctx)
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

// statements are the lease statements (internal/store/sql/leases.sql) rendered for one
// schema, once, when the Leases are built.
type statements struct {
	acquire, renew, release, abandon, fence, detach string
	// A shard set member's: many leases at once.
	renewMany, acquireMany, abandonMany, releaseMany, detachMany string
	// fenceStrict is BeginTx's fence; fenceCommit[0] + the deadline literal +
	// fenceCommit[1] + "; COMMIT" is its COMMIT (lease_fence_commit, its $1 inlined);
	// fenceExec is Exec's, in one pipeline with its write.
	fenceStrict string
	fenceCommit [2]string
	fenceExec   string
}

func newStatements(schema string) statements {
	return statements{
		acquire: store.LeaseAcquire.In(schema).SQL,
		renew:   store.LeaseRenew.In(schema).SQL,
		release: store.LeaseRelease.In(schema).SQL,
		abandon: store.LeaseAbandon.In(schema).SQL,
		fence:   store.LeaseFence.In(schema).SQL,
		detach:  store.LeaseDetach.In(schema).SQL,

		renewMany:   store.LeaseRenewMany.In(schema).SQL,
		acquireMany: store.LeaseAcquireMany.In(schema).SQL,
		abandonMany: store.LeaseAbandonMany.In(schema).SQL,
		releaseMany: store.LeaseReleaseMany.In(schema).SQL,
		detachMany:  store.LeaseDetachMany.In(schema).SQL,

		fenceStrict: store.LeaseFenceStrict.In(schema).SQL,
		fenceCommit: splitParam(store.LeaseFenceCommit.In(schema).SQL),
		fenceExec:   store.LeaseFenceExec.In(schema).SQL,
	}
}
