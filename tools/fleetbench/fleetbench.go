// Package fleetbench measures what a fleet of agents costs one PostgreSQL: N agents at the
// library's defaults (each with its own pool, through PgBouncer in transaction mode as in
// production, and its own alive-lock session; the reaper on; every agent campaigning with
// Agent.Elect for a few jobs), beside an application's primary-key lookup. It reports the
// server's CPU (read from /proc for the postmaster and its children, so the server must
// run on this host), statements a second (pg_stat_statements), backends, listening
// sessions, the lookup's latency (from a process of its own, see Serve) against the
// same lookup with no fleet, and one victim's
// crash → dead and crash → takeover.
//
// The victim is an agent like the others whose connections run through relays on
// 127.0.0.1; its crash cuts them, as a kill -9 would: PostgreSQL ends its sessions at once
// and nothing it tries later reaches the server.
//
// The agents run in this process, or spread over processes of their own (Config.Processes),
// so that thousands of them fit within one process's open-files limit.
//
// make bench-fleet runs it at 100 and 1,000 agents (TestBenchFleet); make test runs it at
// a small scale (TestFleetBenchSmall), so that it cannot rot.
package fleetbench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/nodeagent"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
	"github.com/pg-liveness/pg_liveness_exporter/tools/internal/wait"
)

// Config is one run.
type Config struct {
	// DirectDSN reaches PostgreSQL itself: the alive-lock sessions, the lookup's and the
	// harness's. PoolDSN reaches it through PgBouncer in transaction mode: the agents'
	// pools (add default_query_exec_mode=exec).
	DirectDSN, PoolDSN string
	// VictimDSN is DirectDSN over TCP, which the victim's relay needs; DirectDSN if empty.
	VictimDSN string
	// PostmasterPID is the server's postmaster, whose process and children's CPU is read.
	PostmasterPID int
	Agents        int
	// Nodes, when above 0, runs that many node agents (nodeagent.Server, each on a
	// socket of its own) and attaches the agents to them in turn: the alive locks and
	// the listening are then the node agents' sessions, one per node.
	Nodes int
	Jobs  []string // the leases every agent campaigns for; three if empty
	// Processes, when above 1, runs the agents and the node agents in that many processes
	// of their own (this test binary started again, see Serve): each process holds its
	// share of the agents' connections, within its own open-files limit. Node agent n and
	// the agents attached to it share process n % Processes, as a node's processes share a
	// host. The victim, the lookup and the measuring stay here.
	Processes int
	// FleetNice, when above 0 (at most 19), runs the agents and node agents at that
	// niceness, in processes of their own even when one would hold them all (Processes
	// 1): on a machine where they share the server's cores, the server and the lookup
	// then have the cores first, as on a database host of their own. The victim and the
	// measuring stay in this process at its own priority.
	FleetNice int
	// Idle is how long the lookup runs before the fleet starts (its baseline), Warmup
	// how long the fleet runs before it is measured, Measure how long it is measured.
	Idle, Warmup, Measure time.Duration
	StartRate             int // agents started a second (50 if zero), so that connections do not storm
	LookupRate            int // application lookups a second on each lookup session (20 if zero)
	// LookupSessions is how many sessions of the lookup's process run the application's
	// lookup, each at LookupRate (10 if zero): one session's 60 s at 20 a second are
	// 1,200 samples, whose p99 is the twelfth slowest; ten give 12,000 with the same
	// cold path, a backend asked every 50 ms.
	LookupSessions int
	PoolMaxConns   int32
	Logger         *slog.Logger // the agents'; nil discards
	VictimLogger   *slog.Logger // the victim's; Logger if nil
	// Diagnose, when set, adds the caller's view to a failed run's diagnosis while the
	// fleet still runs: PgBouncer's pools and log, say, which the server cannot see.
	Diagnose func(context.Context) string
}

// Latency is a distribution's median and 99th percentile.
type Latency struct{ P50, P99 time.Duration }

// ServerTime is a statement's time in the server's executor (pg_stat_statements): its
// mean and its slowest. It leaves out what the client's latency adds around it: the
// round trip, the backend's wake-up, parsing, the plan cache and the locks taken before
// the executor runs.
type ServerTime struct{ Mean, Max time.Duration }

// Result is what a run measured.
type Result struct {
	Agents    int
	LocksHeld int // agents whose alive lock the full verdict sees held at the end
	// IdleCPU and FleetCPU are the server's cores, with the lookup only and with the
	// fleet; LivenessCPU the difference.
	IdleCPU, FleetCPU, LivenessCPU float64
	// Statements is statements a second beside the harness's own, with the fleet.
	Statements   float64
	TopStatement []string           // the busiest statement tags, "tag: calls/s"
	Calls        map[string]float64 // calls a second by statement tag
	Nodes        int
	PoolMaxConns int32 // each agent's pool's connections, at most
	Backends     int   // client backends with the fleet running
	LockSessions int   // alive-lock and node agent sessions: each LISTENs to the schema's events
	LookupIdle   Latency
	LookupFleet  Latency
	// IdleLookups and Lookups are how many lookups answered in the idle baseline and
	// while the fleet was measured: the samples behind each p99.
	IdleLookups, Lookups int64
	// LookupServerIdle and LookupServerFleet are the lookup's time in the executor,
	// idle and with the fleet: what of its latency the server's work on it explains.
	LookupServerIdle, LookupServerFleet ServerTime
	// CrashToDead is from the victim's crash to its dead:<id> notification (the fleet's
	// watcher tells it once the verdict agrees); CrashToTakeover to the moment another
	// agent's job for the victim's lease started.
	CrashToDead, CrashToTakeover time.Duration
	// HistoryRows is how many rows the schema's history (migration 0020) gained while the
	// fleet was measured: its steady state writes none (the history is written on a change
	// of leadership or membership, never by a heartbeat or a renewal).
	HistoryRows int64
	// LeaderChanges is how many times the victim's lease's leadership started while the
	// fleet was measured: 0 in a fleet that can hold its leases.
	LeaderChanges int64
}

// Run runs the fleet once, and stops everything it started before it returns.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if cfg.Agents < 1 {
		return Result{}, fmt.Errorf("fleetbench: Agents must be at least 1, got %d", cfg.Agents)
	}
	if len(cfg.Jobs) == 0 {
		cfg.Jobs = []string{"job-1", "job-2", "job-3"}
	}
	cfg.StartRate = max(cfg.StartRate, 0)
	if cfg.StartRate == 0 {
		cfg.StartRate = 50
	}
	if cfg.LookupRate == 0 {
		cfg.LookupRate = 20
	}
	if cfg.LookupSessions == 0 {
		cfg.LookupSessions = 10
	}
	if cfg.PoolMaxConns == 0 {
		cfg.PoolMaxConns = 4
	}
	if cfg.FleetNice < 0 || cfg.FleetNice > 19 {
		return Result{}, fmt.Errorf("fleetbench: FleetNice must be from 0 to 19, got %d", cfg.FleetNice)
	}
	cfg.Processes = max(cfg.Processes, 1)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	res := Result{Agents: cfg.Agents, Nodes: cfg.Nodes, PoolMaxConns: cfg.PoolMaxConns}

	admin, err := pgx.Connect(ctx, cfg.DirectDSN)
	if err != nil {
		return res, fmt.Errorf("fleetbench: connect: %w", err)
	}
	defer admin.Close(context.Background())
	if err := prepare(ctx, admin); err != nil {
		return res, err
	}
	look, err := startLookups(ctx, cfg.DirectDSN, cfg.LookupRate, cfg.LookupSessions)
	if err != nil {
		return res, err
	}
	defer look.stop()

	// The lookup alone: its latency and the server's CPU without a fleet. Its sessions'
	// first lookups load their caches and plans, once: not the path it measures.
	if !wait.Sleep(ctx, 2*time.Second) {
		return res, ctx.Err()
	}
	look.reset()
	if err := resetLookupStats(ctx, admin); err != nil {
		return res, err
	}
	cpu0, err := serverCPU(cfg.PostmasterPID)
	if err != nil {
		return res, err
	}
	if !wait.Sleep(ctx, cfg.Idle) {
		return res, ctx.Err()
	}
	cpu1, _ := serverCPU(cfg.PostmasterPID)
	res.IdleCPU = cpu1.coresSince(cpu0)
	if err := look.measure(); err != nil {
		return res, err
	}
	res.LookupIdle, res.IdleLookups = look.latency(), look.count()
	if res.LookupServerIdle, err = lookupStats(ctx, admin); err != nil {
		return res, err
	}

	f, err := newFleet(cfg, "")
	if err != nil {
		return res, err
	}
	defer f.stop()
	var remote *workers
	if cfg.Processes > 1 || cfg.FleetNice > 0 {
		remote, err = startWorkers(ctx, f)
		if err != nil {
			return res, err
		}
		defer remote.stop()
	} else if err := f.startShare(ctx, allIndexes(cfg.Nodes), allIndexes(cfg.Agents), cfg.StartRate); err != nil {
		return res, err
	}
	// The victim starts once the fleet has, so that it leads victimLease before anyone
	// else campaigns for it; then every agent follows that lease too.
	if !wait.Sleep(ctx, cfg.Warmup/2) {
		return res, ctx.Err()
	}
	victim, err := f.startVictim(ctx)
	if err != nil {
		return res, err
	}
	for _, ag := range f.list() {
		if ag != victim {
			ag.campaign(f, victimLease)
		}
	}
	if remote != nil {
		if err := remote.follow(); err != nil {
			return res, err
		}
	}
	if !wait.Sleep(ctx, cfg.Warmup/2) {
		return res, ctx.Err()
	}

	calls0, err := statementCalls(ctx, admin)
	if err != nil {
		return res, err
	}
	look.reset()
	if err := resetLookupStats(ctx, admin); err != nil {
		return res, err
	}
	starts0 := f.starts.Load()
	var history0, history1 int64
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM liveness.history`).Scan(&history0); err != nil {
		return res, fmt.Errorf("fleetbench: history: %w", err)
	}
	cpu0, _ = serverCPU(cfg.PostmasterPID)
	start := time.Now()
	if !wait.Sleep(ctx, cfg.Measure) {
		return res, ctx.Err()
	}
	cpu1, _ = serverCPU(cfg.PostmasterPID)
	took := time.Since(start).Seconds()
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM liveness.history`).Scan(&history1); err != nil {
		return res, fmt.Errorf("fleetbench: history: %w", err)
	}
	res.HistoryRows = history1 - history0
	if err := look.measure(); err != nil {
		return res, err
	}
	lookups := look.count()
	res.Lookups = lookups
	if res.LookupServerFleet, err = lookupStats(ctx, admin); err != nil {
		return res, err
	}
	calls1, err := statementCalls(ctx, admin)
	if err != nil {
		return res, err
	}
	res.FleetCPU = cpu1.coresSince(cpu0)
	res.LeaderChanges = f.starts.Load() - starts0
	res.LivenessCPU = max(res.FleetCPU-res.IdleCPU, 0)
	res.LookupFleet = look.latency()
	res.Statements, res.TopStatement = callRates(calls0, calls1, took, lookups)
	res.Calls = map[string]float64{}
	for tag, n := range calls1 {
		if n > calls0[tag] { // what ran while measured, not the migrations' statements
			res.Calls[tag] = float64(n-calls0[tag]) / took
		}
	}
	if err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE backend_type = 'client backend'),
	        count(*) FILTER (WHERE application_name LIKE '%:alive-lock' OR application_name LIKE '%:node-agent')
	    FROM pg_stat_activity WHERE datname = current_database()`).Scan(&res.Backends, &res.LockSessions); err != nil {
		return res, fmt.Errorf("fleetbench: backends: %w", err)
	}
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM liveness.instance_states() WHERE lock_held`).Scan(&res.LocksHeld); err != nil {
		return res, fmt.Errorf("fleetbench: locks held: %w", err)
	}
	res.LocksHeld-- // the victim's

	if remote != nil {
		if err := remote.err(); err != nil { // a process whose agents ended early measured less than its share
			return res, fmt.Errorf("%w\n%s", err, diagnose(ctx, admin, cfg.Diagnose))
		}
	}
	dead, takeover, err := f.crash(ctx, admin, victim)
	if err != nil {
		return res, fmt.Errorf("%w\n%s", err, diagnose(ctx, admin, cfg.Diagnose))
	}
	res.CrashToDead, res.CrashToTakeover = dead, takeover
	return res, nil
}

// diagnose describes the fleet's state for a run that failed: who holds the leases and
// how they look, whether a watcher ticks, the instances by state and what the backends
// wait for; then what the caller's view adds, if any.
func diagnose(ctx context.Context, admin *pgx.Conn, caller func(context.Context) string) string {
	var b strings.Builder
	for _, q := range []string{
		`SELECT l.name || ' epoch ' || l.epoch || ' expires in ' || round(extract(epoch FROM l.expires_at - now())::numeric, 1) ||
		        ' s, holder alive ' || coalesce(liveness.is_instance_alive(l.holder_instance_id)::text, 'unknown')
		   FROM liveness.leases l ORDER BY l.name`,
		`SELECT 'watcher ticked ' || round(extract(epoch FROM clock_timestamp() - watched_at)::numeric, 2) || ' s ago' FROM liveness.alive_lock_watch`,
		`SELECT state || ': ' || count(*) FROM liveness.instance_states() GROUP BY state`,
		`SELECT waiting || ': ' || count(*)
		   FROM (SELECT coalesce(wait_event_type || ':' || wait_event, state, 'none') AS waiting FROM pg_stat_activity
		          WHERE backend_type = 'client backend') w
		  GROUP BY waiting ORDER BY count(*) DESC LIMIT 8`,
	} {
		rows, err := admin.Query(ctx, q)
		if err != nil {
			fmt.Fprintf(&b, "  (%v)\n", err)
			continue
		}
		for rows.Next() {
			var line string
			if rows.Scan(&line) == nil {
				fmt.Fprintf(&b, "  %s\n", line)
			}
		}
		rows.Close()
	}
	if caller != nil {
		b.WriteString(caller(ctx))
	}
	return b.String()
}

// prepare applies the migrations and creates the application's table.
func prepare(ctx context.Context, admin *pgx.Conn) error {
	pool, err := pgxpool.New(ctx, admin.Config().ConnString())
	if err != nil {
		return fmt.Errorf("fleetbench: %w", err)
	}
	defer pool.Close()
	if _, err := migrations.Apply(ctx, pool, defaults.Schema); err != nil {
		return fmt.Errorf("fleetbench: migrations: %w", err)
	}
	_, err = admin.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
		CREATE TABLE IF NOT EXISTS app_items (id int PRIMARY KEY, payload text NOT NULL);
		INSERT INTO app_items SELECT g, md5(g::text) FROM generate_series(1, 100000) g ON CONFLICT DO NOTHING;
		ANALYZE app_items`)
	if err != nil {
		return fmt.Errorf("fleetbench: application table: %w", err)
	}
	// The table's first vacuum (autovacuum's, after the insert) and the checkpoint after
	// it would otherwise fall into the lookup's idle baseline.
	for _, q := range []string{`VACUUM (ANALYZE) app_items`, `CHECKPOINT`} {
		if _, err := admin.Exec(ctx, q); err != nil {
			return fmt.Errorf("fleetbench: application table: %s: %w", q, err)
		}
	}
	return nil
}

// fleet is the running agents of this process.
type fleet struct {
	cfg    Config
	mu     sync.Mutex
	agents []*agent
	starts atomic.Int64 // leaderships of victimLease that started, in every agent
	// othersLed is when an agent other than the victim last started leading victimLease
	// (Unix nanoseconds), and onStart, when set, is told of each start too (a process of
	// agents reports them to Run's).
	othersLed atomic.Int64
	onStart   func(at time.Time)

	// The node agents' sockets in dir, by node (Config.Nodes), and the Run of those this
	// process runs; dir is removed at stop when this fleet made it.
	dir      string
	ownDir   bool
	sockets  []string
	stopNode context.CancelFunc
	nodes    sync.WaitGroup
}

// newFleet prepares a fleet whose node agents' sockets are in dir, or in a directory of
// its own when dir is empty and the run has node agents.
func newFleet(cfg Config, dir string) (*fleet, error) {
	f := &fleet{cfg: cfg, dir: dir}
	if cfg.Nodes == 0 {
		return f, nil
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "fleetbench-nodes-")
		if err != nil {
			return nil, fmt.Errorf("fleetbench: %w", err)
		}
		f.dir, f.ownDir = d, true
	}
	for i := range cfg.Nodes {
		f.sockets = append(f.sockets, filepath.Join(f.dir, fmt.Sprintf("node-%d.sock", i)))
	}
	return f, nil
}

func allIndexes(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// startShare starts the node agents nodes (indexes into Config.Nodes) and waits for their
// sessions, then the agents agents (indexes into Config.Agents), rate a second.
func (f *fleet) startShare(ctx context.Context, nodes, agents []int, rate int) error {
	if err := f.startNodes(ctx, nodes); err != nil {
		return err
	}
	for n, i := range agents {
		if err := f.startAgent(ctx, fmt.Sprintf("bench-%d", i%10), f.cfg.PoolDSN, f.cfg.DirectDSN, f.socket(i)); err != nil {
			return err
		}
		if (n+1)%rate == 0 && !wait.Sleep(ctx, time.Second) {
			return ctx.Err()
		}
	}
	return nil
}

// startNodes starts the node agents of the given indexes, and waits until each session
// is up.
func (f *fleet) startNodes(ctx context.Context, indexes []int) error {
	if len(indexes) == 0 {
		return nil
	}
	nodeCtx, stop := context.WithCancel(context.Background())
	f.stopNode = stop
	var agents []*nodeagent.Server
	for _, i := range indexes {
		n, err := nodeagent.New(nodeagent.Config{DirectDSN: f.cfg.DirectDSN, Socket: f.sockets[i],
			ServiceName: fmt.Sprintf("node-%d", i), Logger: f.cfg.Logger})
		if err != nil {
			return err
		}
		agents = append(agents, n)
		f.nodes.Go(func() {
			if err := n.Run(nodeCtx); err != nil {
				f.cfg.Logger.Error("node agent stopped", "err", err)
			}
		})
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, n := range agents {
		for !n.Snapshot().SessionUp {
			if time.Now().After(deadline) {
				return errors.New("fleetbench: a node agent's session did not come up within 60 s")
			}
			if !wait.Sleep(ctx, 50*time.Millisecond) {
				return ctx.Err()
			}
		}
	}
	return nil
}

// socket is the node agent the i-th agent attaches to, or "" (a session of its own).
func (f *fleet) socket(i int) string {
	if len(f.sockets) == 0 {
		return ""
	}
	return f.sockets[i%len(f.sockets)]
}

// started records that ag's job for victimLease started at at.
func (f *fleet) started(ag *agent, at time.Time) {
	f.starts.Add(1)
	if !ag.victim {
		f.othersLed.Store(at.UnixNano())
	}
	if f.onStart != nil {
		f.onStart(at)
	}
}

type agent struct {
	a      *liveness.Agent
	pool   *pgxpool.Pool
	cancel context.CancelFunc
	done   chan struct{}
	victim bool            // the agent that crashes, through its relays
	relays []*relay        // the victim's only
	ctx    context.Context // ends when the agent is stopped
	jobs   sync.WaitGroup  // its campaigns
	// leading is whether its job for victimLease runs now.
	leading atomic.Bool
}

func (f *fleet) startAgent(ctx context.Context, service, poolDSN, directDSN, socket string) error {
	_, err := f.start(ctx, service, poolDSN, directDSN, socket, nil)
	return err
}

func (f *fleet) start(ctx context.Context, service, poolDSN, directDSN, socket string, relays []*relay) (*agent, error) {
	logger := f.cfg.Logger
	if relays != nil && f.cfg.VictimLogger != nil {
		logger = f.cfg.VictimLogger
	}
	pcfg, err := pgxpool.ParseConfig(poolDSN)
	if err != nil {
		return nil, fmt.Errorf("fleetbench: pool DSN: %w", err)
	}
	pcfg.MaxConns = f.cfg.PoolMaxConns
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("fleetbench: pool: %w", err)
	}
	a, err := liveness.NewAgent(liveness.AgentConfig{
		Pool: pool, DirectDSN: directDSN, NodeAgentSocket: socket, InstanceID: uuid.New(), ServiceName: service,
		Reaper: true, Logger: logger,
	})
	if err != nil {
		pool.Close()
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	ag := &agent{a: a, pool: pool, ctx: runCtx, cancel: cancel, done: make(chan struct{}), relays: relays, victim: relays != nil}
	go func() {
		defer close(ag.done)
		defer pool.Close()
		defer ag.jobs.Wait()
		if err := a.Run(runCtx); err != nil && runCtx.Err() == nil {
			logger.Error("agent stopped", "err", err)
		}
	}()
	for _, job := range f.cfg.Jobs {
		ag.campaign(f, job)
	}
	f.mu.Lock()
	f.agents = append(f.agents, ag)
	f.mu.Unlock()
	return ag, nil
}

// victimLease is the lease the victim leads when it crashes, and every agent follows.
const victimLease = "victim-job"

// campaign runs a job for lease until the agent stops: leading whenever it can, holding
// on until its context ends.
func (ag *agent) campaign(f *fleet, lease string) {
	ag.jobs.Go(func() {
		_ = ag.a.Elect(ag.ctx, liveness.ElectorConfig{Lease: lease, OnStartedLeading: func(ctx context.Context, _ *liveness.Lease) {
			if lease == victimLease {
				f.started(ag, time.Now())
				ag.leading.Store(true)
				defer ag.leading.Store(false)
			}
			<-ctx.Done()
		}})
	})
}

func (f *fleet) list() []*agent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.agents)
}

// startVictim starts the agent that will crash, through relays, and waits until it leads
// victimLease.
func (f *fleet) startVictim(ctx context.Context) (*agent, error) {
	poolRelay, poolDSN, err := newRelay(f.cfg.PoolDSN)
	if err != nil {
		return nil, err
	}
	// Its lock's way: a session of its own, or its connection to a node agent.
	var directRelay *relay
	var directDSN, socket string
	if len(f.sockets) > 0 {
		directRelay, socket, err = newUnixRelay(f.sockets[0], filepath.Join(f.dir, "victim.sock"))
	} else {
		directRelay, directDSN, err = newRelay(cmp.Or(f.cfg.VictimDSN, f.cfg.DirectDSN))
	}
	if err != nil {
		poolRelay.cut()
		return nil, err
	}
	v, err := f.start(ctx, "victim", poolDSN, directDSN, socket, []*relay{poolRelay, directRelay})
	if err != nil {
		poolRelay.cut()
		directRelay.cut()
		return nil, err
	}
	v.campaign(f, victimLease)
	deadline := time.Now().Add(30 * time.Second)
	for !v.leading.Load() {
		if time.Now().After(deadline) {
			return nil, errors.New("fleetbench: the victim did not lead within 30 s")
		}
		if !wait.Sleep(ctx, 50*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
	return v, nil
}

// ErrVictimLost is a run that ended before the crash because the victim no longer led its
// lease: it stepped down during the run, as a leader does that cannot prove its lock in
// time (a process starved of the CPU does so by design), and another agent leads it.
var ErrVictimLost = errors.New("fleetbench: the victim no longer leads its lease at its crash (it lost it during the run)")

// crash cuts the victim's connections and waits for the fleet to call it dead and take
// its lease.
func (f *fleet) crash(ctx context.Context, admin *pgx.Conn, v *agent) (dead, takeover time.Duration, err error) {
	id := v.a.Snapshot().InstanceID
	if _, err := admin.Exec(ctx, `SELECT liveness.events_listen(), liveness.members_listen()`); err != nil {
		return 0, 0, fmt.Errorf("fleetbench: listen: %w", err)
	}
	if !v.leading.Load() {
		return 0, 0, fmt.Errorf("%w (%s)", ErrVictimLost, victimLease)
	}
	t0 := time.Now()
	for _, r := range v.relays {
		r.cut()
	}
	v.cancel()
	deadline := t0.Add(60 * time.Second)
	for dead == 0 || takeover == 0 {
		if time.Now().After(deadline) {
			return dead, takeover, fmt.Errorf("fleetbench: 60 s after the crash: dead after %s, taken over after %s (0: not yet)", dead, takeover)
		}
		wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		n, err := admin.WaitForNotification(wctx)
		cancel()
		if err == nil {
			f.cfg.Logger.Debug("notification", "payload", n.Payload, "after", time.Since(t0))
		}
		switch {
		case err == nil && dead == 0 && n.Payload == "dead:"+id.String():
			dead = time.Since(t0)
		case err != nil && admin.IsClosed():
			return dead, takeover, fmt.Errorf("fleetbench: the listening session: %w", err)
		}
		if ctx.Err() != nil {
			return dead, takeover, ctx.Err()
		}
		if at := f.othersLed.Load(); takeover == 0 && at > t0.UnixNano() {
			takeover = time.Duration(at - t0.UnixNano())
		}
	}
	return dead, takeover, nil
}

// stop stops every agent, at most a few at a time so that their row deletions and
// releases do not storm, and waits for them.
func (f *fleet) stop() {
	f.mu.Lock()
	agents := f.agents
	f.agents = nil
	f.mu.Unlock()
	for _, ag := range agents {
		ag.cancel()
	}
	for _, ag := range agents {
		<-ag.done
		for _, r := range ag.relays {
			r.cut()
		}
	}
	if f.stopNode != nil {
		f.stopNode()
		f.nodes.Wait()
	}
	if f.ownDir {
		_ = os.RemoveAll(f.dir)
	}
}

// cpuSample is the CPU time of the server's processes, by pid, in clock ticks.
type cpuSample struct {
	at    time.Time
	ticks map[int]int64
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on every Linux
// platform Go supports.
const clockTicks = 100

// serverCPU reads the user and system time of the postmaster and its children.
func serverCPU(postmaster int) (cpuSample, error) {
	s := cpuSample{at: time.Now(), ticks: map[int]int64{}}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return s, fmt.Errorf("fleetbench: server CPU: %w", err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited
		}
		// The command sits in parentheses and may hold spaces: the fields follow the last ")".
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b)[i+1:])
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		if pid != postmaster && ppid != postmaster {
			continue
		}
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		s.ticks[pid] = utime + stime
	}
	if _, ok := s.ticks[postmaster]; !ok {
		return s, fmt.Errorf("fleetbench: server CPU: no process %d in /proc: the server must run on this host", postmaster)
	}
	return s, nil
}

// coresSince is the cores the server's processes used from earlier to s. A process that
// exited in between is not counted; one that started counts from zero.
func (s cpuSample) coresSince(earlier cpuSample) float64 {
	var ticks int64
	for pid, t := range s.ticks {
		ticks += t - earlier.ticks[pid]
	}
	return float64(ticks) / clockTicks / s.at.Sub(earlier.at).Seconds()
}

// statementCalls reads pg_stat_statements' calls per statement, top level only.
func statementCalls(ctx context.Context, admin *pgx.Conn) (map[string]int64, error) {
	rows, err := admin.Query(ctx, `SELECT coalesce(substring(query FROM '/\* pg_liveness:([a-z_]+) \*/'), left(query, 40)), sum(calls)::bigint
	    FROM pg_stat_statements WHERE toplevel AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
	    GROUP BY 1`)
	if err != nil {
		return nil, fmt.Errorf("fleetbench: pg_stat_statements: %w", err)
	}
	out := map[string]int64{}
	for rows.Next() {
		var tag string
		var n int64
		if err := rows.Scan(&tag, &n); err != nil {
			return nil, err
		}
		out[tag] += n
	}
	return out, rows.Err()
}

// callRates is statements a second between two readings, the harness's lookups left out,
// and the busiest five.
func callRates(before, after map[string]int64, seconds float64, lookups int64) (float64, []string) {
	type rate struct {
		tag string
		n   int64
	}
	var all []rate
	var total int64
	for tag, n := range after {
		d := n - before[tag]
		if strings.Contains(tag, "app_items") {
			d = max(d-lookups, 0)
		}
		if d > 0 {
			all = append(all, rate{tag, d})
			total += d
		}
	}
	slices.SortFunc(all, func(a, b rate) int { return int(b.n - a.n) })
	var top []string
	for _, r := range all[:min(5, len(all))] {
		top = append(top, fmt.Sprintf("%s: %.1f/s", strings.Join(strings.Fields(r.tag), " "), float64(r.n)/seconds))
	}
	return float64(total) / seconds, top
}

// relay forwards TCP connections on 127.0.0.1 to a DSN's host, until cut.
type relay struct {
	ln      net.Listener
	network string
	target  string
	mu      sync.Mutex
	conns   []net.Conn
	closed  bool
}

// newRelay starts a relay to dsn's host and returns dsn pointed at it.
func newRelay(dsn string) (*relay, string, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, "", fmt.Errorf("fleetbench: relay: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", fmt.Errorf("fleetbench: relay: %w", err)
	}
	r := &relay{ln: ln, network: "tcp", target: net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))}
	go r.accept()
	port := ln.Addr().(*net.TCPAddr).Port
	return r, dsn + " host=127.0.0.1 port=" + strconv.Itoa(port), nil
}

// newUnixRelay starts a relay on the unix socket path to the socket target (a node
// agent's), so that cutting it closes a process's connection to its node agent, as a
// kill -9 does.
func newUnixRelay(target, path string) (*relay, string, error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, "", fmt.Errorf("fleetbench: relay: %w", err)
	}
	r := &relay{ln: ln, network: "unix", target: target}
	go r.accept()
	return r, path, nil
}

func (r *relay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial(r.network, r.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			_ = c.Close()
			_ = s.Close()
			return
		}
		r.conns = append(r.conns, c, s)
		r.mu.Unlock()
		go func() { _, _ = io.Copy(s, c); _ = s.Close() }()
		go func() { _, _ = io.Copy(c, s); _ = c.Close() }()
	}
}

// cut closes the listener and every connection: the server sees its sessions end.
func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	_ = r.ln.Close()
	for _, c := range r.conns {
		_ = c.Close()
	}
}

// BenchLine is the result as a line of Go benchmark output, one value and unit after
// another, named by the fleet's size and node agents: what make record-fleet keeps as a
// run record, which the docs quote (tools/cmd/runrecord, tools/docquote).
func (r Result) BenchLine() string {
	ms := func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 3, 64) }
	return fmt.Sprintf("BenchmarkFleet/agents=%d/node-agents=%d 1 %.4f cores %.4f millicores/agent %.1f statements/s %.3f statements/s/agent "+
		"%d locks-held %d backends %d lock-sessions %d lookups-idle %d lookups "+
		"%s ms-lookup-p50-idle %s ms-lookup-p50-fleet %s ms-lookup-p99-idle %s ms-lookup-p99-fleet "+
		"%s ms-lookup-executor-mean %s ms-lookup-executor-max %s ms-crash-to-dead %s ms-crash-to-takeover "+
		"%d leader-changes %d history-rows",
		r.Agents, r.Nodes, r.LivenessCPU, 1000*r.LivenessCPU/float64(max(r.Agents, 1)), r.Statements, r.Statements/float64(max(r.Agents, 1)),
		r.LocksHeld, r.Backends, r.LockSessions, r.IdleLookups, r.Lookups,
		ms(r.LookupIdle.P50), ms(r.LookupFleet.P50), ms(r.LookupIdle.P99), ms(r.LookupFleet.P99),
		ms(r.LookupServerFleet.Mean), ms(r.LookupServerFleet.Max), ms(r.CrashToDead), ms(r.CrashToTakeover),
		r.LeaderChanges, r.HistoryRows)
}
