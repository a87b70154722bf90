//go:build benchfleet

package fleetbench_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/tools/fleetbench"
)

// TestBenchFleet is make bench-fleet: the fleet at each size of FLEET_SIZES (100 and
// 1,000 by default; FLEET_NODES the node agents of each), each on a fresh server and
// PgBouncer, after a 40 s warm-up, 60 s measured (FLEET_WARMUP, FLEET_MEASURE), with a
// 20 s idle baseline of the lookup (ten sessions at 20 a second; FLEET_LOOKUP_SESSIONS).
// It prints a markdown table and, with FLEET_PLOT set, writes an SVG of the server's CPU
// per agent against the fleet's size to that file.
func TestBenchFleet(t *testing.T) {
	sizes := []int{100, 1000}
	if s := os.Getenv("FLEET_SIZES"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				t.Fatalf("FLEET_SIZES: %q is not a positive number", f)
			}
			sizes = append(sizes, n)
		}
	}
	// FLEET_NODES: the node agents of each run, in FLEET_SIZES' order (0: every agent on
	// a session of its own); none by default.
	nodes := make([]int, len(sizes))
	if s := os.Getenv("FLEET_NODES"); s != "" {
		fields := strings.Split(s, ",")
		if len(fields) != len(sizes) {
			t.Fatalf("FLEET_NODES has %d entries for %d FLEET_SIZES", len(fields), len(sizes))
		}
		for i, f := range fields {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 0 {
				t.Fatalf("FLEET_NODES: %q is not a number of node agents", f)
			}
			nodes[i] = n
		}
	}
	// Each agent's pool connections to PgBouncer are open files of PgBouncer's, one
	// process, within the open-files limit (the hard one: PgBouncer raises its soft limit
	// to it, as Go does). They, and an agent's connection to its node agent (both ends in
	// the process of agents), are open files of its process too: above 1,000 agents they
	// run in processes of their own (FLEET_PROCESSES: how many; one per 1,000 agents by
	// default), so that the pools are what the limit bounds.
	var files syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &files); err != nil {
		t.Fatal(err)
	}
	warmup, measure := envDuration(t, "FLEET_WARMUP", 40*time.Second), envDuration(t, "FLEET_MEASURE", 60*time.Second)
	var results []fleetbench.Result
	for i, n := range sizes {
		t.Run(fmt.Sprintf("%d-agents-%d-nodes", n, nodes[i]), func(t *testing.T) {
			cfg := startServer(t, n)
			cfg.Nodes = nodes[i]
			cfg.Processes = envInt(t, "FLEET_PROCESSES", (n+999)/1000, 1, n, "a number of processes of agents")
			// Thousands of agents: their pools get what the open-files limit leaves them
			// (each agent attached to a node agent takes two files of its process for
			// that), at most 4.
			perAgent := (int(files.Cur) - 2000) / n
			if cfg.Nodes > 0 && cfg.Processes == 1 {
				perAgent -= 2
			}
			if perAgent < 1 {
				t.Fatalf("%d agents need more open files than the limit, %d (ulimit -n)", n, files.Cur)
			}
			// FLEET_POOL: a smaller pool, to compare at a size the limit allows.
			cfg.PoolMaxConns = int32(envInt(t, "FLEET_POOL", min(4, perAgent), 1, perAgent,
				"a pool size within what the open-files limit leaves"))
			t.Logf("each agent's pool: at most %d connections; the agents in %d processes", cfg.PoolMaxConns, cfg.Processes)
			cfg.Idle, cfg.Warmup, cfg.Measure = 20*time.Second, warmup, measure
			cfg.FleetNice = envInt(t, "FLEET_NICE", 0, 0, 19, "a niceness for the fleet's processes")
			// FLEET_LOOKUP_SESSIONS=1: the lookup on one session, as before 2026-12-04's last
			// runs; unset, Run's default.
			cfg.LookupSessions = envInt(t, "FLEET_LOOKUP_SESSIONS", 0, 1, 100, "a number of lookup sessions")
			cfg.VictimLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			if path := os.Getenv("FLEET_LOG"); path != "" { // every agent's warnings
				f, err := os.Create(path)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				cfg.Logger = slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelWarn}))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
			defer cancel()
			res, err := fleetbench.Run(ctx, cfg)
			if err != nil {
				t.Fatalf("%v\nmeasured so far: %+v", err, res)
			}
			results = append(results, res)
			t.Logf("%+v", res)
			fmt.Println(res.BenchLine())
		})
	}
	fmt.Println(table(results))
	if path := os.Getenv("FLEET_PLOT"); path != "" {
		if err := os.WriteFile(path, []byte(plot(results)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// envInt is the number in the environment variable name, def when it is unset; a value
// outside [lo, hi] fails the test.
func envInt(t *testing.T, name string, def, lo, hi int, what string) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		t.Fatalf("%s: %q is not %s from %d to %d", name, s, what, lo, hi)
	}
	return n
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return d
}

// ms is d in milliseconds with decimals digits after the point.
func ms(d time.Duration, decimals int) string {
	return fmt.Sprintf("%.*f ms", decimals, float64(d)/float64(time.Millisecond))
}

// table is the results as docs/performance.md shows them.
func table(rs []fleetbench.Result) string {
	var b strings.Builder
	b.WriteString("| agents | node agents | pool (conns) | alive locks held | server CPU, liveness (cores) | per agent (millicores) | statements/s | per agent | backends | liveness sessions (listening) | lookups idle / fleet | lookup p50 idle → fleet | lookup p99 idle → fleet | lookup in the executor, mean / slowest, with the fleet | crash → dead | crash → takeover | leader changes |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		nodes := "none"
		if r.Nodes > 0 {
			nodes = strconv.Itoa(r.Nodes)
		}
		fmt.Fprintf(&b, "| %d | %s | %d | %d of %d | %.3f | %.3f | %.0f | %.2f | %d | %d | %d / %d | %s → %s | %s → %s | %s / %s | %.2f s | %.2f s | %d |\n",
			r.Agents, nodes, r.PoolMaxConns, r.LocksHeld, r.Agents, r.LivenessCPU, 1000*r.LivenessCPU/float64(r.Agents), r.Statements,
			r.Statements/float64(r.Agents), r.Backends, r.LockSessions, r.IdleLookups, r.Lookups,
			ms(r.LookupIdle.P50, 2), ms(r.LookupFleet.P50, 2), ms(r.LookupIdle.P99, 2), ms(r.LookupFleet.P99, 2),
			ms(r.LookupServerFleet.Mean, 3), ms(r.LookupServerFleet.Max, 3),
			r.CrashToDead.Seconds(), r.CrashToTakeover.Seconds(), r.LeaderChanges)
	}
	for _, r := range rs {
		fmt.Fprintf(&b, "\nbusiest statements at %d agents: %s", r.Agents, strings.Join(r.TopStatement, ", "))
	}
	for _, r := range rs {
		fmt.Fprintf(&b, "\nhistory rows written while measured at %d agents: %d", r.Agents, r.HistoryRows)
	}
	return b.String()
}

// plot draws the server's liveness CPU per agent against the number of agents (a log
// scale), as a small SVG.
func plot(rs []fleetbench.Result) string {
	const w, h, pad = 480.0, 260.0, 50.0
	maxY := 0.0
	for _, r := range rs {
		maxY = max(maxY, 1000*r.LivenessCPU/float64(r.Agents))
	}
	maxY = max(maxY*1.2, 0.01)
	minN, maxN := 1e18, 0.0
	for _, r := range rs {
		minN, maxN = min(minN, float64(r.Agents)), max(maxN, float64(r.Agents))
	}
	x := func(n int) float64 {
		if maxN == minN {
			return w / 2
		}
		return pad + (w-2*pad)*(log10(float64(n))-log10(minN))/(log10(maxN)-log10(minN))
	}
	y := func(v float64) float64 { return h - pad - (h-2*pad)*v/maxY }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`, w, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="black"/>`, pad, h-pad, w-pad, h-pad)
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="black"/>`, pad, pad, pad, h-pad)
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">agents (log scale)</text>`, w/2, h-10)
	fmt.Fprintf(&b, `<text x="12" y="%.0f" transform="rotate(-90 12 %.0f)" text-anchor="middle">server CPU per agent (millicores)</text>`, h/2, h/2)
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="end">%.3f</text>`, pad-4, pad+4, maxY)
	// Two series: agents on sessions of their own, and agents attached to node agents.
	for si, series := range []struct {
		name  string
		color string
		nodes bool
	}{{"a session per agent", "steelblue", false}, {"node agents", "darkorange", true}} {
		var pts []string
		for _, r := range rs {
			if (r.Nodes > 0) != series.nodes {
				continue
			}
			v := 1000 * r.LivenessCPU / float64(r.Agents)
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(r.Agents), y(v)))
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s"/><text x="%.1f" y="%.1f" text-anchor="middle">%.3f</text>`,
				x(r.Agents), y(v), series.color, x(r.Agents), y(v)-10, v)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%d</text>`, x(r.Agents), h-pad+16, r.Agents)
		}
		if len(pts) == 0 {
			continue
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s"/>`, strings.Join(pts, " "), series.color)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" fill="%s">%s</text>`, w-pad-140, pad+16*float64(si), series.color, series.name)
	}
	b.WriteString(`</svg>`)
	return b.String()
}

func log10(v float64) float64 { return math.Log10(v) }
