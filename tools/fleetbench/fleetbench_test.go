package fleetbench_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/tools/docquote"
	"github.com/pg-liveness/pg_liveness_exporter/tools/fleetbench"
)

// TestMain serves the lookup or a share of the agents when Run started this binary as
// one of its processes.
func TestMain(m *testing.M) {
	fleetbench.Serve()
	pgtest.Main(m)
}

// startServer starts a PostgreSQL for agents agents and a PgBouncer in transaction mode in
// front of it, and returns the run's configuration.
func startServer(t testing.TB, agents int) fleetbench.Config {
	t.Helper()
	srv := pgtest.NewServer(t, pgtest.WithSetting("max_connections", itoa(agents+150)))
	db := pgtest.NewDBOn(t, srv)
	// Thousands of connections from one host would spend the run's first minute on SCRAM
	// handshakes (PgBouncer's single thread, and the server's): the agents' sessions come
	// over the unix socket, which the test server trusts, and PgBouncer trusts its
	// clients. The victim's come through relays, over TCP with the password.
	bouncer := pgtest.NewPgBouncer(t, db.DSN, pgtest.WithLimits(6*agents+100, 20), pgtest.WithTrustedClients(),
		pgtest.WithIgnoreStartupParameters("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count", "tcp_user_timeout"))
	return fleetbench.Config{
		DirectDSN:     srv.AdminDSN(db.Name),
		VictimDSN:     db.DSN,
		PoolDSN:       bouncer.DSN(db.Name) + " default_query_exec_mode=exec",
		PostmasterPID: srv.PID(),
		Agents:        agents,
		Diagnose:      bouncer.Describe,
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestFleetBenchSmall runs the fleet benchmark at a small scale, so that the harness
// behind docs/performance.md's "Fleet scale" cannot break unnoticed, and checks what must
// hold at any scale: every agent holds its alive lock, each costs the database about the
// same few statements a second as the defaults promise (a follower that tried every
// RetryPeriod would send several), the victim's crash is dead and taken over within
// seconds, and the server's CPU and the lookups were measured at all.
func TestFleetBenchSmall(t *testing.T) {
	t.Parallel() // a server of its own, and mostly waiting: beside the node agents' run
	cfg, res := runSmall(t, 0, 1, 0)
	if res.LockSessions < cfg.Agents {
		t.Errorf("%d alive-lock sessions for %d agents", res.LockSessions, cfg.Agents)
	}
	// The followers' tries are what grew with the fleet: with its session listening, an
	// agent tries each of its seven campaigns (three jobs, the victim's, the reaper's, two
	// watchers') every 30–60 s, about 0.16 a second. Followers that polled every second
	// would send 7. (The fleet-wide costs, the watchers' ticks and the leaders' proofs,
	// are not per agent, and at 20 agents they dominate the total.)
	if tries := res.Calls["lease_acquire"] / float64(cfg.Agents); res.Statements == 0 || tries > 0.5 {
		t.Errorf("%.1f statements a second, %.2f lease_acquire per agent; want more than none and at most 0.5 tries per agent (busiest: %v)",
			res.Statements, tries, res.TopStatement)
	}
	if res.FleetCPU <= 0 || res.LookupIdle.P99 == 0 || res.LookupFleet.P99 == 0 || res.LookupServerFleet.Mean == 0 {
		t.Errorf("nothing measured: server CPU %.3f cores, lookup p99 idle %s, with the fleet %s, in the executor %s",
			res.FleetCPU, res.LookupIdle.P99, res.LookupFleet.P99, res.LookupServerFleet.Mean)
	}
	// The executor's time is part of the lookup's: a mean above the client's median would
	// be another statement's.
	if res.LookupServerFleet.Mean > res.LookupFleet.P50 {
		t.Errorf("the lookup's mean in the executor, %s, is above its median latency, %s", res.LookupServerFleet.Mean, res.LookupFleet.P50)
	}
	// Ten lookup sessions at 20 a second for the 8 s measured: about 1,600 lookups. One
	// session would give 160.
	if res.Lookups < 1000 {
		t.Errorf("%d lookups measured with the fleet; want about 1,600 (ten sessions, 20 a second, 8 s)", res.Lookups)
	}
	// What a failed run adds to its diagnosis: PgBouncer's pools, the agents' among them.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if d := cfg.Diagnose(ctx); !strings.Contains(d, "SHOW POOLS: database") || !strings.Contains(d, "pgbouncer.log") {
		t.Errorf("PgBouncer's diagnosis lacks its pools or its log:\n%s", d)
	}
}

// runSmall runs the fleet benchmark with 20 agents on a server of its own, attached to
// nodes node agents (0: each on sessions of its own), in processes processes of agents
// (1: this one) at niceness nice (Config.FleetNice), and checks what holds on any run
// (checkSmall).
//
// A run whose victim stepped down before its crash (fleetbench.ErrVictimLost: its process
// could not prove its lock in time, which a machine busy with other work can cause, and
// the library's guarantee demands) measured no crash; it is logged and the fleet runs
// again on a fresh server, at most three times in all.
func runSmall(t *testing.T, nodes, processes, nice int) (fleetbench.Config, fleetbench.Result) {
	t.Helper()
	const attempts = 3
	for attempt := 1; ; attempt++ {
		cfg := startServer(t, 20)
		cfg.Nodes, cfg.Processes, cfg.FleetNice = nodes, processes, nice
		cfg.Idle, cfg.Warmup, cfg.Measure = 3*time.Second, 8*time.Second, 8*time.Second
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		res, err := fleetbench.Run(ctx, cfg)
		cancel()
		switch {
		case errors.Is(err, fleetbench.ErrVictimLost) && attempt < attempts:
			t.Logf("run %d of at most %d measured no crash, running the fleet again: %v", attempt, attempts, err)
			continue
		case err != nil:
			t.Fatal(err)
		}
		checkSmall(t, cfg, res)
		return cfg, res
	}
}

// checkSmall checks what holds of any small run: every agent holds its alive lock, the
// history gains rows only for changes of leadership, and the victim's crash is dead and
// taken over within seconds.
func checkSmall(t *testing.T, cfg fleetbench.Config, res fleetbench.Result) {
	t.Helper()
	t.Logf("%+v", res)
	checkBenchLine(t, res)
	if res.LocksHeld != cfg.Agents {
		t.Errorf("%d of %d agents hold their alive lock", res.LocksHeld, cfg.Agents)
	}
	// A fleet that nothing changes writes no history: a change of leadership writes two
	// rows (an end and an acquisition), a heartbeat or a renewal none.
	if res.HistoryRows != 2*res.LeaderChanges {
		t.Errorf("the history gained %d rows while measured, with %d changes of leadership; want 2 a change, none else", res.HistoryRows, res.LeaderChanges)
	}
	if res.CrashToDead > 5*time.Second || res.CrashToTakeover > 5*time.Second {
		t.Errorf("the victim was dead %s and taken over %s after its crash; want within seconds", res.CrashToDead, res.CrashToTakeover)
	}
}

// TestFleetBenchSmallWithNodeAgents is the small run with its agents attached to two
// node agents, each node in a process of its own, as make bench-fleet runs thousands:
// their locks are held and listened for on the node agents' two sessions, and the
// victim's crash (its connection to its node agent cut) is dead and taken over within
// seconds by an agent of another process. The processes run at niceness 1, which each
// sets on every thread of its own and checks, or fails (make bench-fleet's FLEET_NICE;
// 1, so that a busy machine does not starve them).
func TestFleetBenchSmallWithNodeAgents(t *testing.T) {
	t.Parallel()
	cfg, res := runSmall(t, 2, 2, 1)
	if res.LockSessions != cfg.Nodes {
		t.Errorf("%d liveness sessions for %d agents on %d nodes; want one per node", res.LockSessions, cfg.Agents, cfg.Nodes)
	}
}

// checkBenchLine: the line make record-fleet keeps reads back as the result it was
// written from, so that the docs' quotes of a fleet run stand on what it measured.
func checkBenchLine(t *testing.T, res fleetbench.Result) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fleet.txt")
	if err := os.WriteFile(path, []byte(res.BenchLine()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rec, err := docquote.ReadRecord(path)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("BenchmarkFleet/agents=%d/node-agents=%d", res.Agents, res.Nodes)
	for key, want := range map[string]docquote.Quantity{
		name + " cores":               {Value: res.LivenessCPU, Dim: ""},
		name + " locks-held":          {Value: float64(res.LocksHeld), Dim: ""},
		name + " ms-crash-to-dead":    {Value: float64(res.CrashToDead.Round(time.Microsecond)), Dim: "duration"},
		name + " ms-lookup-p99-fleet": {Value: float64(res.LookupFleet.P99.Round(time.Microsecond)), Dim: "duration"},
	} {
		got, err := docquote.Measure("fleet "+key, map[string]docquote.Record{"fleet": rec})
		if err != nil {
			t.Errorf("the fleet's bench line: %v\n%s", err, res.BenchLine())
			continue
		}
		if math.Abs(got.Value-want.Value) > 1e-4*math.Max(math.Abs(want.Value), 1) || got.Dim != want.Dim {
			t.Errorf("the fleet's bench line reads back %s as %v, want %v\n%s", key, got, want, res.BenchLine())
		}
	}
}
