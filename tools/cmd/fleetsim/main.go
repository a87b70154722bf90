// Command fleetsim runs a simulated fleet of service instances against PostgreSQL, each
// a liveness.Agent as a service would embed it, so that pg_liveness_exporter has
// something to watch: instances holding their alive lock, heartbeat-only instances, one
// that dies (its connections cut), one that hangs (its connections frozen), and leased
// singleton jobs changing hands through the elector.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/common/promslog/flag"

	"github.com/pg-liveness/pg_liveness_exporter/internal/dsn"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/tools/fleetsim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv("DATA_SOURCE_NAME"), os.Stderr))
}

func run(ctx context.Context, args []string, envDSN string, stderr io.Writer) int {
	cfg := fleetsim.DefaultConfig()
	var (
		dsnFlag, services, leases string
		killAfter, hangAfter      time.Duration
		killLeaderAfter           time.Duration
		reportEvery               time.Duration
		maxConns                  int
		logCfg                    promslog.Config
	)
	app := kingpin.New("fleetsim", "Runs a simulated fleet of liveness agents (alive locks, heartbeats, leased jobs) and injects faults into their connections.")
	app.UsageWriter(stderr)
	app.ErrorWriter(stderr)
	app.HelpFlag.Short('h')
	app.Flag("dsn", "PostgreSQL DSN of the fleet's pool. Default: DATA_SOURCE_NAME.").StringVar(&dsnFlag)
	app.Flag("direct-dsn", "DSN of the alive locks' sessions (PostgreSQL itself, not a pooler). Default: --dsn.").StringVar(&cfg.DirectDSN)
	app.Flag("schema", "Schema of the liveness objects.").Default(cfg.Schema).StringVar(&cfg.Schema)
	app.Flag("migrations.apply", "Apply the migrations before starting.").Default("true").BoolVar(&cfg.ApplyMigrations)
	app.Flag("services", "Comma-separated service names; instances are spread over them.").Default(strings.Join(cfg.Services, ",")).StringVar(&services)
	app.Flag("instances", "Number of instances.").Default(fmt.Sprint(cfg.Instances)).IntVar(&cfg.Instances)
	app.Flag("heartbeat-only", "How many of the instances run heartbeat-table-only, with no alive lock.").Default(fmt.Sprint(cfg.HeartbeatOnly)).IntVar(&cfg.HeartbeatOnly)
	app.Flag("heartbeat-interval", "Fast heartbeat cadence.").Default(cfg.HeartbeatInterval.String()).DurationVar(&cfg.HeartbeatInterval)
	app.Flag("heartbeat-slow-interval", "Heartbeat cadence while the alive lock is held.").Default(cfg.HeartbeatSlowInterval.String()).DurationVar(&cfg.HeartbeatSlowInterval)
	app.Flag("stale-threshold", "Heartbeat age after which an instance is stale; use the exporter's --agent.stale-threshold.").Default(cfg.StaleThreshold.String()).DurationVar(&cfg.StaleThreshold)
	app.Flag("definitive-dead-cutoff", "Heartbeat age after which a lock holder is a zombie; recorded in each instance's row.").Default(cfg.DefinitiveDeadCutoff.String()).DurationVar(&cfg.DefinitiveDeadCutoff)
	app.Flag("leases", "Comma-separated names of the leased singleton jobs every instance competes for; empty for none.").Default(strings.Join(cfg.Leases, ",")).StringVar(&leases)
	app.Flag("lease-ttl", "TTL of the job leases; renewed every ttl/4.").Default(cfg.LeaseTTL.String()).DurationVar(&cfg.LeaseTTL)
	app.Flag("job-duration", "How long a job holds its lease (±50%).").Default(cfg.JobDuration.String()).DurationVar(&cfg.JobDuration)
	app.Flag("job-pause", "Wait between an instance's attempts at a lease (±50%).").Default(cfg.JobPause.String()).DurationVar(&cfg.JobPause)
	app.Flag("kill-after", "Kill the last lock-holding instance after this long: its connections are cut (0: never).").Default("30s").DurationVar(&killAfter)
	app.Flag("hang-after", "Hang the last-but-one lock-holding instance after this long: its connections freeze (0: never).").Default("20s").DurationVar(&hangAfter)
	app.Flag("kill-leader-after", "Kill an instance that leads one of --leases after this long (the first that leads one from then on): its lease is taken over, and the history shows the gap (0: never).").
		Default("0s").DurationVar(&killLeaderAfter)
	app.Flag("report-interval", "How often to log every instance's state as the database sees it (0: never).").Default("10s").DurationVar(&reportEvery)
	app.Flag("max-conns", "Connections of each instance's pool (its alive lock adds one).").Default(fmt.Sprint(cfg.MaxConns)).IntVar(&maxConns)
	flag.AddFlags(app, &logCfg)
	if _, err := app.Parse(args); err != nil {
		fmt.Fprintf(stderr, "fleetsim: error: %s\n", logging.Redact(err.Error()))
		return 2
	}
	logger := newLogger(logCfg, stderr)

	cfg.DSN = dsnFlag
	if cfg.DSN == "" {
		cfg.DSN = envDSN
	}
	if err := dsn.Validate(cfg.DSN); cfg.DSN != "" && err != nil {
		fmt.Fprintf(stderr, "fleetsim: error: --dsn: malformed DSN: %s\n", logging.Redact(err.Error()))
		return 2
	}
	cfg.Services = splitList(services)
	cfg.Leases = splitList(leases)
	if maxConns < 1 || maxConns > 100 {
		fmt.Fprintf(stderr, "fleetsim: error: --max-conns must be between 1 and 100, got %d\n", maxConns)
		return 2
	}
	cfg.MaxConns = int32(maxConns)
	cfg.Logger = logger
	if cfg.DefinitiveDeadCutoff <= cfg.StaleThreshold {
		fmt.Fprintf(stderr, "fleetsim: error: --definitive-dead-cutoff (%s) must be above --stale-threshold (%s)\n", cfg.DefinitiveDeadCutoff, cfg.StaleThreshold)
		return 2
	}
	// Faults go to the last lock-holding instances; the others stay alive.
	withLock := cfg.Instances - cfg.HeartbeatOnly
	killIdx, hangIdx := cfg.Instances-1, cfg.Instances-2
	if need := btoi(killAfter > 0) + btoi(hangAfter > 0); need > 0 && withLock < need+1 {
		fmt.Fprintf(stderr, "fleetsim: error: --instances minus --heartbeat-only must leave %d lock-holding instances for the faults and one to stay alive, got %d\n", need+1, withLock)
		return 2
	}
	if killAfter <= 0 {
		hangIdx = cfg.Instances - 1
	}

	startCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	fleet, err := fleetsim.Start(startCtx, cfg)
	cancel()
	if err != nil {
		fmt.Fprintf(stderr, "fleetsim: error: %s\n", logging.Redact(err.Error()))
		return 1
	}
	defer fleet.Stop()
	for _, in := range fleet.Instances() {
		logger.Info("instance started", "instance", in.Index, "instance_id", in.ID, "service", in.Service,
			"mode", in.Mode, "alive_lock", in.AliveLock)
	}

	timer := func(d time.Duration) <-chan time.Time {
		if d <= 0 {
			return nil
		}
		return time.After(d)
	}
	kill, hang, killLeader := timer(killAfter), timer(hangAfter), timer(killLeaderAfter)
	var leaderTries <-chan time.Time // once killLeader fired: every second until a leader is found
	var leaderTicker *time.Ticker
	defer func() {
		if leaderTicker != nil {
			leaderTicker.Stop()
		}
	}()
	var report <-chan time.Time
	if reportEvery > 0 {
		t := time.NewTicker(reportEvery)
		defer t.Stop()
		report = t.C
	}
	// fault injects one fault into instance i and logs what the exporter will show.
	fault := func(name string, inject func(int) error, i int, shows string) {
		if err := inject(i); err != nil {
			logger.Error(name, "err", err)
			return
		}
		logger.Info("FAULT: "+shows, "instance", i, "instance_id", fleet.Instances()[i].ID)
	}
	for {
		select {
		case <-ctx.Done():
			logger.Info("stopping the fleet")
			fleet.Stop()
			return 0
		case <-kill:
			fault("kill", fleet.Kill, killIdx, "killed instance: connections cut, lock released at once, no more heartbeats; lock_lost, then stale about a second later, its leases taken over, then reaped")
		case <-killLeader:
			leaderTicker = time.NewTicker(time.Second)
			leaderTries = leaderTicker.C
		case <-leaderTries:
			qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			i, lease, ok, err := fleet.Leader(qctx)
			cancel()
			if err != nil {
				logger.Warn("cannot read the leases' leaders", "err", err)
				continue
			}
			if !ok {
				continue
			}
			leaderTicker.Stop()
			leaderTries = nil
			fault("kill", fleet.Kill, i, "killed the leader of "+lease+": connections cut; dead a lock grace later, "+
				"its lease taken over, the gap on the status page's timeline and in pg_liveness_lease_leaderless_seconds")
		case <-hang:
			fault("hang", fleet.Hang, hangIdx, "hung instance: connections frozen, lock still held, no more heartbeats; lock_only after --stale-threshold, zombie after --definitive-dead-cutoff, then reaped; its leases expire and are taken over")
		case <-report:
			logReport(ctx, fleet, logger)
		}
	}
}

// newLogger builds the simulator's one logger; every line passes the redacting handler.
func newLogger(cfg promslog.Config, w io.Writer) *slog.Logger {
	return logging.Wrap(promslog.New(&promslog.Config{Level: cfg.Level, Format: cfg.Format, Writer: w}))
}

func logReport(ctx context.Context, fleet *fleetsim.Fleet, logger *slog.Logger) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	statuses, err := fleet.Statuses(qctx)
	if err != nil {
		logger.Warn("cannot read instance states", "err", err)
		return
	}
	counts := map[string]int{}
	var parts []string
	for _, s := range statuses {
		state := string(s.Observed)
		if !s.Row {
			state = "gone"
		}
		counts[state]++
		parts = append(parts, fmt.Sprintf("%d:%s/%s", s.Index, s.State, state))
	}
	var summary []string
	for state, n := range counts {
		summary = append(summary, fmt.Sprintf("%s=%d", state, n))
	}
	sort.Strings(summary)
	logger.Info("fleet", "observed", strings.Join(summary, " "), "instances", strings.Join(parts, " "))
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
