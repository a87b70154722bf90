// Package fleetsim runs a simulated fleet of service instances in one process. Each
// instance is a liveness.Agent, the same lifecycle a service embeds (alive lock,
// heartbeat, leases), on a pool of its own, and campaigns with Agent.Elect for leased
// singleton jobs, taking turns with the others.
//
// Every connection of an instance goes through a relay of its own on 127.0.0.1 (one for
// its pool, one for its alive lock), and faults are conditions of those relays, not of
// the instance's code:
//
//   - Kill cuts both relays, pool first, and stops the agent: every session ends, so
//     PostgreSQL releases the alive lock at once, and nothing the dying instance tries
//     afterwards (a beat, its row's removal, a lease's release) reaches the server. Its
//     row and leases stay behind, as after a crash.
//   - Hang freezes both relays: the sessions stay open and nothing moves through them,
//     as for a stopped process. The lock stays held while the heartbeat ages.
//   - A heartbeat-only instance runs in heartbeat-table-only mode: it holds no alive lock
//     and opens no direct connection, as a service that reaches PostgreSQL only through
//     PgBouncer.
//
// The demo (make run), the end-to-end tests and the benchmarks share it.
package fleetsim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/database"
	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
	"github.com/pg-liveness/pg_liveness_exporter/tools/internal/wait"
)

// PoolApplicationName names the connections of the instances' pools and of the fleet's
// own (migrations, Statuses). The alive locks' connections are named
// "<service>:alive-lock" by the liveness package.
const PoolApplicationName = "fleetsim:pool"

// Config describes a fleet. Zero durations take the defaults of DefaultConfig.
type Config struct {
	// DSN is the pools' DSN and DirectDSN the alive locks' (DSN if empty). Only the first
	// host is used, and each instance reaches it through its relays on 127.0.0.1, so
	// sslmode=verify-full, which checks the host name, does not fit.
	DSN       string
	DirectDSN string
	Schema    string // defaults.Schema if empty
	// ApplyMigrations creates the liveness objects before the fleet starts.
	ApplyMigrations bool

	Services      []string // instance i belongs to Services[i % len]; {"demo"} if empty
	Instances     int      // total number of instances
	HeartbeatOnly int      // how many of them (the first ones) run heartbeat-table-only, with no alive lock

	HeartbeatInterval     time.Duration
	HeartbeatSlowInterval time.Duration
	StaleThreshold        time.Duration
	DefinitiveDeadCutoff  time.Duration // recorded in each row: a hung lock holder is a zombie past it
	VerifyInterval        time.Duration // of the alive locks

	// Leases are the names of the singleton jobs every running instance competes for.
	Leases   []string
	LeaseTTL time.Duration
	// JobDuration is how long the default job leads (jittered by ±50%); when the job
	// returns, its instance steps down. JobPause is the elector's retry period, so that
	// holders change.
	JobDuration time.Duration
	JobPause    time.Duration
	// Job runs while an instance leads a lease (liveness.ElectorConfig.OnStartedLeading).
	// nil sleeps for JobDuration. It must return when ctx ends (leadership is ending: the
	// lease was lost, or the instance stops or dies); returning earlier steps down.
	Job func(ctx context.Context, inst Instance, self *liveness.Lease) error

	MaxConns int32 // of each instance's pool, and of the fleet's own; 2 if zero
	Logger   *slog.Logger
}

// DefaultConfig is a small fleet with demo timings: states change within a minute.
func DefaultConfig() Config {
	return Config{
		Schema:                defaults.Schema,
		ApplyMigrations:       true,
		Services:              []string{"checkout", "billing"},
		Instances:             6,
		HeartbeatOnly:         2,
		HeartbeatInterval:     5 * time.Second,
		HeartbeatSlowInterval: 10 * time.Second,
		StaleThreshold:        20 * time.Second,
		DefinitiveDeadCutoff:  45 * time.Second,
		VerifyInterval:        2 * time.Second,
		Leases:                []string{"cleanup", "alerts", "mail-checks", "uptime-runner"},
		LeaseTTL:              8 * time.Second,
		JobDuration:           10 * time.Second,
		JobPause:              3 * time.Second,
		MaxConns:              2,
	}
}

func (c *Config) defaults() error {
	d := DefaultConfig()
	if c.DSN == "" {
		return errors.New("--dsn (or DATA_SOURCE_NAME) must not be empty")
	}
	if c.DirectDSN == "" {
		c.DirectDSN = c.DSN
	}
	if c.Schema == "" {
		c.Schema = defaults.Schema
	}
	if len(c.Services) == 0 {
		c.Services = []string{"demo"}
	}
	for _, s := range c.Services {
		if strings.TrimSpace(s) == "" {
			return errors.New("--services must not contain an empty name")
		}
	}
	if c.Instances < 1 {
		return fmt.Errorf("--instances must be at least 1, got %d", c.Instances)
	}
	if c.HeartbeatOnly < 0 || c.HeartbeatOnly > c.Instances {
		return fmt.Errorf("--heartbeat-only must be between 0 and --instances (%d), got %d", c.Instances, c.HeartbeatOnly)
	}
	set := func(p *time.Duration, def time.Duration) {
		if *p == 0 {
			*p = def
		}
	}
	set(&c.HeartbeatInterval, d.HeartbeatInterval)
	set(&c.HeartbeatSlowInterval, d.HeartbeatSlowInterval)
	set(&c.StaleThreshold, d.StaleThreshold)
	set(&c.DefinitiveDeadCutoff, max(d.DefinitiveDeadCutoff, 2*c.StaleThreshold))
	set(&c.VerifyInterval, d.VerifyInterval)
	set(&c.LeaseTTL, d.LeaseTTL)
	set(&c.JobDuration, d.JobDuration)
	set(&c.JobPause, d.JobPause)
	if c.LeaseTTL < liveness.MinLeaseTTL {
		return fmt.Errorf("--lease-ttl (%s) must be at least %s", c.LeaseTTL, liveness.MinLeaseTTL)
	}
	seen := map[string]bool{}
	for _, l := range c.Leases {
		if l == "" || seen[l] {
			return fmt.Errorf("--leases: empty or repeated name %q", l)
		}
		seen[l] = true
	}
	if c.MaxConns == 0 {
		c.MaxConns = d.MaxConns
	}
	c.Logger = logging.Wrap(c.Logger) // passwords removed from every line
	return nil
}

// State of a simulated instance.
type State string

const (
	Running State = "running"
	Killed  State = "killed" // sessions closed, agent stopped; its row and leases left behind
	Hung    State = "hung"   // sessions open and frozen: the lock stays held, the heartbeat ages
	Stopped State = "stopped"
)

// Instance describes one simulated instance.
type Instance struct {
	Index     int
	ID        uuid.UUID
	Service   string
	Mode      liveness.Mode
	AliveLock bool // whether it holds an alive lock (false in heartbeat-table-only mode)
	State     State
}

type instance struct {
	info   Instance // guarded by Fleet.mu (State changes)
	agent  *liveness.Agent
	pool   *pgxpool.Pool // through pooled
	pooled *link         // the pool's path
	direct *link         // the alive lock's path
	muted  atomic.Bool   // a dead or stopped process logs nothing
	log    *slog.Logger

	stopAgent, stopJobs context.CancelFunc // nil until run
	agentDone           chan struct{}
	jobs                sync.WaitGroup
}

// close releases what newInstance opened; safe on a partly built instance.
func (inst *instance) close() {
	if inst.pool != nil {
		inst.pool.Close()
	}
	for _, l := range []*link{inst.pooled, inst.direct} {
		if l != nil {
			l.close()
		}
	}
}

// Fleet is a running simulated fleet. Stop ends every goroutine it started and closes
// every connection it opened.
type Fleet struct {
	cfg  Config
	pool *pgxpool.Pool // the fleet's own, straight to the server

	mu        sync.Mutex
	instances []*instance
	stopped   bool
}

// Start applies the migrations if asked, then starts every instance. It returns once all
// are started, not once they have beaten or claimed; ctx bounds the start only.
func Start(ctx context.Context, cfg Config) (*Fleet, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	pool, err := database.NewPool(database.PoolConfig{
		DSN: cfg.DSN, MaxConns: cfg.MaxConns, ApplicationName: PoolApplicationName, ConnectTimeout: 5 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("--dsn: %w", err)
	}
	if cfg.ApplyMigrations {
		if _, err := migrations.Apply(ctx, pool, cfg.Schema); err != nil {
			pool.Close()
			return nil, fmt.Errorf("apply migrations: %w", err)
		}
	}
	f := &Fleet{cfg: cfg, pool: pool}
	host, _ := os.Hostname()
	for i := range cfg.Instances {
		inst, err := f.newInstance(i, host)
		if err != nil {
			f.Stop()
			return nil, err
		}
		f.instances = append(f.instances, inst)
	}
	for _, inst := range f.instances {
		f.run(inst)
	}
	return f, nil
}

func (f *Fleet) newInstance(i int, host string) (*instance, error) {
	cfg := f.cfg
	inst := &instance{info: Instance{
		Index:     i,
		ID:        uuid.New(),
		Service:   cfg.Services[i%len(cfg.Services)],
		Mode:      liveness.ModeAdvisoryLockWhenAvailable,
		AliveLock: i >= cfg.HeartbeatOnly,
		State:     Running,
	}}
	inst.log = slog.New(muteHandler{next: cfg.Logger.Handler(), muted: &inst.muted}).
		With("instance", i, "service", inst.info.Service)
	err := inst.build(cfg, host)
	if err != nil {
		inst.close()
		return nil, fmt.Errorf("instance %d: %w", i, err)
	}
	return inst, nil
}

func (inst *instance) build(cfg Config, host string) error {
	var err error
	if inst.pooled, err = newLink(cfg.DSN); err != nil {
		return fmt.Errorf("--dsn: %w", err)
	}
	if inst.direct, err = newLink(cfg.DirectDSN); err != nil {
		return fmt.Errorf("--direct-dsn: %w", err)
	}
	if !inst.info.AliveLock {
		inst.info.Mode = liveness.ModeHeartbeatTableOnly
	}
	poolDSN, err := inst.pooled.dsn(cfg.DSN)
	if err != nil {
		return fmt.Errorf("--dsn: %w", err)
	}
	directDSN, err := inst.direct.dsn(cfg.DirectDSN)
	if err != nil {
		return fmt.Errorf("--direct-dsn: %w", err)
	}
	if inst.pool, err = database.NewPool(database.PoolConfig{
		DSN: poolDSN, MaxConns: cfg.MaxConns, ApplicationName: PoolApplicationName, ConnectTimeout: 5 * time.Second,
	}); err != nil {
		return fmt.Errorf("--dsn: %w", err)
	}
	if !inst.info.AliveLock {
		directDSN = "" // no lock, no direct connection
	}
	inst.agent, err = liveness.NewAgent(liveness.AgentConfig{
		Pool:        inst.pool,
		DirectDSN:   directDSN,
		Schema:      cfg.Schema,
		InstanceID:  inst.info.ID,
		ServiceName: inst.info.Service,
		// Distinct process ids make the rows look like separate processes on one host.
		HostName: host, ProcessID: 100000 + inst.info.Index, Mode: inst.info.Mode,
		Timing: liveness.Timing{HeartbeatInterval: cfg.HeartbeatInterval, HeartbeatSlowInterval: cfg.HeartbeatSlowInterval,
			StaleThreshold: cfg.StaleThreshold, DefinitiveDeadCutoff: cfg.DefinitiveDeadCutoff},
		VerifyInterval: cfg.VerifyInterval,
		Metadata:       map[string]any{"simulated": true, "index": inst.info.Index},
		// Without --migrations.apply another process applies them.
		WaitForSchema: !cfg.ApplyMigrations,
		Logger:        inst.log,
	})
	return err
}

// run starts the instance's agent and its campaigns. The agent's own shutdown waits for
// its campaigns' jobs and leases before it removes its row; the campaigns have their own
// context so that Kill can end them without the agent reaching the server again.
func (f *Fleet) run(inst *instance) {
	agentCtx, stopAgent := context.WithCancel(context.Background())
	jobsCtx, stopJobs := context.WithCancel(context.Background())
	inst.stopAgent, inst.stopJobs = stopAgent, stopJobs
	inst.agentDone = make(chan struct{})
	go func() {
		defer close(inst.agentDone)
		if err := inst.agent.Run(agentCtx); err != nil {
			inst.log.Error("agent stopped", "err", err)
		}
	}()
	for _, name := range f.cfg.Leases {
		inst.jobs.Go(func() { f.campaign(jobsCtx, inst, name) })
	}
}

// campaign leads lease name whenever the instance can take it, runs the job while it
// leads, and steps down when the job returns, until ctx ends.
func (f *Fleet) campaign(ctx context.Context, inst *instance, name string) {
	log := inst.log.With("lease", name)
	// Start campaigns at different times so that the instances take turns.
	if !wait.Sleep(ctx, jitter(f.cfg.JobPause)) {
		return
	}
	err := inst.agent.Elect(ctx, liveness.ElectorConfig{
		Lease: name, TTL: f.cfg.LeaseTTL, RetryPeriod: f.cfg.JobPause,
		OnStartedLeading: func(ctx context.Context, self *liveness.Lease) {
			if err := f.job(ctx, f.info(inst), self); err != nil && ctx.Err() == nil {
				log.Warn("job failed", "err", err)
			}
		},
	})
	if err != nil {
		log.Error("campaign stopped", "err", err)
	}
}

func (f *Fleet) job(ctx context.Context, inst Instance, self *liveness.Lease) error {
	if f.cfg.Job != nil {
		return f.cfg.Job(ctx, inst, self)
	}
	wait.Sleep(ctx, jitter(f.cfg.JobDuration))
	return nil
}

// jitter returns d ± 50%.
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d+1)
}

func (f *Fleet) info(inst *instance) Instance {
	f.mu.Lock()
	defer f.mu.Unlock()
	return inst.info
}

// Instances describes every instance, in index order.
func (f *Fleet) Instances() []Instance {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Instance, len(f.instances))
	for i, inst := range f.instances {
		out[i] = inst.info
	}
	return out
}

// Pool is the fleet's own pool, straight to the server, for tests and benchmarks that
// inspect the database.
func (f *Fleet) Pool() *pgxpool.Pool { return f.pool }

// transition moves a running instance to state; it fails for a wrong index or an
// instance that is not running.
func (f *Fleet) transition(i int, to State) (*instance, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i < 0 || i >= len(f.instances) {
		return nil, fmt.Errorf("fleetsim: no instance %d (fleet of %d)", i, len(f.instances))
	}
	inst := f.instances[i]
	if inst.info.State != Running {
		return nil, fmt.Errorf("fleetsim: instance %d is %s, not running", i, inst.info.State)
	}
	inst.info.State = to
	return inst, nil
}

// Kill simulates the death of instance i: both of its paths to the server are cut, so
// PostgreSQL ends its sessions and releases its alive lock at once, and its agent and
// campaigns stop without reaching the server again. Its row and any lease it held stay
// behind, to be reaped and to be taken over. Kill returns once all of that is done.
func (f *Fleet) Kill(i int) error {
	inst, err := f.transition(i, Killed)
	if err != nil {
		return err
	}
	inst.muted.Store(true)
	// The pool's path goes first, as in a crash: a live process would notice its
	// session's end and prove life with a beat.
	inst.pooled.cutAll()
	inst.direct.cutAll()
	inst.stopJobs()
	inst.stopAgent()
	inst.jobs.Wait()
	<-inst.agentDone
	inst.pool.Close()
	f.cfg.Logger.Info("instance killed", "instance", i, "instance_id", inst.info.ID)
	return nil
}

// Leader returns a running instance of the fleet that leads one of its leases now, and
// that lease (the first of Config.Leases that one leads); ok false when none does.
func (f *Fleet) Leader(ctx context.Context) (index int, lease string, ok bool, err error) {
	reader, err := liveness.NewReader(liveness.ReaderConfig{DB: f.pool, Schema: f.cfg.Schema,
		Fallback: liveness.Timing{StaleThreshold: f.cfg.StaleThreshold, DefinitiveDeadCutoff: f.cfg.DefinitiveDeadCutoff}})
	if err != nil {
		return 0, "", false, err
	}
	infos := f.Instances()
	for _, name := range f.cfg.Leases {
		l, err := reader.Leader(ctx, name)
		if errors.Is(err, liveness.ErrNoLeader) {
			continue
		}
		if err != nil {
			return 0, "", false, err
		}
		for _, in := range infos {
			if l.InstanceID == in.ID && in.State == Running {
				return in.Index, name, true, nil
			}
		}
	}
	return 0, "", false, nil
}

// Hang simulates a stuck instance whose sessions survive: both of its paths freeze, so
// nothing it sends reaches the server and its sessions stay open. Observers see its lock
// held and its heartbeat aging: lock_only once it is stale, zombie after the
// definitive-dead cutoff. Its leases end when their trust window runs out, and the
// fleet takes them over once they expire.
func (f *Fleet) Hang(i int) error {
	inst, err := f.transition(i, Hung)
	if err != nil {
		return err
	}
	inst.muted.Store(true)
	inst.pooled.freeze()
	inst.direct.freeze()
	f.cfg.Logger.Info("instance hung", "instance", i, "instance_id", inst.info.ID)
	return nil
}

// Stop shuts the fleet down the way the instances' processes would on SIGTERM, through
// the agents' own shutdown: jobs return and campaigns release their leases, then each
// agent deletes its row and closes its lock's session. Hung instances are thawed first and stop the same
// way (the operator finally killed them); killed instances' rows stay. Then every pool
// and relay is closed. Stop waits for every goroutine and is safe to call more than
// once.
func (f *Fleet) Stop() {
	f.mu.Lock()
	if f.stopped {
		f.mu.Unlock()
		return
	}
	f.stopped = true
	for _, inst := range f.instances {
		inst.info.State = Stopped
	}
	instances := f.instances
	f.mu.Unlock()

	var wg sync.WaitGroup
	for _, inst := range instances {
		wg.Go(func() {
			if inst.stopAgent != nil {
				inst.pooled.thaw()
				inst.direct.thaw()
				inst.stopJobs()
				inst.jobs.Wait()
				inst.stopAgent()
				<-inst.agentDone
			}
			inst.close()
		})
	}
	wg.Wait()
	f.pool.Close()
}

// muteHandler drops every record while muted is set.
type muteHandler struct {
	next  slog.Handler
	muted *atomic.Bool
}

func (h muteHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return !h.muted.Load() && h.next.Enabled(ctx, l)
}

func (h muteHandler) Handle(ctx context.Context, r slog.Record) error {
	if h.muted.Load() {
		return nil
	}
	return h.next.Handle(ctx, r)
}

func (h muteHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return muteHandler{next: h.next.WithAttrs(attrs), muted: h.muted}
}

func (h muteHandler) WithGroup(name string) slog.Handler {
	return muteHandler{next: h.next.WithGroup(name), muted: h.muted}
}

// Status is what the database says about one instance.
type Status struct {
	Instance
	Row          bool                   // the instances row exists (false once reaped or removed)
	Observed     liveness.InstanceState // by instance_states, the verdict every consumer uses; "" without a row
	LockHeld     bool                   // a session holds its alive lock
	HeartbeatAge time.Duration          // by the database clock; 0 without a row
}

// Alive reports whether the database calls the instance alive.
func (s Status) Alive() bool { return s.Row && s.Observed.Alive() }

// Statuses asks the database about every instance, in one round trip, through the same
// reader the library offers services (instance_states, the one verdict).
func (f *Fleet) Statuses(ctx context.Context) ([]Status, error) {
	reader, err := liveness.NewReader(liveness.ReaderConfig{DB: f.pool, Schema: f.cfg.Schema,
		Fallback: liveness.Timing{StaleThreshold: f.cfg.StaleThreshold, DefinitiveDeadCutoff: f.cfg.DefinitiveDeadCutoff}})
	if err != nil {
		return nil, err
	}
	var now time.Time
	if err := f.pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return nil, err
	}
	all, err := reader.Instances(ctx, "")
	if err != nil {
		return nil, err
	}
	byID := map[uuid.UUID]liveness.InstanceStatus{}
	for _, s := range all {
		byID[s.InstanceID] = s
	}
	infos := f.Instances()
	out := make([]Status, len(infos))
	for i, in := range infos {
		out[i].Instance = in
		if s, ok := byID[in.ID]; ok {
			out[i].Row, out[i].Observed, out[i].LockHeld = true, s.State, s.LockHeld
			out[i].HeartbeatAge = max(now.Sub(s.LastHeartbeat), 0)
		}
	}
	return out, nil
}
