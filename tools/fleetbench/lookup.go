package fleetbench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/tools/internal/wait"
)

// The application's lookup runs in a process of its own, as an application's query
// would: in the process of a thousand agents, its latency would include that process's
// goroutine scheduling and garbage collection, which the database does not cause. The
// process is the benchmark's own binary started again with these variables set; its
// TestMain calls Serve first.
//
// The lookup process opens its sessions, answers "ready", then runs the lookup on each
// session at the given rate (the sessions' turns spread evenly over the period) and
// answers each line it reads on stdin: "reset" forgets the latencies so far,
// "report" writes them as one JSON line. It exits when stdin closes (its parent ended).
const (
	lookupDSNEnv      = "PG_LIVENESS_FLEETBENCH_LOOKUP_DSN"
	lookupRateEnv     = "PG_LIVENESS_FLEETBENCH_LOOKUP_RATE"
	lookupSessionsEnv = "PG_LIVENESS_FLEETBENCH_LOOKUP_SESSIONS"
)

// lookupQuery is the application's primary-key lookup, on the table prepare fills.
const lookupQuery = `SELECT payload FROM app_items WHERE id = $1`

// lookupReport is what the lookup process reports: how many lookups answered since the
// last reset, and their latencies in nanoseconds, sorted.
type lookupReport struct {
	Took []time.Duration `json:"took_ns"`
}

func serveLookup(dsn, rateText, sessionsText string, in io.Reader, out io.Writer) error {
	rate, err := strconv.Atoi(rateText)
	if err != nil || rate < 1 {
		return fmt.Errorf("%s: want a positive number of lookups a second, got %q", lookupRateEnv, rateText)
	}
	sessions, err := strconv.Atoi(sessionsText)
	if err != nil || sessions < 1 {
		return fmt.Errorf("%s: want a positive number of sessions, got %q", lookupSessionsEnv, sessionsText)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conns := make([]*pgx.Conn, 0, sessions)
	defer func() {
		for _, c := range conns {
			c.Close(context.Background())
		}
	}()
	for range sessions {
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
		conn, err := pgx.Connect(cctx, dsn)
		ccancel()
		if err != nil {
			return fmt.Errorf("lookup connection: %w", err)
		}
		conns = append(conns, conn)
	}

	var (
		mu      sync.Mutex
		took    []time.Duration
		running sync.WaitGroup
	)
	// Each session looks up every period, its turn offset by its share of the period:
	// lookups that all fired at once would queue behind each other on the server's cores
	// and measure that.
	period := time.Second / time.Duration(rate)
	for i, conn := range conns {
		running.Go(func() {
			if !wait.Sleep(ctx, period*time.Duration(i)/time.Duration(sessions)) {
				return
			}
			tick := time.NewTicker(period)
			defer tick.Stop()
			for n := i * 100000 / sessions; ; n++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
				t := time.Now()
				var payload string
				err := conn.QueryRow(qctx, lookupQuery, 1+n*7919%100000).Scan(&payload)
				d := time.Since(t)
				qcancel()
				if err != nil {
					continue
				}
				mu.Lock()
				took = append(took, d)
				mu.Unlock()
			}
		})
	}
	defer func() { cancel(); running.Wait() }()

	if _, err := fmt.Fprintln(out, "ready"); err != nil {
		return err
	}
	lines := bufio.NewScanner(in)
	for lines.Scan() {
		switch lines.Text() {
		case "reset":
			mu.Lock()
			took = nil
			mu.Unlock()
		case "report":
			mu.Lock()
			r := lookupReport{Took: slices.Clone(took)}
			mu.Unlock()
			slices.Sort(r.Took)
			b, err := json.Marshal(r)
			if err != nil {
				return err
			}
			if _, err := fmt.Fprintf(out, "%s\n", b); err != nil {
				return err
			}
		default:
			return fmt.Errorf("unknown command %q", lines.Text())
		}
	}
	return lines.Err()
}

// lookups is the parent's end of the lookup process.
type lookups struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	answer *bufio.Scanner
	last   lookupReport
}

// startLookups starts the lookup process, rate lookups a second on each of its sessions
// to dsn, and returns once they are connected.
func startLookups(ctx context.Context, dsn string, rate, sessions int) (*lookups, error) {
	cmd, stdin, stdout, err := startHelper(lookupDSNEnv+"="+dsn, lookupRateEnv+"="+strconv.Itoa(rate),
		lookupSessionsEnv+"="+strconv.Itoa(sessions))
	if err != nil {
		return nil, fmt.Errorf("fleetbench: the lookup process: %w", err)
	}
	l := &lookups{cmd: cmd, stdin: stdin, answer: bufio.NewScanner(stdout)}
	l.answer.Buffer(make([]byte, 64<<10), 64<<20)
	ready := make(chan error, 1)
	go func() {
		if !l.answer.Scan() {
			ready <- errors.New("it ended before it was ready (does the test binary's TestMain call fleetbench.Serve?)")
			return
		}
		if line := l.answer.Text(); line != "ready" {
			ready <- errors.New(line)
			return
		}
		ready <- nil
	}()
	select {
	case err = <-ready:
	case <-ctx.Done():
		err = ctx.Err()
	case <-time.After(40 * time.Second):
		err = errors.New("not ready within 40 s")
	}
	if err != nil {
		l.stop()
		return nil, fmt.Errorf("fleetbench: the lookup process: %w", err)
	}
	return l, nil
}

// reset forgets the latencies measured so far.
func (l *lookups) reset() { _, _ = io.WriteString(l.stdin, "reset\n") }

// measure asks the lookup process for its latencies since the last reset; count and
// latency then read them.
func (l *lookups) measure() error {
	if _, err := io.WriteString(l.stdin, "report\n"); err != nil {
		return fmt.Errorf("fleetbench: the lookup process: %w", err)
	}
	if !l.answer.Scan() {
		return fmt.Errorf("fleetbench: the lookup process ended: %v", l.answer.Err())
	}
	line := l.answer.Text()
	if rest, ok := strings.CutPrefix(line, "error: "); ok {
		return fmt.Errorf("fleetbench: the lookup process: %s", rest)
	}
	var r lookupReport
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		return fmt.Errorf("fleetbench: the lookup process's report: %w", err)
	}
	l.last = r
	return nil
}

func (l *lookups) count() int64 { return int64(len(l.last.Took)) }

func (l *lookups) latency() Latency {
	took := l.last.Took
	if len(took) == 0 {
		return Latency{}
	}
	at := func(q float64) time.Duration { return took[min(len(took)-1, int(q*float64(len(took))))] }
	return Latency{P50: at(0.50), P99: at(0.99)}
}

// stop ends the lookup process: closing its stdin ends it.
func (l *lookups) stop() {
	_ = l.stdin.Close()
	done := make(chan struct{})
	go func() { _ = l.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = l.cmd.Process.Kill()
		<-done
	}
}

// lookupStatsWhere picks the lookup's entries in pg_stat_statements.
const lookupStatsWhere = `query LIKE '%FROM app_items WHERE id = $1%' AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`

// resetLookupStats forgets the lookup's server-side times so far.
func resetLookupStats(ctx context.Context, admin *pgx.Conn) error {
	_, err := admin.Exec(ctx, `SELECT pg_stat_statements_reset(userid, dbid, queryid) FROM pg_stat_statements WHERE `+lookupStatsWhere)
	if err != nil {
		return fmt.Errorf("fleetbench: reset the lookup's statistics: %w", err)
	}
	return nil
}

// lookupStats is the lookup's time in the executor since resetLookupStats.
func lookupStats(ctx context.Context, admin *pgx.Conn) (ServerTime, error) {
	var mean, slowest float64 // milliseconds
	err := admin.QueryRow(ctx, `SELECT coalesce(sum(total_exec_time) / nullif(sum(calls), 0), 0), coalesce(max(max_exec_time), 0)
	    FROM pg_stat_statements WHERE `+lookupStatsWhere).Scan(&mean, &slowest)
	if err != nil {
		return ServerTime{}, fmt.Errorf("fleetbench: the lookup's statistics: %w", err)
	}
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	return ServerTime{Mean: ms(mean), Max: ms(slowest)}, nil
}
