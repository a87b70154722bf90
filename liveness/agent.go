// The Agent: one instance taking part in the fleet. It builds its parts, runs them, and
// shuts them down in order.

package liveness

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pg-liveness/pg_liveness_exporter/internal/alivelock"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/notify"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// ErrSchemaNotReady is returned by Agent.Run when the schema is missing or older than
// this library and AgentConfig.WaitForSchema is not set, or when the database refuses
// the read of its version for good (a login refused, an unknown database). A database
// that does not answer in time, or cannot be reached for now, is asked again until Run's
// context ends.
var ErrSchemaNotReady = errors.New("liveness: the schema is not ready")

// ErrDuplicateInstance is returned by Agent.Run when another session kept holding the
// instance's alive lock for DuplicateTimeout: another process runs with the same
// instance id.
var ErrDuplicateInstance = errors.New("liveness: another process holds this instance id's alive lock")

// Agent is one instance taking part in the fleet: it holds its alive lock (unless in
// ModeHeartbeatTableOnly), beats, optionally reaps dead instances, and campaigns for
// singleton jobs (Elect).
type Agent struct {
	cfg       AgentConfig
	lock      alivelock.Lock // nil in ModeHeartbeatTableOnly
	heartbeat *heartbeatWorker
	leases    *Leases
	life      *lifeMonitor
	reaper    *reaper     // nil when disabled
	watcher   *watcher    // nil when disabled
	events    *notify.Hub // the notifications the alive lock's session receives
	leading   *leaderships

	shardsMu  sync.Mutex
	shardSets []*shardSetCounts // the sets Shards takes part in now
}

// NewAgent builds the parts; nothing connects until Run.
func NewAgent(cfg AgentConfig) (*Agent, error) {
	cfg.Logger = logging.Wrap(cfg.Logger)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	a := &Agent{cfg: cfg, leading: newLeaderships(), events: &notify.Hub{}}
	var lock lockSource // a nil interface, not a nil *alivelock.Direct, without a lock
	switch {
	case cfg.lockMode() && cfg.NodeAgentSocket != "":
		a.lock = alivelock.NewNode(cfg.nodeLockConfig(a.events))
		lock = a.lock
	case cfg.lockMode():
		lc := cfg.aliveLockConfig()
		lc.Events = a.events
		al, err := alivelock.NewDirect(lc)
		if err != nil {
			return nil, asAgentError(err)
		}
		a.lock, lock = al, al
	}
	hc := cfg.heartbeatConfig(lock)
	if al, ok := a.lock.(*alivelock.Direct); ok {
		hc.recovered = al.Answered // a restarted server: claim the lock again at once
	}
	hb, err := newHeartbeatWorker(hc)
	if err != nil {
		return nil, err
	}
	a.heartbeat = hb
	t := cfg.Timing
	a.life = newLifeMonitor(a.lock, hb, cfg.lockMode(), t.HeartbeatInterval, t.StaleThreshold, t.DefinitiveDeadCutoff,
		t.LockGrace)
	// Leases record this instance as their holder, and end when it can no longer prove
	// life, before the fleet could take them over.
	if a.leases, err = NewLeases(LeasesConfig{Pool: cfg.Pool, Schema: cfg.Schema, instanceID: cfg.InstanceID,
		life: a.life, Logger: cfg.Logger.With("part", "leases")}); err != nil {
		return nil, err
	}
	a.leases.events = a.events
	if !cfg.DisableWatcher {
		a.watcher = newWatcher(watcherConfig{Pool: cfg.Pool, Leases: a.leases, Schema: cfg.Schema, Events: a.events,
			Logger: cfg.Logger.With("part", "watcher"), gate: a.leading, windDown: cfg.JobWindDown})
		a.leases.fleet = &a.watcher.fleet
	}
	if cfg.Reaper {
		rc := reaperConfig{
			Pool:                 cfg.Pool,
			Leases:               a.leases,
			Schema:               cfg.Schema,
			Interval:             cfg.ReaperInterval,
			LeaseTTL:             cfg.ReaperLeaseTTL,
			StaleThreshold:       t.StaleThreshold,
			DefinitiveDeadCutoff: t.DefinitiveDeadCutoff,
			HistoryRetention:     cfg.HistoryRetention,
			Logger:               cfg.Logger.With("part", "reaper"),
			gate:                 a.leading,
			windDown:             cfg.JobWindDown,
		}
		if a.watcher != nil {
			rc.whileLeading = a.watcher.reaperLeading
		}
		a.reaper, err = newReaper(rc)
		if err != nil {
			return nil, err
		}
	}
	return a, nil
}

// Elect campaigns for cfg.Lease until ctx ends or the agent stops (Run's context ended),
// leading whenever it holds the lease: a follower tries every RetryPeriod, a leader runs
// OnStartedLeading, and follows again once it has returned. The lease records this
// instance as its holder, so Reader.Leader says who leads, and a leader that dies is
// replaced as soon as it is dead by the one verdict, or its lease expires if that comes
// first (in ModeHeartbeatTableOnly it does).
//
// Never two job runners at once, outside the database too: the lease is released only
// after OnStartedLeading has returned, and until then it is renewed while this instance
// can prove life; when ctx or Run's context ends, the job's context is cancelled and Run
// keeps the instance alive (beating, holding its lock) until the job has returned, for
// at most AgentConfig.JobWindDown. A leader that can no longer prove life, or whose
// lease is lost, has its job's context cancelled before anyone else can take the lease.
// The package documentation says, for each way a leadership ends, when another process
// may start.
//
// A process leads only while its Agent runs. Elect returns nil when ctx ends or the
// agent stops, after the last OnStoppedLeading; ErrWindDownExceeded (wrapped) when a job
// outlived JobWindDown; or a *ConfigError. Call it in a goroutine the service owns, and
// wait for it before the process exits.
func (a *Agent) Elect(ctx context.Context, cfg ElectorConfig) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	campaignCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(a.leading.stopping, func() { cancel(context.Cause(a.leading.stopping)) })
	defer stop()
	return a.leases.elect(campaignCtx, cfg, a.cfg.JobWindDown, a.leading)
}

// leaderships is an Agent's gate for its campaigns: it counts the leases they hold (or
// are taking), so that Run, once its context ends, keeps proving life until every
// campaign has let go of its lease, and lets no campaign take one after that.
type leaderships struct {
	stopping context.Context // ends when Run begins to stop; campaigns end with it
	stop     context.CancelCauseFunc

	mu      sync.Mutex
	stopped bool
	held    int
	idle    chan struct{} // closed once nothing is held after stopping began
}

func newLeaderships() *leaderships {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &leaderships{stopping: ctx, stop: cancel, idle: make(chan struct{})}
}

func (l *leaderships) enter() bool { return l.enterN(1) }

func (l *leaderships) leave() { l.leaveN(1) }

// enterN counts n leases taken (or being taken) at once: a shard set's batch.
func (l *leaderships) enterN(n int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return false
	}
	l.held += n
	return true
}

// leaveN counts n leases let go.
func (l *leaderships) leaveN(n int) {
	if n == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held -= n; l.held == 0 && l.stopped {
		close(l.idle)
	}
}

// stopAll ends every campaign with cause, refuses new leaderships and returns a channel
// closed once none is held. Only the first call counts.
func (l *leaderships) stopAll(cause error) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.stopped {
		l.stopped = true
		l.stop(cause)
		if l.held == 0 {
			close(l.idle)
		}
	}
	return l.idle
}

// Run takes part until ctx ends, then shuts down cleanly within
// AgentConfig.ShutdownBudget: the campaigns' jobs return (their leases still renewed, the
// instance still beating) and their leases are released, the heartbeat stops, the
// instance row is deleted while the lock is still held, and the lock's session is
// closed, so that the fleet sees the instance gone at once and nobody takes a lease
// while a job of this instance still runs. Run may be called once.
func (a *Agent) Run(ctx context.Context) error {
	if err := a.schemaReady(ctx); err != nil || ctx.Err() != nil {
		a.leading.stopAll(cmp.Or(err, context.Cause(ctx)))
		return err
	}
	steps := a.cfg.shutdownSteps()
	// The parts live on their own contexts, ended one after the other on the way out.
	lifeCtx, stopLife := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLife()
	var lifeWG sync.WaitGroup
	if a.lock != nil {
		lifeWG.Go(func() {
			if err := a.lock.Run(lifeCtx); err != nil && lifeCtx.Err() == nil {
				a.cfg.Logger.Error("alive lock stopped", "err", err)
			}
		})
	}
	lifeWG.Go(func() { a.life.run(lifeCtx) })
	beatCtx, stopBeat := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBeat()
	beatDone := make(chan struct{})
	go func() {
		defer close(beatDone)
		if err := a.heartbeat.Run(beatCtx); err != nil && beatCtx.Err() == nil {
			a.cfg.Logger.Error("agent part stopped", "part", "heartbeat", "err", err)
		}
	}()
	reaperDone := make(chan struct{})
	go func() {
		defer close(reaperDone)
		if a.reaper == nil {
			return
		}
		// The reaper's campaign ends with the others, when leaderships stops.
		if err := a.reaper.Run(a.leading.stopping); err != nil {
			a.cfg.Logger.Error("agent part stopped", "part", "reaper", "err", err)
		}
	}()

	watcherDone := make(chan struct{})
	go func() {
		defer close(watcherDone)
		if a.watcher == nil {
			return
		}
		if err := a.watcher.Run(a.leading.stopping); err != nil {
			a.cfg.Logger.Error("agent part stopped", "part", "watcher", "err", err)
		}
	}()

	var runErr error
	cause := error(nil)
	select {
	case <-ctx.Done():
		cause = context.Cause(ctx)
	case <-a.duplicateFor(ctx, a.cfg.DuplicateTimeout):
		runErr = fmt.Errorf("%w: instance id %s, for %s", ErrDuplicateInstance, a.cfg.InstanceID, a.cfg.DuplicateTimeout)
		cause = runErr
		a.cfg.Logger.Error("giving up: another process holds this instance id's alive lock; " +
			"give every process its own instance id")
	}

	// 1 and 2: the campaigns' jobs return while this instance still proves life, and
	// their leases are let go. Only then may the fleet see the instance go.
	letGo, cancelLetGo := context.WithTimeout(context.WithoutCancel(ctx), steps.windDown+steps.letGo)
	defer cancelLetGo()
	select {
	case <-a.leading.stopAll(cause):
	case <-letGo.Done():
		a.cfg.Logger.Error("a campaign did not let go of its lease in time; stopping anyway", "within", steps.windDown+steps.letGo)
	}
	select {
	case <-reaperDone:
	case <-letGo.Done():
	}
	select {
	case <-watcherDone:
	case <-letGo.Done():
	}
	// 3: a beat in flight finishes within its own deadline, so that no upsert lands
	// after the row's deletion.
	stopBeat()
	<-beatDone
	// 4: the row belongs to whoever holds the lock: a duplicate must not delete it.
	err := runErr
	if a.lock == nil || !a.lock.Duplicate() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), steps.removeRow)
		if rerr := a.heartbeat.Remove(rctx); rerr != nil {
			err = errors.Join(err, rerr)
		}
		cancel()
	}
	// 5: closing the lock's session releases the lock.
	stopLife()
	lifeWG.Wait()
	a.cfg.Logger.Info("agent stopped")
	return err
}

// schemaReadTimeout bounds each read of the schema's version at start-up.
var schemaReadTimeout = 10 * time.Second

// schemaReady checks, before anything starts, that the migrations this library needs
// are applied; with WaitForSchema it waits for them.
func (a *Agent) schemaReady(ctx context.Context) error {
	var slow logging.Repeats
	for attempt := 1; ; attempt++ {
		qctx, cancel := context.WithTimeout(ctx, schemaReadTimeout)
		v, err := migrations.Version(qctx, a.cfg.Pool, a.cfg.Schema)
		cancel()
		if err == nil && v >= migrations.Latest() {
			return nil
		}
		if err != nil && ctx.Err() == nil && (pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded)) {
			// The database did not answer in time (a fleet starting at once, a server
			// under load): no answer is not a missing schema. Ask again.
			slow.Log(a.cfg.Logger, slog.LevelWarn, "timeout", "cannot read the schema's version in time; asking again",
				"schema", a.cfg.Schema, "err", err)
			continue
		}
		if err != nil && ctx.Err() == nil && unreachable(err) {
			// Refused or dropped (a server restarting, a pooler at its limits while a
			// fleet starts at once): that passes, and is not a missing schema either. Ask
			// again, after a backoff with jitter so that the fleet does not come back in
			// step. A refused login or an unknown database does not pass, and ends Run.
			slow.Log(a.cfg.Logger, slog.LevelWarn, "unreachable", "cannot reach the database to read the schema's version; asking again",
				"schema", a.cfg.Schema, "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(alivelock.Backoff(attempt)):
			}
			continue
		}
		if !a.cfg.WaitForSchema {
			if err != nil {
				return fmt.Errorf("%w: cannot read schema %q's version: %w", ErrSchemaNotReady, a.cfg.Schema, err)
			}
			return fmt.Errorf("%w: schema %q is at migration version %d and this library needs %d; apply the migrations "+
				"first with migrations.Apply(ctx, pool, %q), or set AgentConfig.WaitForSchema", ErrSchemaNotReady,
				a.cfg.Schema, v, migrations.Latest(), a.cfg.Schema)
		}
		a.cfg.Logger.Info("waiting for the migrations", "schema", a.cfg.Schema, "version", v, "needs", migrations.Latest())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// unreachable reports whether err says that the database could not be reached or dropped
// the connection (refused, reset or closed, the server starting, shutting down or out of
// connection slots, a pooler's connection error), which passes; not that it refused this
// client (a login, a database or a host name that does not exist), which does not.
func unreachable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "53300", // too_many_connections
			"57P01", "57P02", "57P03": // shutting down, crashed, starting up
			return true
		}
		return strings.HasPrefix(pgErr.Code, "08") // connection exceptions, and PgBouncer's errors
	}
	if dnsErr := (*net.DNSError)(nil); errors.As(err, &dnsErr) {
		return dnsErr.IsTimeout || dnsErr.IsTemporary
	}
	var opErr *net.OpError
	return errors.As(err, &opErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}

// duplicateFor returns a channel that is closed once the alive lock has been held by
// another session for d without a break; it is never closed without a lock.
func (a *Agent) duplicateFor(ctx context.Context, d time.Duration) <-chan struct{} {
	out := make(chan struct{})
	if a.lock == nil {
		return out
	}
	go func() {
		var since time.Time
		t := time.NewTicker(min(d/10, time.Second))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			switch {
			case !a.lock.Duplicate():
				since = time.Time{}
			case since.IsZero():
				since = time.Now()
			case time.Since(since) >= d:
				close(out)
				return
			}
		}
	}()
	return out
}

// Snapshot reports the agent's state for the exporter. It never blocks on the database.
func (a *Agent) Snapshot() AgentSnapshot {
	s := AgentSnapshot{
		InstanceID:  a.cfg.InstanceID,
		ServiceName: a.cfg.ServiceName,
		Mode:        a.cfg.Mode,
		Timing:      a.cfg.Timing,
		Heartbeat:   a.heartbeat.Stats(),
		Leases:      a.leases.Stats(),
		Shards:      a.shardSnapshot(),
	}
	if a.lock != nil {
		s.AliveLock = a.lock.Stats()
	}
	if a.reaper != nil {
		s.Reaped = a.reaper.Reaped()
	}
	return s
}
