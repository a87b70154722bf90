package faults

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// shardCount is TestShards' set: 64 shards over four processes.
const shardCount = 64

// shardsWrittenSince counts the shards of set written to the fencing log after t0, by
// the database's clock.
func shardsWrittenSince(t *testing.T, e *env, set string, t0 time.Time) int {
	t.Helper()
	return e.db.QueryInt(t, `SELECT count(DISTINCT lease) FROM public.fence_log WHERE lease LIKE $1 || '/%' AND at > $2`, set, t0)
}

// dbNow is the database's clock.
func dbNow(t *testing.T, e *env) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn := connect(t, ctx, e.dsn)
	defer conn.Close(context.Background())
	var now time.Time
	if err := conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// TestShards runs four processes that share 64 shards (Agent.Shards), each owner writing
// every 100 ms fenced by its shard's lease, through a kill -9, a SIGTERM, a join, a
// SIGSTOP of 20 s and a PostgreSQL restart. From the rows written: every shard is written
// again within the bound after each, a hung owner's shards move within its leases' ttl,
// and no shard ever has two writers at overlapping times (no write under an epoch older
// than one already written: each shard's fencing log is checked as a lease's is).
func TestShards(t *testing.T) {
	t.Parallel()
	sc := newScenario(t, 1, "Shards: 64 over four processes, through kill -9, SIGTERM, a join, SIGSTOP 20 s and a restart",
		"default agent flags and shard settings (ttl 15 s); each owner writes every 100 ms, fenced by its shard's lease")
	e := newEnv(t)
	for trial := range trials() {
		set := fmt.Sprintf("orders-%d", trial)
		next := 0
		start := func() *agent {
			next++
			return startAgent(t, e, agentOpts{service: fmt.Sprintf("%s-%d", set, next),
				extra: []string{"--shards.set=" + set, fmt.Sprintf("--shards.count=%d", shardCount), "--lease.write-every=100ms"}})
		}
		procs := []*agent{start(), start(), start(), start()}
		// moved waits until every shard is written after t0, and records how long that took.
		moved := func(name string, t0 time.Time, t0Local time.Time, window time.Duration) {
			var took time.Duration
			ok := testutil.Poll(window, func() bool {
				took = time.Since(t0Local)
				return shardsWrittenSince(t, e, set, t0) == shardCount
			})
			if !ok {
				t.Logf("%s: %d of %d shards written again within %s", name, shardsWrittenSince(t, e, set, t0), shardCount, window)
			}
			sc.observe(name, window, took, ok)
		}
		moved("every shard written", dbNow(t, e), time.Now(), time.Minute)

		t0, l0 := dbNow(t, e), time.Now()
		procs[0].Kill()
		moved("kill -9 of an owner: every shard written again", t0, l0, time.Minute)
		var firstOwned, lastOwned time.Duration
		for _, p := range procs[1:] {
			for _, ev := range p.Events("shard_owned", l0) {
				d := ev.At.Sub(l0)
				if firstOwned == 0 || d < firstOwned {
					firstOwned = d
				}
				lastOwned = max(lastOwned, d)
			}
		}
		t.Logf("after the kill, the victim's shards were owned again from %s to %s", firstOwned, lastOwned)

		t0, l0 = dbNow(t, e), time.Now()
		procs[1].Stop() // SIGTERM: its shards go once their callbacks returned
		moved("SIGTERM of an owner: every shard written again", t0, l0, time.Minute)
		termAt, termTook := t0, time.Since(l0)

		// A join is timed from the new process's start (before its exec) to its last shard
		// owned: its share is what it owns once a second passes with no shard more.
		l0 = time.Now()
		procs = append(procs, start())
		joiner := procs[4]
		var share int
		var last time.Time
		joined := testutil.Poll(time.Minute, func() bool {
			evs := joiner.Events("shard_owned", l0)
			if len(evs) > 0 && len(evs) == share && time.Since(last) > time.Second {
				return true
			}
			if len(evs) > 0 {
				share, last = len(evs), evs[len(evs)-1].At
			}
			return false
		})
		if !joined {
			t.Logf("the joiner owned %d shards within a minute of its start", share)
		}
		sc.observe("a join: the new process owns its share, from its start", time.Minute, last.Sub(l0), joined && share > 0)
		sc.note("The joiner owned %d shards.", share)
		moved("a join: every shard written again, from the joiner's share", dbNow(t, e), time.Now(), time.Minute)

		hung := procs[2]
		owned := len(hung.Events("shard_owned", time.Time{})) - len(hung.Events("shard_released", time.Time{}))
		t0, l0 = dbNow(t, e), time.Now()
		hung.Signal(syscall.SIGSTOP)
		moved("SIGSTOP of an owner: every shard written again (the leases' ttl is 15 s)", t0, l0, time.Minute)
		time.Sleep(max(0, 20*time.Second-time.Since(l0)))
		hung.Signal(syscall.SIGCONT)
		sc.note("The hung owner owned %d shards when it was stopped.", owned)

		t0, l0 = dbNow(t, e), time.Now()
		if err := e.srv.StopMode("fast"); err != nil {
			t.Fatal(err)
		}
		if err := e.srv.Start(); err != nil {
			t.Fatal(err)
		}
		moved("PostgreSQL restart (-m fast): every shard written again", t0, l0, 2*time.Minute)

		for _, p := range procs[2:] {
			p.Stop()
		}
		for i := range shardCount {
			sc.fence(e.dsn, fmt.Sprintf("%s/%d", set, i))
		}
		// The history of every shard has the shape of leaderships one after another, and
		// the SIGTERM's handovers are in it: the shards its owner let go, each taken
		// again within what the suite measured (its shards written again).
		handed := 0
		for _, a := range sc.checkLeaseHistories(e.dsn, set+"/%") {
			if a.How != "released" || a.Since == nil || a.Since.Before(termAt) || a.Since.After(termAt.Add(termTook)) {
				continue
			}
			handed++
			gap := a.At.Sub(*a.Since)
			if a.At.After(termAt.Add(termTook)) {
				t.Errorf("history: %s let go at %v and taken at %v; the suite saw every shard written again by %v",
					a.Lease, *a.Since, a.At, termAt.Add(termTook))
			}
			sc.observe("history: a shard let go at SIGTERM → taken", time.Minute, gap, true)
		}
		if handed == 0 {
			t.Errorf("history: no shard let go at the SIGTERM and taken again")
		}
	}
	sc.bound("kill -9 of an owner: every shard written again", 0, 3*time.Second)
	sc.bound("SIGTERM of an owner: every shard written again", 0, 3*time.Second)
	sc.bound("a join: the new process owns its share, from its start", 0, 5*time.Second)
	sc.bound("a join: every shard written again, from the joiner's share", 0, 5*time.Second)
	sc.bound("SIGSTOP of an owner: every shard written again (the leases' ttl is 15 s)", 0, 20*time.Second)
	sc.bound("PostgreSQL restart (-m fast): every shard written again", 0, 30*time.Second)
	sc.s.Trials = trials()
	sc.note("Each shard's fencing log is checked as a lease's: no write under an epoch older than one already written (two owners at " +
		"once), none under one epoch by two writers. A hung owner's writes after SIGCONT are refused by its shards' fences.")
}
