// Leases, and taking a lease: the Lease type, TryAcquire and Run, and the statements
// they send.

package liveness

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
	"github.com/pg-liveness/pg_liveness_exporter/internal/notify"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// MinLeaseTTL is the shortest ttl a lease may have.
const MinLeaseTTL = 100 * time.Millisecond

// runReleaseTimeout bounds one statement that lets a lease go (a release, an abandoned
// acquisition's delete, a lease left to expire), which runs even when the caller's
// context has ended (shutdown), so that other instances can take the lease at once.
const runReleaseTimeout = 5 * time.Second

// ErrLeaseHeld is returned by Leases.TryAcquire when another holder has the lease.
var ErrLeaseHeld = errors.New("liveness: the lease is held by another holder")

// errNotAlive refuses an acquisition while the holder instance cannot prove life.
var errNotAlive = errors.New("liveness: this instance cannot prove it is alive")

// LeasesConfig configures Leases: leases in a table and nothing else, no alive lock (the
// design that replaced a session advisory lock held on a pool connection). A lease is
// then free only once it expires; an Agent's campaigns (Agent.Elect) are taken over as
// soon as their holder is dead.
type LeasesConfig struct {
	// Pool runs every lease statement, each on a connection borrowed for that statement
	// alone; no connection is held while a lease is held.
	Pool *pgxpool.Pool
	// Schema holds the migrations' objects; empty means "liveness".
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

// lifeGate says whether this instance, leading nothing, can count on the fleet seeing it
// alive, and gives each lease it takes a leadership that says so for a leader
// (lifeMonitor).
type lifeGate interface {
	Alive() bool
	Changed() <-chan struct{} // closed at the next change of Alive
	// hold is taken just before an acquisition is sent, and lead once it has succeeded
	// (answered at answered): it returns when the lease may be trusted, with the
	// leadership the lease follows (stop it when the lease ends), or an error when it may
	// not be trusted.
	hold() holdMark
	lead(ctx context.Context, mark holdMark, answered time.Time) (*leadership, error)
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
	events *notify.Hub // the Agent's notifications, which wake its campaigns' followers; nil without
	// fleet is the fleet's size as the Agent's sentry last read it (0: unknown, or no
	// Agent): followers poll rarer in a larger fleet (quietPeriod).
	fleet *atomic.Int64

	mu    sync.Mutex
	names map[string]*leaseCounts
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
	life        *leadership // the instance's trust as this lease's leader; nil without an Agent
	// lifeShares counts the leases of one batch (acquireMany) that follow life and have
	// not ended: the last to end stops it. nil: this lease alone follows it.
	lifeShares *atomic.Int64
	group      *leaseGroup // renews it with others in one statement; nil: renewLoop does
	// inBatch: taken by acquireMany, it has no renewLoop: its group renews it, its
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
	l.abandonUnanswered(ctx)
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
	var life *leadership
	if l.life != nil {
		// The lease is not trusted, and no job runs under it, until the alive lock has been
		// proved held since before the acquisition ran: the fleet may call this instance
		// dead one lock grace after its lock vanished, however recently it was renewed.
		if life, err = l.life.lead(actx, mark, time.Now()); err != nil {
			l.giveBack(ctx, []string{name}, []string{holder}, ttl)
			l.log.Debug("lease given back: the alive lock was not proved held in time", "lease", name, "epoch", epoch, "err", err)
			return nil, errNotAlive
		}
	}

	le := l.newLease(parent, name, holder, epoch, *taken, *expiresAt, trustUntil, fenceAt, ttl, margin, life, nil, group)
	go le.renewLoop()
	return le, nil
}

// newLease is a lease just taken, its trust window running and its group (if any)
// renewing it; whoever calls it starts renewLoop, or, for a lease of a batch (shares of
// its leadership not nil: acquireMany), ends it with its batch.
func (l *Leases) newLease(parent context.Context, name, holder string, epoch int64, taken, expiresAt, trustUntil,
	fenceAt time.Time, ttl, margin time.Duration, life *leadership, shares *atomic.Int64, group *leaseGroup) *Lease {
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

// leaseStatements are the lease statements (internal/store/sql/leases.sql) rendered for one
// schema, once, when the Leases are built.
type leaseStatements struct {
	acquire, renew, release, abandon, leader, fence, detach string
	// A shard set member's: many leases at once.
	renewMany, acquireMany, abandonMany, releaseMany, detachMany, shardMembers, shardFree string
	// fenceStrict is BeginTx's fence; fenceCommit[0] + the deadline literal +
	// fenceCommit[1] + "; COMMIT" is its COMMIT (lease_fence_commit, its $1 inlined);
	// fenceExec is Exec's, in one pipeline with its write.
	fenceStrict string
	fenceCommit [2]string
	fenceExec   string
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
		acquireMany:  store.LeaseAcquireMany.In(schema).SQL,
		abandonMany:  store.LeaseAbandonMany.In(schema).SQL,
		releaseMany:  store.LeaseReleaseMany.In(schema).SQL,
		detachMany:   store.LeaseDetachMany.In(schema).SQL,
		shardMembers: store.ShardMembers.In(schema).SQL,
		shardFree:    store.ShardFree.In(schema).SQL,

		fenceStrict: store.LeaseFenceStrict.In(schema).SQL,
		fenceCommit: splitParam(store.LeaseFenceCommit.In(schema).SQL),
		fenceExec:   store.LeaseFenceExec.In(schema).SQL,
	}
}
