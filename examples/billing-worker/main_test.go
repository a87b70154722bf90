package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// worker is one running billing-worker process.
type worker struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited
	died time.Time     // when Wait returned: after the process's last side effect
	code int
	log  logbuf.Buffer // its stdout and stderr
}

// fleet runs billing-worker processes against one database, all recording to one file.
type fleet struct {
	t       *testing.T
	bin     string
	dsn     string
	runs    string
	next    int
	workers map[string]*worker
}

func (f *fleet) start() *worker {
	f.t.Helper()
	f.next++
	w := &worker{name: fmt.Sprintf("w%d", f.next), done: make(chan struct{})}
	w.cmd = exec.Command(f.bin, "--name="+w.name, "--runs="+f.runs, "--wind-down=1500ms",
		"--write-every=50ms", "--peers-every=1s")
	w.cmd.Env = append(os.Environ(), "DATABASE_URL="+f.dsn)
	w.cmd.Stdout, w.cmd.Stderr = &w.log, &w.log
	if err := w.cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	go func() {
		_ = w.cmd.Wait()
		w.died, w.code = time.Now(), w.cmd.ProcessState.ExitCode()
		close(w.done)
	}()
	f.workers[w.name] = w
	f.t.Cleanup(func() {
		_ = w.cmd.Process.Kill()
		<-w.done
		if f.t.Failed() {
			f.t.Logf("%s's log:\n%s", w.name, w.log.String())
		}
	})
	return w
}

// stop signals w and waits for it to exit.
func (f *fleet) stop(w *worker, sig syscall.Signal) {
	f.t.Helper()
	if err := w.cmd.Process.Signal(sig); err != nil {
		f.t.Fatal(err)
	}
	select {
	case <-w.done:
	case <-time.After(liveness.AgentConfig{}.ShutdownBudget() + 10*time.Second):
		f.t.Fatalf("%s did not exit after %s", w.name, sig)
	}
	if sig == syscall.SIGTERM && w.code != 0 {
		f.t.Fatalf("%s exited with %d after SIGTERM; want 0", w.name, w.code)
	}
}

// records reads the runs' file.
func (f *fleet) records() []record {
	f.t.Helper()
	b, err := os.ReadFile(f.runs)
	if err != nil && !os.IsNotExist(err) {
		f.t.Fatal(err)
	}
	var out []record
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var r record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			f.t.Fatalf("a record that does not parse: %q: %v", sc.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

// leaderAfter waits for a run that began after n begin records, and returns its record.
func (f *fleet) leaderAfter(n int, within time.Duration) record {
	f.t.Helper()
	var got record
	testutil.Eventually(f.t, within, fmt.Sprintf("invoice run #%d begins", n+1), func() bool {
		var begins []record
		for _, r := range f.records() {
			if r.Event == "begin" {
				begins = append(begins, r)
			}
		}
		if len(begins) > n {
			got = begins[n]
			return true
		}
		return false
	})
	return got
}

// invoiceRunSpan is one invoice run, from its own records: from its begin to its end, or, for a
// run whose process was killed, to the process's death.
type invoiceRunSpan struct {
	instance   string
	epoch      int64
	begin, end time.Time
	ended      bool // by its own end record
}

// TestBillingWorkerRunsNeverOverlap runs three billing-worker processes against a real
// PostgreSQL and stops the one that runs invoices, with SIGTERM and with kill -9, twice
// each, starting a replacement each time. Each invoice run needs 1.5 s to wind down.
// From the runs' own begin and end records (written outside the database, like the
// mails a run would send), no two runs may overlap; from the ledger, every write
// accepted by the fence belongs to the run that held the lease then, in epoch order.
func TestBillingWorkerRunsNeverOverlap(t *testing.T) {
	db := pgtest.NewDB(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "billing-worker")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", "build", "-race", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	f := &fleet{t: t, bin: bin, dsn: db.DSN, runs: filepath.Join(dir, "runs.jsonl"), workers: map[string]*worker{}}
	for range 3 {
		f.start()
	}

	const takeover = 15 * time.Second // a generous bound; a kill is seen in about 1–2 s
	leader := f.leaderAfter(0, 60*time.Second)
	var killed []string
	for i, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL, syscall.SIGTERM, syscall.SIGKILL} {
		w := f.workers[leader.Instance]
		f.stop(w, sig)
		if sig == syscall.SIGKILL {
			killed = append(killed, w.name)
		}
		f.start() // the replacement
		next := f.leaderAfter(i+1, takeover+5*time.Second)
		if next.Instance == leader.Instance || next.Epoch <= leader.Epoch {
			t.Fatalf("after %s of %s: run by %s at epoch %d; want another instance, epoch above %d",
				sig, leader.Instance, next.Instance, next.Epoch, leader.Epoch)
		}
		leader = next
	}
	for _, w := range f.workers {
		select {
		case <-w.done:
		default:
			f.stop(w, syscall.SIGTERM)
		}
	}

	// The runs, from their own records.
	runs := map[int64]*invoiceRunSpan{}
	var rejected int
	for _, r := range f.records() {
		switch r.Event {
		case "begin":
			if runs[r.Epoch] != nil {
				t.Fatalf("two runs began under epoch %d", r.Epoch)
			}
			runs[r.Epoch] = &invoiceRunSpan{instance: r.Instance, epoch: r.Epoch, begin: time.Unix(0, r.At)}
		case "end":
			if ru := runs[r.Epoch]; ru == nil || ru.instance != r.Instance {
				t.Fatalf("%s ended a run under epoch %d that it never began", r.Instance, r.Epoch)
			}
			runs[r.Epoch].end, runs[r.Epoch].ended = time.Unix(0, r.At), true
		case "rejected":
			rejected++
		}
	}
	var ordered []*invoiceRunSpan
	for _, ru := range runs {
		if !ru.ended {
			if !slices.Contains(killed, ru.instance) {
				t.Fatalf("%s's run under epoch %d never ended, and its process was not killed", ru.instance, ru.epoch)
			}
			ru.end = f.workers[ru.instance].died
		}
		ordered = append(ordered, ru)
	}
	slices.SortFunc(ordered, func(a, b *invoiceRunSpan) int { return a.begin.Compare(b.begin) })
	if len(ordered) < 5 {
		t.Fatalf("%d runs; want at least 5 (one per leader)", len(ordered))
	}
	var timeline strings.Builder
	for _, ru := range ordered {
		fmt.Fprintf(&timeline, "\n  epoch %d on %s: %s … %s (ended by itself: %v)", ru.epoch, ru.instance,
			ru.begin.Format("15:04:05.000"), ru.end.Format("15:04:05.000"), ru.ended)
	}
	for i := 1; i < len(ordered); i++ {
		prev, cur := ordered[i-1], ordered[i]
		if !prev.end.Before(cur.begin) {
			t.Fatalf("two invoice runs at once: epoch %d on %s until %s, epoch %d on %s from %s%s",
				prev.epoch, prev.instance, prev.end.Format("15:04:05.000"), cur.epoch, cur.instance,
				cur.begin.Format("15:04:05.000"), timeline.String())
		}
		if cur.epoch <= prev.epoch {
			t.Fatalf("epoch %d began after epoch %d%s", cur.epoch, prev.epoch, timeline.String())
		}
	}
	t.Logf("runs (%d writes refused by the fence):%s", rejected, timeline.String())

	// The ledger: in commit order (a takeover waits for a fenced transaction, so ids
	// follow commits across epochs) every row's epoch is one a run held, written by that
	// run's instance, and epochs never go back.
	pool := db.Pool(t, 1)
	rows, err := pool.Query(ctx, `SELECT epoch, instance FROM billing_ledger ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var last int64
	writes := map[int64]int{}
	for rows.Next() {
		var epoch int64
		var instance string
		if err := rows.Scan(&epoch, &instance); err != nil {
			t.Fatal(err)
		}
		ru := runs[epoch]
		switch {
		case ru == nil || ru.instance != instance:
			t.Fatalf("a ledger write by %s under epoch %d, which no run of %s held", instance, epoch, instance)
		case epoch < last:
			t.Fatalf("a ledger write under epoch %d after one under epoch %d: a stale write was accepted", epoch, last)
		}
		last = epoch
		writes[epoch]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, ru := range ordered {
		if writes[ru.epoch] == 0 {
			t.Errorf("the run under epoch %d (%s) wrote nothing to the ledger", ru.epoch, ru.instance)
		}
	}
}
