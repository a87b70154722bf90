package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestOrderShards runs order-shards processes against a real PostgreSQL: three share 16
// shards, a fourth joins, one is killed with -9 and one stopped with SIGTERM. From the
// results written: no shard ever has a write of an older owner (a lower epoch) after a
// newer one's, and every shard is written again within seconds of each change.
func TestOrderShards(t *testing.T) {
	db := pgtest.NewDB(t)
	bin := filepath.Join(t.TempDir(), "order-shards")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	type proc struct {
		cmd  *exec.Cmd
		log  logbuf.Buffer
		done chan struct{}
	}
	start := func(name string) *proc {
		p := &proc{cmd: exec.Command(bin, "--name="+name, "--shards=16", "--write-every=50ms"), done: make(chan struct{})}
		p.cmd.Env = append(os.Environ(), "DATABASE_URL="+db.DSN)
		p.cmd.Stdout, p.cmd.Stderr = &p.log, &p.log
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { _ = p.cmd.Wait(); close(p.done) }()
		t.Cleanup(func() {
			_ = p.cmd.Process.Kill()
			<-p.done
			if t.Failed() {
				t.Logf("%s:\n%s", name, p.log.String())
			}
		})
		return p
	}
	conn := db.Conn(t)
	ctx := testutil.Context(t, 3*time.Minute)
	// writtenSince counts the shards written after t0 (by the database's clock).
	writtenSince := func(t0 time.Time) int {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(DISTINCT shard) FROM order_results WHERE written_at > $1`, t0).Scan(&n); err != nil {
			return 0
		}
		return n
	}
	allWritten := func(what string, t0 time.Time) {
		t.Helper()
		var took time.Duration
		if !testutil.Poll(20*time.Second, func() bool { took = time.Since(t0); return writtenSince(t0) == 16 }) {
			t.Fatalf("%s: %d of 16 shards written again within 20 s", what, writtenSince(t0))
		}
		t.Logf("%s: every shard written again within %s", what, took.Round(10*time.Millisecond))
	}
	now := func() time.Time {
		var at time.Time
		if err := conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}

	procs := []*proc{start("a"), start("b"), start("c")}
	testutil.Eventually(t, 60*time.Second, "the results table", func() bool {
		return conn.QueryRow(ctx, `SELECT 1 FROM order_results LIMIT 1`).Scan(new(int)) == nil
	})
	allWritten("three instances", now())
	procs = append(procs, start("d"))
	time.Sleep(3 * time.Second)
	allWritten("a fourth joined", now())
	t0 := now()
	_ = procs[0].cmd.Process.Signal(syscall.SIGKILL)
	<-procs[0].done
	allWritten("a killed with -9", t0)
	t0 = now()
	_ = procs[1].cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-procs[1].done:
	case <-time.After(40 * time.Second):
		t.Fatal("b did not stop within 40 s of SIGTERM")
	}
	allWritten("b stopped by SIGTERM", t0)

	// One owner at a time: by the time of its writes, no shard goes back to an older epoch.
	var shard string
	var older, newer int64
	err := conn.QueryRow(ctx, `
	    SELECT shard, prev, epoch FROM (
	        SELECT shard, epoch, lag(epoch) OVER (PARTITION BY shard ORDER BY written_at, id) AS prev FROM order_results) w
	     WHERE prev > epoch LIMIT 1`).Scan(&shard, &older, &newer)
	if err == nil {
		t.Fatalf("shard %s: a write under epoch %d after one under epoch %d: two owners at once", shard, newer, older)
	}
	var writes, owners int
	if err := conn.QueryRow(ctx, `SELECT count(*), count(DISTINCT (shard, epoch)) FROM order_results`).Scan(&writes, &owners); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d writes by %d ownerships of 16 shards", writes, owners)
}
