// Package fleetsim runs a simulated fleet of service instances in one process, built on
// the liveness package: each instance is a HeartbeatWorker, most also hold an AliveLock,
// and all of them take turns at leased singleton jobs. Faults can be injected per
// instance: Kill models a process death (the lock's session ends, the heartbeat stops,
// the row stays for the reaper), Hang models a stuck process whose session survives (the
// lock stays held, the heartbeat stops).
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
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/database"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// PoolApplicationName names the connections of the fleet's shared pool. The alive locks'
// connections are named "<service>:alive-lock" by the liveness package.
const PoolApplicationName = "fleetsim:pool"

// Config describes a fleet. Zero durations take the defaults of DefaultConfig.
type Config struct {
	DSN       string // the shared pool's DSN
	DirectDSN string // the alive locks' DSN; DSN if empty
	Schema    string // liveness.DefaultSchema if empty
	// ApplyMigrations creates the liveness objects before the fleet starts.
	ApplyMigrations bool

	Services      []string // instance i belongs to Services[i % len]; {"demo"} if empty
	Instances     int      // total number of instances
	HeartbeatOnly int      // how many of them (the first ones) run heartbeat-table-only, without an alive lock

	HeartbeatInterval     time.Duration
	HeartbeatSlowInterval time.Duration
	StaleThreshold        time.Duration
	DefinitiveDeadCutoff  time.Duration // recorded in each row: a hung lock holder is a zombie past it
	VerifyInterval        time.Duration // of the alive locks

	// Leases are the names of the singleton jobs every running instance competes for.
	Leases   []string
	LeaseTTL time.Duration
	// JobDuration is how long the default job holds its lease (jittered by ±50%);
	// JobPause is the wait between two attempts at the same lease by one instance
	// (jittered likewise), so that holders change.
	JobDuration time.Duration
	JobPause    time.Duration
	// Job runs while an instance holds a lease. nil sleeps for JobDuration. It must
	// return when ctx ends (the lease was lost, or the instance stops or dies).
	Job func(ctx context.Context, inst Instance, lease *liveness.Lease) error

	MaxConns int32 // of the shared pool; 4 if zero
	Logger   *slog.Logger
}

// DefaultConfig is a small fleet with demo timings: states change within a minute.
func DefaultConfig() Config {
	return Config{
		Schema:                liveness.DefaultSchema,
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
		MaxConns:              4,
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
		c.Schema = liveness.DefaultSchema
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
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// State of a simulated instance.
type State string

const (
	Running State = "running"
	Killed  State = "killed" // lock session closed, heartbeat and jobs stopped, row left behind
	Hung    State = "hung"   // lock still held, heartbeat and jobs stopped
	Stopped State = "stopped"
)

// Instance describes one simulated instance.
type Instance struct {
	Index     int
	ID        uuid.UUID
	Service   string
	Mode      liveness.Mode
	AliveLock bool // whether it holds (or tries to hold) an alive lock
	State     State
}

type instance struct {
	info   Instance // guarded by Fleet.mu (State changes)
	lock   *liveness.AliveLock
	hb     *liveness.HeartbeatWorker
	leases *liveness.Leases

	stopLock, stopBeat, stopJobs context.CancelFunc
	lockDone, beatDone           chan struct{}
	jobs                         sync.WaitGroup
}

// Fleet is a running simulated fleet. Stop ends every goroutine it started and closes
// every connection it opened.
type Fleet struct {
	cfg  Config
	pool *pgxpool.Pool

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
	log := cfg.Logger.With("instance", i, "service", inst.info.Service)
	var lockSource liveness.LockSource
	if inst.info.AliveLock {
		lock, err := liveness.NewAliveLock(liveness.AliveLockConfig{
			DSN: cfg.DirectDSN, Schema: cfg.Schema, InstanceID: inst.info.ID, ServiceName: inst.info.Service,
			VerifyInterval: cfg.VerifyInterval, Logger: log,
		})
		if err != nil {
			return nil, err
		}
		inst.lock, lockSource = lock, lock
	} else {
		inst.info.Mode = liveness.ModeHeartbeatTableOnly
	}
	hb, err := liveness.NewHeartbeatWorker(liveness.HeartbeatConfig{
		Pool: f.pool, Schema: cfg.Schema, InstanceID: inst.info.ID, ServiceName: inst.info.Service,
		// Distinct process ids make the rows look like separate processes on one host.
		HostName: host, ProcessID: 100000 + i, Mode: inst.info.Mode,
		Interval: cfg.HeartbeatInterval, SlowInterval: cfg.HeartbeatSlowInterval, StaleThreshold: cfg.StaleThreshold,
		DefinitiveDeadCutoff: cfg.DefinitiveDeadCutoff,
		Lock:                 lockSource, Metadata: map[string]any{"simulated": true, "index": i}, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	inst.hb = hb
	if inst.leases, err = liveness.NewLeases(liveness.LeasesConfig{Pool: f.pool, Schema: cfg.Schema, Logger: log}); err != nil {
		return nil, err
	}
	return inst, nil
}

// run starts the instance's goroutines. Each part has its own context so that faults can
// stop some parts and leave the others running.
func (f *Fleet) run(inst *instance) {
	log := f.cfg.Logger.With("instance", inst.info.Index)
	lockCtx, stopLock := context.WithCancel(context.Background())
	beatCtx, stopBeat := context.WithCancel(context.Background())
	jobsCtx, stopJobs := context.WithCancel(context.Background())
	inst.stopLock, inst.stopBeat, inst.stopJobs = stopLock, stopBeat, stopJobs
	inst.lockDone, inst.beatDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(inst.lockDone)
		if inst.lock != nil {
			if err := inst.lock.Run(lockCtx); err != nil {
				log.Error("alive lock stopped", "err", err)
			}
		}
	}()
	go func() {
		defer close(inst.beatDone)
		if err := inst.hb.Run(beatCtx); err != nil {
			log.Error("heartbeat stopped", "err", err)
		}
	}()
	for _, name := range f.cfg.Leases {
		inst.jobs.Go(func() { f.jobLoop(jobsCtx, inst, name) })
	}
}

// jobLoop competes for one lease until ctx ends. It takes the lease with TryAcquire and
// releases it when the job is done, as Leases.Run does, except that a dead or hung
// instance does not release: its lease runs out, and another instance takes over after
// the expiry with a new epoch, which is what the field report's fleet sees.
func (f *Fleet) jobLoop(ctx context.Context, inst *instance, name string) {
	log := f.cfg.Logger.With("instance", inst.info.Index, "lease", name)
	for {
		// Start attempts at different times so that the instances take turns.
		if !sleep(ctx, jitter(f.cfg.JobPause)) {
			return
		}
		lease, err := inst.leases.TryAcquire(ctx, name, f.cfg.LeaseTTL)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("cannot acquire lease", "err", err)
			}
			continue
		}
		if lease == nil {
			continue // another instance holds it
		}
		log.Debug("lease acquired", "epoch", lease.Epoch)
		if err := f.job(lease.Context(), f.info(inst), lease); err != nil && lease.Err() == nil {
			log.Warn("job failed", "err", err)
		}
		if ctx.Err() != nil && f.info(inst).State != Stopped {
			// Killed or hung: the process never gets to release; the renewer has stopped
			// with ctx, so the row simply expires.
			return
		}
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := lease.Release(rctx); err != nil {
			log.Warn("release failed", "err", err)
		}
		cancel()
		if reason, lost := lease.LostReason(); lost {
			log.Info("lease lost", "epoch", lease.Epoch, "reason", reason)
		}
	}
}

func (f *Fleet) job(ctx context.Context, inst Instance, lease *liveness.Lease) error {
	if f.cfg.Job != nil {
		return f.cfg.Job(ctx, inst, lease)
	}
	sleep(ctx, jitter(f.cfg.JobDuration))
	return nil
}

// jitter returns d ± 50%.
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d+1)
}

// sleep waits d and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
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

// Pool is the fleet's shared pool, for tests and benchmarks that inspect the database.
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

// Kill simulates the death of instance i: its jobs and heartbeat stop, and its alive
// lock's connection closes, so PostgreSQL releases the lock at once. Its row and any lease
// it held stay behind, to be reaped and to expire. Kill returns once all of that is done.
func (f *Fleet) Kill(i int) error {
	inst, err := f.transition(i, Killed)
	if err != nil {
		return err
	}
	// The heartbeat stops before the session closes, as in a crash: a live process would
	// notice its session's end and prove life with a beat.
	inst.stopJobs()
	inst.stopBeat()
	<-inst.beatDone
	inst.stopLock()
	inst.jobs.Wait()
	<-inst.lockDone
	f.cfg.Logger.Info("instance killed", "instance", i, "instance_id", inst.info.ID)
	return nil
}

// Hang simulates a stuck instance whose session survives: its jobs and heartbeat stop,
// its alive lock stays held. Observers see it lock_only once the heartbeat is stale, and
// zombie after the definitive-dead cutoff. Hang returns once the heartbeat has stopped.
func (f *Fleet) Hang(i int) error {
	inst, err := f.transition(i, Hung)
	if err != nil {
		return err
	}
	inst.stopJobs()
	inst.stopBeat()
	inst.jobs.Wait()
	<-inst.beatDone
	f.cfg.Logger.Info("instance hung", "instance", i, "instance_id", inst.info.ID)
	return nil
}

// Stop shuts the fleet down the way the instances' processes would on SIGTERM: running
// instances release their leases and delete their rows; hung instances delete their rows
// too (the operator finally killed them); killed instances' rows stay. Then every alive
// lock's session and the pool are closed. Stop waits for every goroutine and is safe to
// call more than once.
func (f *Fleet) Stop() {
	f.mu.Lock()
	if f.stopped {
		f.mu.Unlock()
		return
	}
	f.stopped = true
	remove := make([]bool, len(f.instances))
	for i, inst := range f.instances {
		remove[i] = inst.info.State != Killed
		inst.info.State = Stopped
	}
	instances := f.instances
	f.mu.Unlock()

	for _, inst := range instances {
		if inst.stopJobs == nil {
			continue // never started: Start failed part-way
		}
		inst.stopJobs()
		inst.stopBeat()
	}
	var wg sync.WaitGroup
	for i, inst := range instances {
		if inst.stopJobs == nil {
			continue
		}
		wg.Go(func() {
			inst.jobs.Wait()
			<-inst.beatDone
			if remove[i] {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := inst.hb.Remove(ctx); err != nil {
					f.cfg.Logger.Warn("cannot remove instance row", "instance", i, "err", err)
				}
			}
			inst.stopLock()
			<-inst.lockDone
		})
	}
	wg.Wait()
	f.pool.Close()
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
		StaleThreshold: f.cfg.StaleThreshold, DefinitiveDeadCutoff: f.cfg.DefinitiveDeadCutoff})
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
