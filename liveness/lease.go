// Leases and a lease, as users hold them: the names, the errors and the guarantees. The
// mechanism (acquisition, renewal, trust window, fence, fenced transactions, batches) is
// internal/lease's; these types hand each call to it, and make the errors it reports.

package liveness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/lease"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/notify"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// MinLeaseTTL is the shortest ttl a lease may have.
const MinLeaseTTL = 100 * time.Millisecond

// ErrLeaseHeld is returned by Leases.TryAcquire when another holder has the lease.
var ErrLeaseHeld = errors.New("liveness: the lease is held by another holder")

// ErrLeaseLost matches (errors.Is) every *LeaseLostError, and every error of a fence that
// found its lease not held.
var ErrLeaseLost = errors.New("liveness: lease lost")

// ErrLeaseReleased is the cause of a lease's context after Release.
var ErrLeaseReleased = errors.New("liveness: lease released")

// ErrFenced matches (errors.Is) every *FencedError: a fenced write that was refused, of
// which nothing committed.
var ErrFenced = errors.New("liveness: fenced write refused")

// SQLStateCommitLate is the SQLSTATE of a COMMIT that the server refused because it
// came past the deadline of a fence in its transaction (migration 0009's check at
// commit): what a transaction committed by its own caller after Lease.Fence gets, as a
// *pgconn.PgError. The transaction is rolled back. Lease.BeginTx's Commit returns a
// *FencedError instead.
const SQLStateCommitLate = "LVF03"

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
	life       *lifeMonitor
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
	in    *lease.Leases
	pool  *pgxpool.Pool
	stmts campaignStatements
	log   *slog.Logger
	life  *lifeMonitor // the Agent's; nil without one
	// events are the Agent's notifications, which wake its campaigns' followers; nil
	// without an Agent.
	events *notify.Hub
	// fleet is the fleet's size as the Agent's sentry last read it (0: unknown, or no
	// Agent): followers poll rarer in a larger fleet (quietPeriod).
	fleet *atomic.Int64
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
	lc := lease.Config{Pool: cfg.Pool, Schema: cfg.Schema, Margin: cfg.Margin, Logger: log, Errors: leaseErrors,
		InstanceID: cfg.instanceID}
	if cfg.life != nil { // a nil *lifeMonitor in the interface would not be a nil Gate
		lc.Gate = cfg.life
	}
	return &Leases{in: lease.New(lc), pool: cfg.Pool, stmts: newCampaignStatements(cfg.Schema), log: log, life: cfg.life}, nil
}

// campaignStatements are the statements the campaigns and the shard sets send beside
// their leases' (internal/store/sql/leases.sql), rendered once for one schema.
type campaignStatements struct {
	leader, shardMembers, shardFree string
}

func newCampaignStatements(schema string) campaignStatements {
	return campaignStatements{
		leader:       store.LeaseLeader.In(schema).SQL,
		shardMembers: store.ShardMembers.In(schema).SQL,
		shardFree:    store.ShardFree.In(schema).SQL,
	}
}

// acquire takes name under ctx, for a lease that lives under parent, whose end stops its
// renewals (lease.Leases.Acquire).
func (l *Leases) acquire(ctx, parent context.Context, name string, ttl time.Duration) (*Lease, error) {
	in, err := l.in.Acquire(ctx, parent, name, ttl)
	if err != nil {
		return nil, err
	}
	return newLease(in), nil
}

// acquireIn is acquire for a lease that group renews with its others in one statement.
func (l *Leases) acquireIn(ctx, parent context.Context, name string, ttl time.Duration, group *lease.Group) (*Lease, error) {
	in, err := l.in.AcquireIn(ctx, parent, name, ttl, group)
	if err != nil {
		return nil, err
	}
	return newLease(in), nil
}

// acquireMany takes those of names that are free in one statement, for group
// (lease.Leases.AcquireMany).
func (l *Leases) acquireMany(ctx context.Context, names []string, group *lease.Group) ([]*Lease, error) {
	in, err := l.in.AcquireMany(ctx, names, group)
	les := make([]*Lease, len(in))
	for i, le := range in {
		les[i] = newLease(le)
	}
	return les, err
}

// releaseMany, deleteRows and leaveManyToExpire are lease.Leases' for many leases at once.
func (l *Leases) releaseMany(ctx context.Context, les []*Lease) error {
	return l.in.ReleaseMany(ctx, inner(les))
}
func (l *Leases) deleteRows(ctx context.Context, les []*Lease) error {
	return l.in.DeleteRows(ctx, inner(les))
}
func (l *Leases) leaveManyToExpire(ctx context.Context, les []*Lease) error {
	return l.in.LeaveManyToExpire(ctx, inner(les))
}

// inner is the leases internal/lease holds of les.
func inner(les []*Lease) []*lease.Lease {
	in := make([]*lease.Lease, len(les))
	for i, le := range les {
		in[i] = le.in
	}
	return in
}

// instanceID is the holder instance recorded in the leases taken, or uuid.Nil.
func (l *Leases) instanceID() uuid.UUID { return l.in.InstanceID() }

// fleetSize is the fleet's size as last read, 0 when unknown.
func (l *Leases) fleetSize() int {
	if l.fleet == nil {
		return 0
	}
	return int(l.fleet.Load())
}

// leaseErrors are the errors internal/lease reports through: this package's types.
var leaseErrors = lease.Errors{
	Held:      ErrLeaseHeld,
	Lost:      ErrLeaseLost,
	Released:  ErrLeaseReleased,
	LostLease: func(l lease.Loss) error { e := LeaseLostError(l); return &e },
	Refused:   func(r lease.Refusal) error { e := FencedError(r); return &e },
}

// TryAcquire takes the lease name for ttl if nobody holds it or its holder let it
// expire, and returns ErrLeaseHeld when another holder has it. The lease renews itself
// every ttl/4 until Release, a loss, or the end of ctx, which stops the renewals and
// leaves the row to expire; call Release in every case.
func (l *Leases) TryAcquire(ctx context.Context, name string, ttl time.Duration) (*Lease, error) {
	return l.acquire(ctx, ctx, name, ttl)
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
	return l.in.Run(ctx, name, ttl, func(ctx context.Context, in *lease.Lease) error { return fn(ctx, newLease(in)) })
}

// Stats lists every name this Leases has acquired, sorted by Name. Lost has every reason,
// zero included.
func (l *Leases) Stats() []LeaseStats {
	in := l.in.Stats()
	out := make([]LeaseStats, len(in))
	for i, s := range in {
		out[i] = LeaseStats(s)
	}
	return out
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

	in *lease.Lease
}

// newLease is the Lease users hold of in.
func newLease(in *lease.Lease) *Lease {
	return &Lease{Name: in.Name, Holder: in.Holder, Epoch: in.Epoch, TakenAt: in.TakenAt, in: in}
}

// Context is cancelled when the lease is lost, released, or its parent context ends.
func (le *Lease) Context() context.Context { return le.in.Context() }

// Err is nil while the lease is held. Afterwards it is a *LeaseLostError when the lease
// was lost, ErrLeaseReleased after Release, or the parent context's cause.
func (le *Lease) Err() error { return le.in.Err() }

// ExpiresAt is the database time the lease expires at, as of the last successful
// renewal.
func (le *Lease) ExpiresAt() time.Time { return le.in.ExpiresAt() }

// Release stops the renewals, waits for the renewer to exit, cancels the lease's context
// and deletes the row if it still belongs to this acquisition (name, holder and epoch), so
// a late Release never deletes a newer holder's lease. It is safe to call more than once
// and after a loss; later calls return the first call's error.
func (le *Lease) Release(ctx context.Context) error { return le.in.Release(ctx) }

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
func (le *Lease) Fence(ctx context.Context, tx pgx.Tx) error { return le.in.Fence(ctx, tx) }

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
func (le *Lease) FenceDeadline() time.Time { return le.in.FenceDeadline() }

// Exec runs sql with args as one fenced transaction under this lease, in one round trip:
// the fence and the statement go in one pipeline, without BEGIN or COMMIT, and run as
// one implicit transaction that commits at the pipeline's end. It returns the
// statement's command tag, or a *FencedError (errors.Is ErrFenced) when the write was
// refused: the lease is not held under Epoch, or the write reached the server, or
// committed, past the lease's deadline (FenceDeadline) as of when it was sent. A refused
// write never commits, so a write is either counted under this epoch, committed before
// any later holder's first, or an error. An error that is not a *FencedError after the
// statement ran (the connection lost as it committed, say) leaves the outcome unknown,
// as for any COMMIT.
//
// The connection is taken from db first and the deadline read after, so a wait for a
// connection never counts against it. The time the statement takes does: its COMMIT
// leaves with it, so the check at commit holds it to the deadline as of the send. A
// statement that outlasts that (a row lock's wait, a slow plan), for a lease still held,
// is rolled back and run once more as a transaction whose COMMIT is sent on its own with
// the deadline as of then (two round trips, and the statement's work twice): a healthy
// leader's slow write lands. Only the time that COMMIT takes to reach the server counts
// then: it is refused when that is past the moment this process would stop trusting the
// lease, by FenceDeadline's rule (half to three quarters of the lock grace ahead for a
// healthy leader of an Agent).
//
// One round trip once the statements are prepared on the connection: pgx's default
// statement cache prepares a new statement in a round trip of its own, once.
//
// A fenced transaction (Exec's, BeginTx's, BeginFunc's) lasts at most the lease's TTL
// from its start: it holds the lease row FOR KEY SHARE, so that any takeover waits for
// it, and one that never ended would hold every other holder back. Shorter, it costs no
// lease, its own included (renewals do not wait for the fence). Past the TTL, its running
// statement is cancelled on the server, its lease ends (a *LeaseLostError, Reason "expired",
// whose Err names the transaction's age and the bound), with one warning line, and the
// write is a *FencedError; other leases are not touched. It may also idle between its
// statements at most the TTL: the server then ends its session, and its COMMIT is a
// *FencedError. A job whose write may take longer needs a longer TTL, or to split the
// write.
//
// sql must be a single statement without transaction control (one that leaves a
// transaction open is rolled back, with an error). db must be a pool on the leases'
// database and schema.
func (le *Lease) Exec(ctx context.Context, db *pgxpool.Pool, sql string, args ...any) (pgconn.CommandTag, error) {
	return le.in.Exec(ctx, db, sql, args...)
}

// BeginTx begins a transaction on a connection of its own from db, fenced under this
// lease: its fence runs first, and its Commit is refused unless it reaches the server
// before the lease's deadline as of when Commit is called. Errors are as Exec's: a
// *FencedError when the fence or the COMMIT is refused. The connection goes back to db
// at Commit or Rollback: call one of them. The fence holds the lease row FOR KEY SHARE
// until the transaction ends: a takeover waits for it, this lease's renewals do not. The
// transaction lasts at most the lease's TTL from BeginTx, as Exec's: past it, its
// statement is cancelled, the lease ends, and Commit is a *FencedError.
//
// The returned transaction's Commit is the only COMMIT that carries a fresh deadline:
// do not commit it with SQL of your own.
func (le *Lease) BeginTx(ctx context.Context, db *pgxpool.Pool, opts pgx.TxOptions) (pgx.Tx, error) {
	return le.in.BeginTx(ctx, db, opts)
}

// BeginFunc runs fn in a transaction of BeginTx and commits it when fn returns nil, or
// rolls it back. The error is fn's, or BeginTx's or Commit's (a *FencedError when the
// write was refused, and when fn's error came from the transaction's statement cancelled
// past its bound, the lease's TTL: see Exec).
func (le *Lease) BeginFunc(ctx context.Context, db *pgxpool.Pool, fn func(pgx.Tx) error) error {
	return le.in.BeginFunc(ctx, db, fn)
}

// LeaseLostError is the cause of a lost lease's context. Reason is one of:
//
//   - "taken": a renewal or a fence reached the database and found the lease no longer
//     held under its epoch. Another holder took the lease over, the row was deleted, or
//     it had expired by the database clock.
//   - "error": the trust window ran out while the most recent renewal attempt had
//     failed with an error (connection refused, pool closed, SQL error). Err is that
//     error. A failed renewal is retried every ttl/16 until the window runs out.
//   - "expired": the trust window ran out with no failed attempt to blame: a renewal
//     was still unanswered (a hung network, a stalled server) or none could be sent in
//     time (a paused process). Or a fenced transaction under the lease (Exec, BeginTx,
//     BeginFunc) was open past its bound, the lease's ttl: Err says how long, and its
//     statement was cancelled.
//   - "not_alive": the holder is an Agent's instance that could no longer prove life;
//     it stepped down before the fleet could call it dead and take the lease.
type LeaseLostError struct {
	Name   string
	Epoch  int64
	Reason string
	Err    error
}

// Error names the lease, the epoch, the reason and the error behind it, if any.
func (e *LeaseLostError) Error() string {
	l := lease.Loss(*e) // the same fields: one text
	return l.Error()
}

// Unwrap makes errors.Is(err, ErrLeaseLost) true, and reaches Err.
func (e *LeaseLostError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrLeaseLost}
	}
	return []error{ErrLeaseLost, e.Err}
}

// FencedError is a write fenced under a lease (Lease.Exec, Lease.BeginTx, Lease.BeginFunc)
// that was refused: nothing of it committed. Refused by the
// fence (the lease not held, a fence or a COMMIT past its deadline), or ended by the
// server or the library before its COMMIT could count: a transaction that idled past
// its limit (the server ends its session, SQLSTATE 25P03, and a COMMIT sent then, or not
// sent because the connection is closed, is refused), or one open past its bound, the
// lease's TTL.
type FencedError struct {
	Lease string
	Epoch int64
	// Held is true when this process still held the lease as the write was refused: the
	// fence or the COMMIT reached the server past its deadline (a network that held it
	// back, a pause), not a lost lease; the next write, with a new deadline, may pass.
	// False when the lease has ended (Lease.Err says why); the error is then errors.Is
	// ErrLeaseLost as well.
	Held bool
	// AtCommit is true when the statements ran and the COMMIT was refused, rolling them
	// back.
	AtCommit bool
	// Err is the server's error, or why the lease ended when nothing was sent.
	Err error
}

// Error names the lease, the epoch and why the write was refused, and whether the lease
// was still held.
func (e *FencedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "liveness: write fenced under lease %q (epoch %d) refused", e.Lease, e.Epoch)
	if e.AtCommit {
		b.WriteString(" at commit")
	}
	if e.Held {
		b.WriteString(", past its deadline while the lease is still held")
	} else {
		b.WriteString(": the lease is not held")
	}
	if e.Err != nil {
		b.WriteString(": " + e.Err.Error())
	}
	return b.String()
}

// Unwrap makes errors.Is(err, ErrFenced) true, errors.Is(err, ErrLeaseLost) too when the
// lease is no longer held, and reaches Err.
func (e *FencedError) Unwrap() []error {
	errs := []error{ErrFenced}
	if !e.Held {
		errs = append(errs, ErrLeaseLost)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}
