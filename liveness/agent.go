package liveness

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// AgentConfig wires an AliveLock, a HeartbeatWorker and optionally a Reaper into one
// participating instance. Zero values take the defaults (DefaultHeartbeatInterval and
// the other Default* constants); Pool, DirectDSN, InstanceID and ServiceName must be set.
type AgentConfig struct {
	Pool        *pgxpool.Pool // short statements: heartbeat, leases, reaper
	DirectDSN   string        // the alive lock's dedicated connection; never a pooler in transaction mode
	Schema      string
	InstanceID  uuid.UUID
	ServiceName string
	HostName    string
	ProcessID   int
	Mode        Mode

	HeartbeatInterval     time.Duration
	HeartbeatSlowInterval time.Duration
	StaleThreshold        time.Duration
	DefinitiveDeadCutoff  time.Duration
	LockGrace             time.Duration // DefaultLockGrace if zero
	// VerifyInterval is how often the alive lock is verified on its own backend;
	// DefaultVerifyInterval if zero.
	VerifyInterval time.Duration
	// Metadata is stored in the instance row's metadata column; it must marshal to JSON.
	Metadata map[string]any

	KeepaliveIdle     time.Duration
	KeepaliveInterval time.Duration
	KeepaliveCount    int
	UserTimeout       time.Duration

	Reaper         bool
	ReaperInterval time.Duration
	ReaperLeaseTTL time.Duration

	// ShutdownTimeout bounds the clean-up after Run's context ends.
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

const defaultShutdownTimeout = 10 * time.Second

// DefaultDuplicateTimeout is AgentConfig.DuplicateTimeout's default: twice the time the
// server needs, with the default keepalive settings, to end a half-open session.
const DefaultDuplicateTimeout = 2 * time.Minute

// ErrDuplicateInstance is returned by Agent.Run when another session kept holding the
// instance's alive lock for DuplicateTimeout: another process runs with the same
// instance id.
var ErrDuplicateInstance = errors.New("liveness: another process holds this instance id's alive lock")

// ShutdownBudget is the longest Run takes to return once its context ends, with this
// configuration. The clean-up steps run one after the other, each under its own
// deadline: an in-flight beat finishes while a reap round in flight releases its lease,
// the instance row is deleted, and the alive lock's session is closed. Give a process
// that runs an Agent at least this long between SIGTERM and SIGKILL, plus whatever else
// it does on the way out.
func (c AgentConfig) ShutdownBudget() time.Duration {
	beat := min(c.HeartbeatInterval/2, heartbeatMaxStatementTimeout)
	drain := beat
	if c.Reaper {
		drain = max(drain, runReleaseTimeout)
	}
	remove := min(cmp.Or(max(c.ShutdownTimeout, 0), defaultShutdownTimeout), beat)
	return drain + remove + aliveLockCloseTimeout
}

// Defaults of AgentConfig's reaper.
const (
	DefaultReaperInterval = 30 * time.Second
	DefaultReaperLeaseTTL = 2 * time.Minute
)

// withDefaults fills zero values with the documented defaults. Negative values stay, for
// Validate to refuse.
func (c AgentConfig) withDefaults() AgentConfig {
	c.Schema = cmp.Or(c.Schema, DefaultSchema)
	c.Mode = cmp.Or(c.Mode, ModeAdvisoryLockWhenAvailable)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, DefaultHeartbeatInterval)
	c.HeartbeatSlowInterval = cmp.Or(c.HeartbeatSlowInterval, DefaultHeartbeatSlowInterval)
	c.StaleThreshold = cmp.Or(c.StaleThreshold, DefaultStaleThreshold)
	c.DefinitiveDeadCutoff = cmp.Or(c.DefinitiveDeadCutoff, DefaultDefinitiveDeadCutoff)
	c.LockGrace = cmp.Or(c.LockGrace, DefaultLockGrace)
	c.ReaperInterval = cmp.Or(c.ReaperInterval, DefaultReaperInterval)
	c.ReaperLeaseTTL = cmp.Or(c.ReaperLeaseTTL, DefaultReaperLeaseTTL)
	c.DuplicateTimeout = cmp.Or(c.DuplicateTimeout, DefaultDuplicateTimeout)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, defaultShutdownTimeout)
	return c
}

// agentFields names, for each field of the parts' configurations, the AgentConfig field
// it comes from, so that an Agent's errors name what its caller set.
var agentFields = map[string]string{
	"HeartbeatConfig.InstanceID":           "AgentConfig.InstanceID",
	"HeartbeatConfig.ServiceName":          "AgentConfig.ServiceName",
	"HeartbeatConfig.Mode":                 "AgentConfig.Mode",
	"HeartbeatConfig.Interval":             "AgentConfig.HeartbeatInterval",
	"HeartbeatConfig.SlowInterval":         "AgentConfig.HeartbeatSlowInterval",
	"HeartbeatConfig.StaleThreshold":       "AgentConfig.StaleThreshold",
	"HeartbeatConfig.DefinitiveDeadCutoff": "AgentConfig.DefinitiveDeadCutoff",
	"HeartbeatConfig.LockGrace":            "AgentConfig.LockGrace",
	"AliveLockConfig.DSN":                  "AgentConfig.DirectDSN",
	"AliveLockConfig.InstanceID":           "AgentConfig.InstanceID",
	"AliveLockConfig.ServiceName":          "AgentConfig.ServiceName",
	"AliveLockConfig.KeepaliveIdle":        "AgentConfig.KeepaliveIdle",
	"AliveLockConfig.KeepaliveInterval":    "AgentConfig.KeepaliveInterval",
	"AliveLockConfig.KeepaliveCount":       "AgentConfig.KeepaliveCount",
	"AliveLockConfig.UserTimeout":          "AgentConfig.UserTimeout",
	"AliveLockConfig.VerifyInterval":       "AgentConfig.VerifyInterval",
	"HeartbeatConfig.Metadata":             "AgentConfig.Metadata",
}

// asAgentError renames a part's *ConfigError to the AgentConfig fields.
func asAgentError(err error) error {
	var ce *ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	out := &ConfigError{Field: ce.Field, Reason: ce.Reason}
	if f, ok := agentFields[ce.Field]; ok {
		out.Field = f
	}
	for from, to := range agentFields {
		out.Reason = strings.ReplaceAll(out.Reason, from, to)
	}
	return out
}

// Validate refuses configuration that would make an alive instance look dead or a dead
// one look alive, after filling zero values with the defaults. Errors are *ConfigError
// naming the AgentConfig field.
func (c AgentConfig) Validate() error {
	c = c.withDefaults()
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: "AgentConfig." + field, Reason: fmt.Sprintf(format, args...)}
	}
	if c.ServiceName == "" {
		return bad("ServiceName", "must not be empty")
	}
	if c.InstanceID == uuid.Nil {
		return bad("InstanceID", "must not be the nil UUID")
	}
	if err := c.heartbeatConfig(nil).Validate(); err != nil {
		return asAgentError(err)
	}
	if c.DefinitiveDeadCutoff <= c.HeartbeatSlowInterval+c.StaleThreshold {
		return bad("DefinitiveDeadCutoff", "(%s) must be above AgentConfig.HeartbeatSlowInterval (%s) plus AgentConfig.StaleThreshold (%s)",
			c.DefinitiveDeadCutoff, c.HeartbeatSlowInterval, c.StaleThreshold)
	}
	if c.Reaper {
		if c.ReaperInterval < 0 {
			return bad("ReaperInterval", "(%s) must be positive", c.ReaperInterval)
		}
		if c.ReaperLeaseTTL < time.Second {
			return bad("ReaperLeaseTTL", "(%s) must be at least 1s: it is renewed every ttl/4", c.ReaperLeaseTTL)
		}
	}
	if c.DuplicateTimeout < 0 {
		return bad("DuplicateTimeout", "(%s) must not be negative", c.DuplicateTimeout)
	}
	if c.ShutdownTimeout < 0 {
		return bad("ShutdownTimeout", "(%s) must not be negative", c.ShutdownTimeout)
	}
	if err := c.aliveLockConfig().Validate(); err != nil {
		return asAgentError(err)
	}
	return nil
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
		Logger:            logging.Wrap(c.Logger).With("part", "alive_lock"),
	}
}

func (c AgentConfig) heartbeatConfig(lock lockSource) heartbeatConfig {
	return heartbeatConfig{
		Pool:                 c.Pool,
		Schema:               c.Schema,
		InstanceID:           c.InstanceID,
		ServiceName:          c.ServiceName,
		HostName:             c.HostName,
		ProcessID:            c.ProcessID,
		Mode:                 c.Mode,
		Interval:             c.HeartbeatInterval,
		SlowInterval:         c.HeartbeatSlowInterval,
		StaleThreshold:       c.StaleThreshold,
		DefinitiveDeadCutoff: c.DefinitiveDeadCutoff,
		LockGrace:            c.LockGrace,
		Lock:                 lock,
		Metadata:             c.Metadata,
		Logger:               logging.Wrap(c.Logger).With("part", "heartbeat"),
	}
}

// Agent is one participating instance: it holds its alive lock, beats, and reaps.
type Agent struct {
	cfg       AgentConfig
	lock      *aliveLock
	heartbeat *heartbeatWorker
	leases    *Leases
	life      *lifeMonitor
	reaper    *reaper // nil when disabled
}

// NewAgent builds the parts; nothing connects until Run.
func NewAgent(cfg AgentConfig) (*Agent, error) {
	cfg.Logger = logging.Wrap(cfg.Logger)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Pool == nil {
		return nil, &ConfigError{Field: "AgentConfig.Pool", Reason: "must be set"}
	}
	cfg = cfg.withDefaults()
	a := &Agent{cfg: cfg}
	// The lock is held in both modes: observers detect a dead instance by it either way;
	// the mode only decides whether the heartbeat may slow down while it holds.
	lock, err := newAliveLock(cfg.aliveLockConfig())
	if err != nil {
		return nil, asAgentError(err)
	}
	a.lock = lock
	hb, err := newHeartbeatWorker(cfg.heartbeatConfig(lock))
	if err != nil {
		return nil, asAgentError(err)
	}
	a.heartbeat = hb
	a.life = newLifeMonitor(lock, hb, cfg.Mode != ModeHeartbeatTableOnly, cfg.HeartbeatInterval,
		cfg.StaleThreshold, cfg.DefinitiveDeadCutoff, cmp.Or(cfg.LockGrace, DefaultLockGrace))
	// Leases record this instance as their holder, and end when it can no longer prove
	// life, before the fleet could take them over.
	if a.leases, err = NewLeases(LeasesConfig{Pool: cfg.Pool, Schema: cfg.Schema, InstanceID: cfg.InstanceID,
		life: a.life, Logger: cfg.Logger.With("part", "leases")}); err != nil {
		return nil, err
	}
	if cfg.Reaper {
		a.reaper, err = newReaper(reaperConfig{
			Pool:                 cfg.Pool,
			Leases:               a.leases,
			Schema:               cfg.Schema,
			Interval:             cfg.ReaperInterval,
			LeaseTTL:             cfg.ReaperLeaseTTL,
			StaleThreshold:       cfg.StaleThreshold,
			DefinitiveDeadCutoff: cfg.DefinitiveDeadCutoff,
			Logger:               cfg.Logger.With("part", "reaper"),
		})
		if err != nil {
			return nil, asAgentError(err)
		}
	}
	return a, nil
}

// Leases returns the agent's lease manager, for jobs of its own.
func (a *Agent) Leases() *Leases { return a.leases }

// Run participates until ctx ends, then shuts down cleanly: the reaper's lease is
// released, the instance row is deleted and the alive lock's session is closed, so
// other instances see this one gone at once.
func (a *Agent) Run(ctx context.Context) error {
	if err := a.schemaReady(ctx); err != nil {
		return err
	}
	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	var wg sync.WaitGroup
	start := func(name string, run func(context.Context) error) {
		wg.Go(func() {
			if err := run(work); err != nil && work.Err() == nil {
				a.cfg.Logger.Error("agent part stopped", "part", name, "err", err)
			}
		})
	}
	var lockWG sync.WaitGroup
	lockCtx, stopLock := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLock()
	lockWG.Go(func() {
		if err := a.lock.Run(lockCtx); err != nil && lockCtx.Err() == nil {
			a.cfg.Logger.Error("alive lock stopped", "err", err)
		}
	})
	lockWG.Go(func() { a.life.run(lockCtx) })
	start("heartbeat", a.heartbeat.Run)
	if a.reaper != nil {
		start("reaper", a.reaper.Run)
	}

	var runErr error
	select {
	case <-ctx.Done():
	case <-a.duplicateFor(ctx, cmp.Or(a.cfg.DuplicateTimeout, DefaultDuplicateTimeout)):
		runErr = fmt.Errorf("%w: instance id %s, for %s", ErrDuplicateInstance, a.cfg.InstanceID,
			cmp.Or(a.cfg.DuplicateTimeout, DefaultDuplicateTimeout))
		a.cfg.Logger.Error("giving up: another process holds this instance id's alive lock; " +
			"give every process its own instance id")
	}
	// Stop beating and reaping first (a running reap round releases its lease as it
	// returns), then delete the row while the lock is still held, then drop the lock.
	stopWork()
	wg.Wait()
	cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.ShutdownTimeout)
	defer cancel()
	err := runErr
	// The row belongs to whoever holds the lock: a duplicate must not delete it.
	if !a.lock.Duplicate() {
		if rerr := a.heartbeat.Remove(cleanup); rerr != nil {
			err = errors.Join(err, fmt.Errorf("remove own instance row: %w", rerr))
		}
	}
	stopLock()
	lockWG.Wait()
	a.cfg.Logger.Info("agent stopped")
	return err
}

// schemaReady checks, before anything starts, that the migrations this library needs
// are applied; with WaitForSchema it waits for them.
func (a *Agent) schemaReady(ctx context.Context) error {
	for {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		v, err := migrations.Version(qctx, a.cfg.Pool, a.cfg.Schema)
		cancel()
		if err == nil && v >= migrations.Latest() {
			return nil
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
// another session for d without a break.
func (a *Agent) duplicateFor(ctx context.Context, d time.Duration) <-chan struct{} {
	out := make(chan struct{})
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
		InstanceID:            a.cfg.InstanceID,
		ServiceName:           a.cfg.ServiceName,
		Mode:                  a.cfg.Mode,
		Heartbeat:             a.heartbeat.Stats(),
		HeartbeatInterval:     a.cfg.HeartbeatInterval,
		HeartbeatSlowInterval: a.cfg.HeartbeatSlowInterval,
		AliveLock:             a.lock.Stats(),
		Leases:                a.leases.Stats(),
	}
	if a.reaper != nil {
		s.Reaped = a.reaper.Reaped()
	}
	return s
}
