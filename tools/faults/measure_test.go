package faults

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// The bounds the product promises. A scenario that misses one fails with the measured
// numbers; the report shows them either way.
const (
	// A crashed lock holder is dead for every consumer (is_instance_alive and the
	// exporter) within crashDeadMedian, median over the trials, and crashDeadWorst at worst.
	crashDeadMedian = 2 * time.Second
	crashDeadWorst  = 3 * time.Second
	// A crashed leader's lease (a job's, the reaper's) is held by another process within
	// takeoverMedian (median) and takeoverBound (worst), at the default settings: the
	// watcher stamps the vanished lock within a tick, the lock grace (1 s) passes, and the
	// notification wakes the follower.
	takeoverMedian = 2 * time.Second
	takeoverBound  = 5 * time.Second
	// A half-open client stops trusting its lock and leases within about 30 s (keepalive
	// and TCP user timeout).
	halfOpenBound = 40 * time.Second
	// The server frees a half-open client's alive lock after keepalive's 25–30 s while it
	// sends the session nothing, but the user timeout (30 s) counts from the first data
	// it cannot deliver once it sends some, and the lock's session listens: the heir's
	// taken:<lease> at the lease's expiry (jobLeaseTTL) is such data. So the lock is
	// freed about jobLeaseTTL + 30 s after the cut; 5 s of margin.
	halfOpenLockFreedBound = jobLeaseTTL + 35*time.Second
	// A live agent holds its alive lock again soon after its session ends (docs/operations.md,
	// Detection and failover times): the session reconnects with backoff and jitter, at
	// most 250 ms after a session that held the lock, doubling up to 10 s while the
	// server stays away. So a terminated session's lock is back within reclaimMedian
	// (median) and reclaimWorst (worst): the first retry, the connection, the claim and a
	// sample, on a loaded machine. After a restart or a failover it is back within
	// relockBound of the server answering: the backoff's ceiling and a second on top.
	reclaimMedian = time.Second
	reclaimWorst  = 2 * time.Second
	relockBound   = 11 * time.Second
	// falseDeadWatch is how long a scenario goes on watching for a false-dead verdict
	// once the agents have recovered: longer than a proof-of-life grace.
	falseDeadWatch = 5 * time.Second
)

// scenario collects one scenario's measurements and records them for the report when
// the test ends, whether it passed or not.
type scenario struct {
	t *testing.T
	s Scenario
	q map[string]*Quantity
}

func newScenario(t *testing.T, number int, title, settings string) *scenario {
	sc := &scenario{t: t, q: map[string]*Quantity{}, s: Scenario{
		Number: number, Name: t.Name(), Title: title, Settings: settings,
		FalseDead: -1, DoubleHolders: -1, StaleEpochWrites: -1,
	}}
	t.Cleanup(func() {
		for i := range sc.s.Quantities {
			q := &sc.s.Quantities[i]
			*q = *sc.q[q.Name]
		}
		record(sc.s)
	})
	return sc
}

// observe adds one trial's measurement of name; ok false is a miss.
func (sc *scenario) observe(name string, window, d time.Duration, ok bool) {
	q := sc.q[name]
	if q == nil {
		sc.s.Quantities = append(sc.s.Quantities, Quantity{Name: name})
		q = &Quantity{Name: name, Window: window}
		sc.q[name] = q
	}
	if ok {
		q.Values = append(q.Values, d)
		sc.t.Logf("%s: %d ms", name, d.Milliseconds())
	} else {
		q.Missed++
		sc.t.Logf("%s: not seen within %s", name, window)
	}
}

// bound checks name's median and worst against the bounds (0: not checked) and fails
// the test with the measured numbers when they are missed.
func (sc *scenario) bound(name string, median, worst time.Duration) {
	sc.check(name, median, worst, true)
}

func (sc *scenario) check(name string, median, worst time.Duration, enforce bool) {
	q := sc.q[name]
	if q == nil {
		sc.t.Errorf("%s: never measured", name)
		return
	}
	var text string
	switch {
	case median > 0 && worst > 0:
		text = fmt.Sprintf("median < %s, worst < %s", median, worst)
	case worst > 0:
		text = fmt.Sprintf("every trial < %s", worst)
	default:
		text = fmt.Sprintf("median < %s", median)
	}
	q.Bound = text
	med, medOK := q.Median()
	w, wOK := q.Worst()
	q.Met = (median == 0 || (medOK && med < median)) && (worst == 0 || (wOK && w < worst))
	if q.Met {
		return
	}
	report := sc.t.Errorf
	if !enforce {
		report = sc.t.Logf
	}
	// A run that writes no report (make test's, one trial beside the suite's other jobs)
	// holds the times to the bound with a loaded machine's allowance: the documented
	// bounds are make faults', measured on a quiet machine. What it counts (false-dead
	// verdicts, two holders, stale writes) has no allowance.
	if *reportFlag == "" {
		a := time.Duration(loadAllowance)
		if (median == 0 || (medOK && med < a*median)) && (worst == 0 || (wOK && w < a*worst)) {
			sc.t.Logf("%s: want %s (make faults); measured median %s, worst %s, within this run's allowance (%dx) for a loaded machine",
				name, text, show(med, medOK), show(w, wOK), loadAllowance)
			return
		}
		text += fmt.Sprintf(", or %dx that beside make test's other jobs", loadAllowance)
	}
	report("%s: want %s; measured median %s, worst %s over %d trials (%d missed within %s)",
		name, text, show(med, medOK), show(w, wOK), len(q.Values)+q.Missed, q.Missed, q.Window)
}

// loadAllowance is the factor on a time bound in a run that writes no report: 2, or
// FAULTS_LOAD_ALLOWANCE (make test-stress runs the suite beside two busy processes that
// take both cores, and sets 3).
var loadAllowance = func() int {
	if n, err := strconv.Atoi(os.Getenv("FAULTS_LOAD_ALLOWANCE")); err == nil && n >= 2 {
		return n
	}
	return 2
}()

func show(d time.Duration, ok bool) string {
	if !ok {
		return "missed"
	}
	return fmt.Sprintf("%d ms", d.Milliseconds())
}

// observeDead records when the victim was dead for every consumer: the later of when
// is_instance_alive and the exporter called it dead.
func (sc *scenario) observeDead(name string, window time.Duration, sql, exp moment) {
	sc.observe(name, window, max(sql.d, exp.d), sql.ok && exp.ok)
}

// observeRelock waits within window for a sample after up in which every instance of a
// holds its lock, and records the time as what "from the stop" (from the fault at stop)
// and what "from" upName (from up, when the server answered again).
func (sc *scenario) observeRelock(s *verdictLog, a *agent, what, upName string, window time.Duration, stop, up time.Time) {
	allLocked := func(smp sqlSample) bool {
		for _, id := range a.ids {
			if !smp.Inst[id].Locked {
				return false
			}
		}
		return true
	}
	var relock time.Duration
	ok := testutil.Poll(window, func() bool { var ok bool; relock, ok = s.firstSQL(up, allLocked); return ok })
	sc.observe(what+", from the stop", window, relock+up.Sub(stop), ok)
	sc.observe(what+", from "+upName, window, relock, ok)
}

// watchFalseDead watches the live agents for d, failing at once when a sample since from
// calls one of them dead; the false-dead verdicts from from to the end of the watch go to
// the report either way.
func (sc *scenario) watchFalseDead(s *verdictLog, from time.Time, d time.Duration, live ...*agent) {
	sc.t.Helper()
	testutil.Never(sc.t, d, "a live instance called dead", func() bool { n, _ := s.falseDead(from, time.Now(), live); return n > 0 })
	sc.addFalseDead(s.falseDead(from, time.Now(), live))
}

// addFalseDead counts false-dead verdicts; any is a failure.
func (sc *scenario) addFalseDead(n int, first string) {
	sc.s.FalseDead = max(sc.s.FalseDead, 0) + n
	if n > 0 {
		sc.t.Errorf("%d false-dead verdicts; first: %s", n, first)
	}
}

func (sc *scenario) note(format string, args ...any) {
	sc.s.Notes = append(sc.s.Notes, fmt.Sprintf(format, args...))
}

// fence reads the fencing log of lease and counts writes accepted under an epoch older
// than one already written (stale-epoch writes) and pairs of holders whose accepted
// writes interleave (double holders). Any is a failure.
func (sc *scenario) fence(dsn, lease string) {
	sc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		sc.t.Errorf("fencing log: %v", err)
		return
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT epoch, writer FROM public.fence_log WHERE lease = $1 ORDER BY id`, lease)
	if err != nil {
		sc.t.Errorf("fencing log: %v", err)
		return
	}
	type write struct {
		Epoch  int64
		Writer string
	}
	ws, err := pgx.CollectRows(rows, pgx.RowToStructByPos[write])
	if err != nil {
		sc.t.Errorf("fencing log: %v", err)
		return
	}
	stale, double := 0, 0
	writerOf := map[int64]string{}
	pairs := map[[2]int64]bool{}
	var newest int64
	for _, w := range ws {
		if prev, ok := writerOf[w.Epoch]; ok && prev != w.Writer {
			double++ // two writers under one epoch
		}
		writerOf[w.Epoch] = w.Writer
		if w.Epoch < newest {
			stale++
			if p := [2]int64{w.Epoch, newest}; !pairs[p] {
				pairs[p] = true
				double++
			}
		}
		newest = max(newest, w.Epoch)
	}
	sc.s.StaleEpochWrites = max(sc.s.StaleEpochWrites, 0) + stale
	sc.s.DoubleHolders = max(sc.s.DoubleHolders, 0) + double
	if len(ws) == 0 {
		sc.t.Errorf("fencing log of %s is empty: no holder ever wrote", lease)
	}
	if stale > 0 || double > 0 {
		sc.t.Errorf("lease %s: %d stale-epoch writes, %d double holders in %d fenced writes", lease, stale, double, len(ws))
	}
}
