package liveness

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// AgentConfig configures an Agent: one instance that takes part in the fleet. Zero values
// take the defaults (the Default* constants); Pool, InstanceID and ServiceName must be
// set, and DirectDSN too unless Mode is ModeHeartbeatTableOnly or NodeAgentSocket is set.
type AgentConfig struct {
	// Pool runs every short statement: the heartbeat, the leases, the reaper. It may go
	// through PgBouncer.
	Pool *pgxpool.Pool
	// DirectDSN reaches PostgreSQL itself, never a pooler in transaction mode: the alive
	// lock's own connection. Unused in ModeHeartbeatTableOnly, and with NodeAgentSocket.
	DirectDSN string
	// NodeAgentSocket, when set, is the local socket of the node agent of this host (the
	// pg_liveness_exporter binary run with --node-agent.socket, or a NodeAgent): the
	// alive lock is held on the node agent's one session for every process of the node,
	// instead of on a session of this process's own, and the schema's events arrive
	// through it. The lock is let go when this process's connection to the node agent
	// closes, however the process ends. While the node agent cannot be reached (it
	// restarts, say) the instance is judged by its heartbeat and leads nothing, and it
	// attaches again as soon as the node agent answers. Unused in ModeHeartbeatTableOnly.
	NodeAgentSocket string
	Schema          string // DefaultSchema if empty
	InstanceID      uuid.UUID
	ServiceName     string
	HostName        string // os.Hostname() if empty
	ProcessID       int    // os.Getpid() if zero
	Mode            Mode   // ModeAdvisoryLockWhenAvailable if empty

	// Timing is recorded in the instance's row, and the fleet judges the instance by it.
	Timing Timing
	// VerifyInterval is how often the alive lock is verified on its own backend while
	// the agent holds no lease; DefaultVerifyInterval if zero. While it holds any (a
	// campaign's, the reaper's, a watcher's) the lock is verified every quarter of
	// Timing.LockGrace (or VerifyInterval, if shorter): a leader trusts its lock only
	// three quarters of the lock grace after the last verification was sent (see "What a
	// leader guarantees" in the package documentation).
	VerifyInterval time.Duration
	// Metadata is stored in the instance row's metadata column; it must marshal to JSON.
	Metadata map[string]any

	// The alive lock's session: server-side TCP keepalive and user timeout (see the
	// Default* constants).
	KeepaliveIdle     time.Duration
	KeepaliveInterval time.Duration
	KeepaliveCount    int
	UserTimeout       time.Duration

	// Reaper runs cleanup_stale_instances every ReaperInterval on one agent at a time,
	// under the lease ReaperLease (ReaperLeaseTTL).
	Reaper         bool
	ReaperInterval time.Duration
	ReaperLeaseTTL time.Duration

	// DisableWatcher keeps this agent out of the watchers' campaigns (WatcherLeases). By
	// default every agent takes part, and two of them, in two processes, record the
	// vanishing of any alive lock within WatchInterval and notify the waiters; without a
	// watcher the first look records it, and a crash is dead a lock grace after that
	// look instead of after the crash.
	DisableWatcher bool

	// JobWindDown is how long a campaign's OnStartedLeading may take to return after its
	// context was cancelled because the campaign ended (Elect's context or Run's): its
	// lease stays renewed meanwhile, and Run keeps the instance alive. Past it the lease
	// is left to expire. DefaultJobWindDown if zero.
	JobWindDown time.Duration
	// ShutdownTimeout bounds the deletion of the instance row on the way out;
	// DefaultShutdownTimeout if zero.
	ShutdownTimeout time.Duration
	// DuplicateTimeout is how long the agent waits, writing nothing, while another session
	// holds its instance's alive lock, before Run gives up with ErrDuplicateInstance.
	// A restarted process may find its previous session's lock for up to the keepalive
	// bound (about 30 s); a second process with the same id finds it for good.
	// DefaultDuplicateTimeout if zero.
	DuplicateTimeout time.Duration
	// WaitForSchema makes Run wait for the migrations to be applied (by another process)
	// instead of failing at once when the schema is missing or older than this library.
	WaitForSchema bool
	// Logger receives the agent's lines, passwords removed; nil discards. The agent adds
	// no key naming itself: add what tells agents apart (an instance id) with With. Its
	// parts' lines carry part=alive_lock, heartbeat, leases or reaper.
	Logger *slog.Logger
}

// ErrSchemaNotReady is returned by Agent.Run when the schema is missing or older than
// this library and AgentConfig.WaitForSchema is not set.
var ErrSchemaNotReady = errors.New("liveness: the schema is not ready")

// Defaults of AgentConfig.
const (
	DefaultReaperInterval = 30 * time.Second
	DefaultReaperLeaseTTL = 2 * time.Minute
	// DefaultJobWindDown: a job that needs longer to stop sets its own, and its
	// process's grace before SIGKILL with it (AgentConfig.ShutdownBudget).
	DefaultJobWindDown     = 10 * time.Second
	DefaultShutdownTimeout = 5 * time.Second
	// DefaultDuplicateTimeout is twice the time the server needs, with the default
	// keepalive settings, to end a half-open session.
	DefaultDuplicateTimeout = 2 * time.Minute
)

// ErrDuplicateInstance is returned by Agent.Run when another session kept holding the
// instance's alive lock for DuplicateTimeout: another process runs with the same
// instance id.
var ErrDuplicateInstance = errors.New("liveness: another process holds this instance id's alive lock")

// shutdownSteps are the deadlines of Run's clean-up, one after the other, once its
// context ends; ShutdownBudget is their sum, and Run uses these very values.
type shutdownSteps struct {
	windDown  time.Duration // the campaigns' jobs return, their leases still renewed
	letGo     time.Duration // their leases are released, or left to expire
	beat      time.Duration // a beat in flight finishes
	removeRow time.Duration // the instance row is deleted
	closeLock time.Duration // the alive lock's session is closed
}

func (c AgentConfig) shutdownSteps() shutdownSteps {
	c = c.withDefaults()
	s := shutdownSteps{windDown: c.JobWindDown, letGo: runReleaseTimeout, beat: beatTimeout(c.Timing.HeartbeatInterval),
		removeRow: c.ShutdownTimeout, closeLock: aliveLockCloseTimeout}
	if c.Mode == ModeHeartbeatTableOnly {
		s.closeLock = 0 // no lock, no session
	}
	return s
}

func (s shutdownSteps) total() time.Duration {
	return s.windDown + s.letGo + s.beat + s.removeRow + s.closeLock
}

// ShutdownBudget is the longest Run takes to return once its context ends, with this
// configuration (defaults filled in). The steps run one after the other, each under its
// own deadline: the campaigns' jobs get JobWindDown to return while their leases are
// still renewed and the instance still proves life, then their leases are released (or
// left to expire) within 5 s; a beat in flight finishes (half the heartbeat interval, at
// most 10 s); the instance row is deleted (ShutdownTimeout); the alive lock's session is
// closed (5 s). With the defaults that is 10 + 5 + 10 + 5 + 5 = 35 s. Give a process that
// runs an Agent at least this long between SIGTERM and SIGKILL, plus whatever else it
// does on the way out.
func (c AgentConfig) ShutdownBudget() time.Duration { return c.shutdownSteps().total() }

// withDefaults fills zero values with the documented defaults. Negative values stay, for
// Validate to refuse.
func (c AgentConfig) withDefaults() AgentConfig {
	c.Schema = cmp.Or(c.Schema, DefaultSchema)
	c.Mode = cmp.Or(c.Mode, ModeAdvisoryLockWhenAvailable)
	c.Timing = timingWithDefaults(c.Timing)
	c.ReaperInterval = cmp.Or(c.ReaperInterval, DefaultReaperInterval)
	c.ReaperLeaseTTL = cmp.Or(c.ReaperLeaseTTL, DefaultReaperLeaseTTL)
	c.JobWindDown = cmp.Or(c.JobWindDown, DefaultJobWindDown)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.DuplicateTimeout = cmp.Or(c.DuplicateTimeout, DefaultDuplicateTimeout)
	return c
}

// lockMode reports whether the agent holds an alive lock.
func (c AgentConfig) lockMode() bool { return c.Mode != ModeHeartbeatTableOnly }

// aliveLockFields names, for each field of the alive lock's configuration, the
// AgentConfig field it comes from, so that an Agent's errors name what its caller set.
var aliveLockFields = map[string]string{
	"aliveLockConfig.DSN":               "AgentConfig.DirectDSN",
	"aliveLockConfig.InstanceID":        "AgentConfig.InstanceID",
	"aliveLockConfig.ServiceName":       "AgentConfig.ServiceName",
	"aliveLockConfig.KeepaliveIdle":     "AgentConfig.KeepaliveIdle",
	"aliveLockConfig.KeepaliveInterval": "AgentConfig.KeepaliveInterval",
	"aliveLockConfig.KeepaliveCount":    "AgentConfig.KeepaliveCount",
	"aliveLockConfig.UserTimeout":       "AgentConfig.UserTimeout",
	"aliveLockConfig.VerifyInterval":    "AgentConfig.VerifyInterval",
}

// asAgentError renames the alive lock's *ConfigError to the AgentConfig fields.
func asAgentError(err error) error {
	var ce *ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	out := &ConfigError{Field: ce.Field, Reason: ce.Reason}
	if f, ok := aliveLockFields[ce.Field]; ok {
		out.Field = f
	}
	for from, to := range aliveLockFields {
		out.Reason = strings.ReplaceAll(out.Reason, from, to)
	}
	return out
}

// Validate refuses configuration that NewAgent would refuse: a missing Pool or
// identity, or timing that would make an alive instance look dead or a dead one look
// alive, after filling zero values with the defaults. Errors are *ConfigError naming the
// AgentConfig field.
func (c AgentConfig) Validate() error {
	c = c.withDefaults()
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: "AgentConfig." + field, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case c.Pool == nil:
		return bad("Pool", "must be set")
	case strings.TrimSpace(c.ServiceName) == "":
		return bad("ServiceName", "must not be empty")
	case c.InstanceID == uuid.Nil:
		return bad("InstanceID", "must not be the nil UUID")
	}
	if _, ok := parseMode(string(c.Mode)); !ok {
		return bad("Mode", "%q is unknown (want %s or %s)", c.Mode, ModeAdvisoryLockWhenAvailable, ModeHeartbeatTableOnly)
	}
	if err := checkTiming(c.Timing, "AgentConfig.Timing"); err != nil {
		return err
	}
	if len(c.Metadata) > 0 {
		if _, err := json.Marshal(c.Metadata); err != nil {
			return bad("Metadata", "does not marshal to JSON: %v", err)
		}
	}
	if c.Reaper {
		if c.ReaperInterval < 0 {
			return bad("ReaperInterval", "(%s) must be positive", c.ReaperInterval)
		}
		if c.ReaperLeaseTTL < time.Second {
			return bad("ReaperLeaseTTL", "(%s) must be at least 1s: it is renewed every ttl/4", c.ReaperLeaseTTL)
		}
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"JobWindDown", c.JobWindDown}, {"ShutdownTimeout", c.ShutdownTimeout}, {"DuplicateTimeout", c.DuplicateTimeout}} {
		if f.d < 0 {
			return bad(f.name, "(%s) must not be negative", f.d)
		}
	}
	switch {
	case c.lockMode() && c.NodeAgentSocket != "":
		if strings.TrimSpace(c.NodeAgentSocket) != c.NodeAgentSocket {
			return bad("NodeAgentSocket", "(%q) must not begin or end with spaces", c.NodeAgentSocket)
		}
		if err := c.aliveLockConfig().validateTiming(); err != nil {
			return asAgentError(err)
		}
	case c.lockMode():
		if err := c.aliveLockConfig().validate(); err != nil {
			return asAgentError(err)
		}
	}
	return nil
}

// nodeLockConfig is the lock's configuration through a node agent.
func (c AgentConfig) nodeLockConfig(ev *events) nodeLockConfig {
	lc := c.aliveLockConfig()
	return nodeLockConfig{Socket: c.NodeAgentSocket, InstanceID: c.InstanceID, Schema: c.Schema, Pool: c.Pool,
		LeaderVerifyInterval: lc.LeaderVerifyInterval, Events: ev, Logger: lc.Logger}
}

func (c AgentConfig) aliveLockConfig() aliveLockConfig {
	return aliveLockConfig{
		DSN:               c.DirectDSN,
		Schema:            c.Schema,
		InstanceID:        c.InstanceID,
		ServiceName:       c.ServiceName,
		KeepaliveIdle:     c.KeepaliveIdle,
		KeepaliveInterval: c.KeepaliveInterval,
		KeepaliveCount:    c.KeepaliveCount,
		UserTimeout:       c.UserTimeout,
		VerifyInterval:    c.VerifyInterval,
		// A leader trusts its lock only briefly after each proof (lifeMonitor).
		LeaderVerifyInterval: min(cmp.Or(c.VerifyInterval, DefaultVerifyInterval), leaderVerifyInterval(c.Timing.LockGrace)),
		Logger:               logging.Wrap(c.Logger).With("part", "alive_lock"),
	}
}

func (c AgentConfig) heartbeatConfig(lock lockSource) heartbeatConfig {
	return heartbeatConfig{
		Pool:        c.Pool,
		Schema:      c.Schema,
		InstanceID:  c.InstanceID,
		ServiceName: c.ServiceName,
		HostName:    c.HostName,
		ProcessID:   c.ProcessID,
		Mode:        c.Mode,
		Timing:      c.Timing,
		Lock:        lock,
		Metadata:    c.Metadata,
		Logger:      logging.Wrap(c.Logger).With("part", "heartbeat"),
	}
}

// Agent is one instance taking part in the fleet: it holds its alive lock (unless in
// ModeHeartbeatTableOnly), beats, optionally reaps dead instances, and campaigns for
// singleton jobs (Elect).
type Agent struct {
	cfg       AgentConfig
	lock      lockSession // nil in ModeHeartbeatTableOnly
	heartbeat *heartbeatWorker
	leases    *Leases
	life      *lifeMonitor
	reaper    *reaper  // nil when disabled
	watcher   *watcher // nil when disabled
	events    *events  // the notifications the alive lock's session receives
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
	a := &Agent{cfg: cfg, leading: newLeaderships(), events: &events{}}
	var lock lockSource // a nil interface, not a nil *aliveLock, without a lock
	switch {
	case cfg.lockMode() && cfg.NodeAgentSocket != "":
		a.lock = newNodeLock(cfg.nodeLockConfig(a.events))
		lock = a.lock
	case cfg.lockMode():
		lc := cfg.aliveLockConfig()
		lc.Events = a.events
		al, err := newAliveLock(lc)
		if err != nil {
			return nil, asAgentError(err)
		}
		a.lock, lock = al, al
	}
	hb, err := newHeartbeatWorker(cfg.heartbeatConfig(lock))
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
	if err := cfg.Validate(); err != nil {
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

func (l *leaderships) enter() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return false
	}
	l.held++
	return true
}

func (l *leaderships) leave() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held--; l.held == 0 && l.stopped {
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
	for {
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
