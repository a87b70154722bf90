package liveness_test

// How long a fenced transaction may run: shorter than its lease's TTL it costs no lease;
// past it, exactly its own lease ends, and its statement is cancelled.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// shardRun is what one callback of a shard saw.
type shardRun struct {
	epoch   int64
	started time.Time
	stopped error // the callback's context's cause once it returned; nil while it runs
}

// shardRuns records every callback of a set's shards, in order.
type shardRuns struct {
	mu   sync.Mutex
	runs map[string][]*shardRun
}

func (r *shardRuns) get(shard string) []shardRun {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]shardRun, len(r.runs[shard]))
	for i, run := range r.runs[shard] {
		out[i] = *run
	}
	return out
}

// runShards runs Shards for set (count shards, ttl) on agent until the test ends, each
// callback running work (if set) on shard 0 once, and waits until it owns them all.
func runShards(t *testing.T, agent *liveness.Agent, set string, count int, ttl time.Duration,
	work func(ctx context.Context, s liveness.Shard)) *shardRuns {
	t.Helper()
	r := &shardRuns{runs: map[string][]*shardRun{}}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var once sync.Once
	go func() {
		done <- agent.Shards(ctx, liveness.ShardsConfig{Set: set, Count: count, TTL: ttl,
			OnStartedOwning: func(ctx context.Context, s liveness.Shard) {
				run := &shardRun{epoch: s.Epoch, started: time.Now()}
				r.mu.Lock()
				r.runs[s.Name] = append(r.runs[s.Name], run)
				r.mu.Unlock()
				if s.Name == "0" && work != nil {
					once.Do(func() { work(ctx, s) })
				}
				<-ctx.Done()
				r.mu.Lock()
				run.stopped = context.Cause(ctx)
				r.mu.Unlock()
			}})
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Shards: %v", err)
		}
	})
	testutil.Eventually(t, 30*time.Second, fmt.Sprintf("the member owning all %d shards", count), func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.runs) == count
	})
	return r
}

// A fenced transaction shorter than its lease's TTL costs no lease, neither its own nor
// another's: a member owning 8 shards (TTL 15 s, the default), whose shard 0 runs one
// 12 s statement in shard.BeginFunc, loses none, and the transaction commits. The fence
// holds the lease row FOR KEY SHARE, which the member's one renewal of all its leases
// does not wait for (migration 0017); before, it held it FOR SHARE, and at 13.6 s the
// member gave up all 8.
func TestShardsFencedTransactionShorterThanTheTTLCostsNoLease(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 8)
	ctx := testutil.Context(t, time.Minute)
	agent := newAgent(t, liveness.AgentConfig{Pool: pool, DirectDSN: db.DSN, InstanceID: uuid.New(), ServiceName: "slow"})
	runAgent(t, agent)
	db.Exec(t, `CREATE TABLE slow_writes (shard text, at timestamptz)`)
	wrote := make(chan error, 1)
	runs := runShards(t, agent, "slow", 8, defaults.ElectorTTL, func(ctx context.Context, s liveness.Shard) {
		wrote <- s.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO slow_writes SELECT $1, clock_timestamp() FROM pg_sleep(12)`, s.Name)
			return err
		})
	})
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("the 12 s fenced transaction of shard 0: %v; want it committed", err)
		}
	case <-ctx.Done():
		t.Fatal("the 12 s fenced transaction did not end within a minute")
	}
	if n := db.QueryInt(t, `SELECT count(*) FROM slow_writes`); n != 1 {
		t.Errorf("%d rows written; want the one of the 12 s transaction", n)
	}
	for i := range 8 {
		shard := fmt.Sprint(i)
		if got := runs.get(shard); len(got) != 1 || got[0].stopped != nil {
			t.Errorf("shard %s's callbacks: %+v; want the first still running", shard, got)
		}
	}
	if st := agent.Snapshot().Shards; len(st) != 1 || st[0].Lost != 0 || st[0].Owned != 8 {
		t.Errorf("the set's stats: %+v; want 8 owned and none lost", st)
	}
}

// Past its lease's TTL, a fenced transaction costs its own lease and nothing else: its
// running statement is cancelled on the server (so that a takeover, which waits for the
// fenced transaction, is not held back by it), its lease ends (Reason "expired") with one log
// line naming the transaction's age and the bound, its write is a *FencedError, and the
// other shards of the member keep their leases. The member then owns the shard again,
// under a new epoch: nothing holds its row any more.
func TestShardsFencedTransactionPastTheTTLEndsItsOwnLeaseOnly(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 8)
	ctx := testutil.Context(t, time.Minute)
	logger, logs := logbuf.Logger()
	agent := newAgent(t, liveness.AgentConfig{Pool: pool, DirectDSN: db.DSN, InstanceID: uuid.New(), ServiceName: "stuck",
		Logger: logger})
	runAgent(t, agent)
	const ttl = 2 * time.Second
	wrote := make(chan error, 1)
	var began time.Time
	runs := runShards(t, agent, "stuck", 8, ttl, func(ctx context.Context, s liveness.Shard) {
		began = time.Now()
		wrote <- s.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			// The job's own context is not the statement's: a hung job's statement would
			// not heed it either.
			_, err := tx.Exec(context.WithoutCancel(ctx), `SELECT pg_sleep(60)`)
			return err
		})
	})
	var err error
	select {
	case err = <-wrote:
	case <-ctx.Done():
		t.Fatal("the fenced transaction past its TTL was not ended within a minute")
	}
	took := time.Since(began)
	var fenced *liveness.FencedError
	if !errors.As(err, &fenced) || !errors.Is(err, liveness.ErrLeaseLost) || fenced.Held {
		t.Errorf("the write past the TTL: %v; want a *FencedError of a lease no longer held", err)
	}
	if took < ttl || took > ttl+3*time.Second {
		t.Errorf("the write past the TTL returned %s after it began; want soon after the TTL (%s)", took, ttl)
	}
	// Cancelled on the server: no backend sleeps any more.
	testutil.Eventually(t, 5*time.Second, "the statement cancelled on the server", func() bool {
		return db.QueryInt(t, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep(60)%'`) == 0
	})
	// Shard 0 lost its lease for its transaction, and is owned again under a new epoch.
	testutil.Eventually(t, 10*time.Second, "shard 0 owned again", func() bool { return len(runs.get("0")) == 2 })
	zero := runs.get("0")
	var lost *liveness.LeaseLostError
	if !errors.As(zero[0].stopped, &lost) || lost.Reason != "expired" ||
		!strings.Contains(lost.Error(), "past its bound") || zero[1].epoch <= zero[0].epoch {
		t.Errorf("shard 0's callbacks: %+v; want the first stopped by its lost lease (expired, past its bound), "+
			"the second under a newer epoch", zero)
	}
	for i := 1; i < 8; i++ {
		if got := runs.get(fmt.Sprint(i)); len(got) != 1 || got[0].stopped != nil {
			t.Errorf("shard %d's callbacks: %+v; want the first still running", i, got)
		}
	}
	var told []string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			told = append(told, line)
		}
	}
	if len(told) != 1 || !strings.Contains(told[0], "past its bound") || !strings.Contains(told[0], "age=2") ||
		!strings.Contains(told[0], "bound=2s") {
		t.Errorf("warnings and errors logged: %q; want one line naming the transaction's age and its bound (2s)", told)
	}
}

// A fenced COMMIT on a session the server ended for idling in the transaction past its
// limit (SQLSTATE 25P03) commits nothing: it is a *FencedError, whether the COMMIT
// itself read the server's FATAL or a statement before it did and the connection was
// closed. The transaction sets a shorter limit of its own after the fence, as the fence's
// doc allows.
func TestFencedCommitAfterTheIdleLimitIsRefused(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	ctx := testutil.Context(t, 30*time.Second)
	le := mustAcquire(t, ctx, newTestLeases(t, pool), "idle", 10*time.Second)
	db.Exec(t, `CREATE TABLE idle_writes (n int)`)
	for _, statementFirst := range []bool{false, true} {
		tx, err := le.BeginTx(ctx, pool, pgx.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SET LOCAL idle_in_transaction_session_timeout = '200ms'`); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO idle_writes VALUES (1)`); err != nil {
			t.Fatal(err)
		}
		pid := tx.Conn().PgConn().PID()
		testutil.Eventually(t, 10*time.Second, "the server ending the idle session", func() bool {
			return db.QueryInt(t, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int64(pid)) == 0
		})
		if statementFirst {
			if _, err := tx.Exec(ctx, `SELECT 1`); err == nil {
				t.Fatal("a statement on the ended session succeeded")
			}
		}
		err = tx.Commit(ctx)
		var fenced *liveness.FencedError
		if !errors.As(err, &fenced) || !fenced.AtCommit || !fenced.Held {
			t.Errorf("COMMIT after the idle limit (a statement first: %v): %v; want a *FencedError at commit, "+
				"the lease still held", statementFirst, err)
		}
	}
	if n := db.QueryInt(t, `SELECT count(*) FROM idle_writes`); n != 0 {
		t.Errorf("%d rows committed; want none", n)
	}
}
