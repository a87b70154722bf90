package liveness_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/netfault"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

const (
	// fencedWrites records how each write was fenced.
	fencedWrites = `CREATE TABLE fenced_writes (id bigserial PRIMARY KEY, epoch bigint NOT NULL, how text NOT NULL)`
	insertWrite  = `INSERT INTO fenced_writes (epoch, how) VALUES ($1, $2)`
	// oldFence is the fence as it was before the check at commit: one statement, checked
	// when it runs.
	oldFence = `SELECT liveness.lease_is_held($1, $2), clock_timestamp() < $3`
)

// lead campaigns for name on agent until the test ends, and returns the leadership once
// it leads, with a channel that yields the reason it stopped leading.
func lead(t *testing.T, ctx context.Context, agent *liveness.Agent, name string) (*liveness.Lease, <-chan error) {
	t.Helper()
	campaign, stop := context.WithCancel(ctx)
	leading := make(chan *liveness.Lease, 1)
	told := make(chan error, 1)
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	wg.Go(func() {
		_ = agent.Elect(campaign, liveness.ElectorConfig{Lease: name, TTL: 30 * time.Second,
			OnStartedLeading: func(lctx context.Context, self *liveness.Lease) {
				select {
				case leading <- self:
				default:
				}
				<-lctx.Done()
			},
			OnStoppedLeading: func(reason error) {
				select {
				case told <- reason:
				default:
				}
			}})
	})
	select {
	case self := <-leading:
		return self, told
	case <-time.After(20 * time.Second):
		t.Fatal("the agent did not lead within 20s")
		return nil, nil
	}
}

func countWrites(t *testing.T, ctx context.Context, pool *pgxpool.Pool, how string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM fenced_writes WHERE how = $1`, how).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFencedCommitHeldBackPastTheStepDownIsRefused: a leader's fenced transactions have
// run their writes; their COMMITs are sent just as the network freezes, and reach the
// server once the leader was told it lost the lease (it stepped down: it could no longer
// prove its alive lock), while the server still counts the lease held (the leader's
// session, half open, still holds the lock, and the row has not expired). The check at
// commit refuses both the transaction of BeginTx and the README's pattern (a transaction
// of the caller's own, fenced by Fence, committed by pgx); the fence as it was before
// (checked when it runs, not at COMMIT) lets its transaction commit.
func TestFencedCommitHeldBackPastTheStepDownIsRefused(t *testing.T) {
	t.Parallel()
	db, direct := testdb.MigratedPool(t, 2)
	db.Exec(t, fencedWrites)
	agent, agentNet := startCuttableAgent(t, db, "fenced-commit")
	writesNet := netfault.NewProxy(t, db.DSN, 0)
	t.Cleanup(writesNet.Close)
	writes := pgtest.Pool(t, writesNet.DSN(), 3)
	ctx := testutil.Context(t, time.Minute)
	self, told := lead(t, ctx, agent, "job")

	// While it leads, each kind of fenced write commits.
	if tag, err := self.Exec(ctx, writes, insertWrite, self.Epoch, "leading"); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("Exec while leading: %v rows, %v", tag.RowsAffected(), err)
	}

	// Three transactions, their writes done, their COMMITs not sent yet.
	tx, err := self.BeginTx(ctx, writes, pgx.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, insertWrite, self.Epoch, "begin_tx"); err != nil {
		t.Fatal(err)
	}
	fenced, err := writes.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := self.Fence(ctx, fenced); err != nil {
		t.Fatal(err)
	}
	if _, err := fenced.Exec(ctx, insertWrite, self.Epoch, "fence"); err != nil {
		t.Fatal(err)
	}
	old, err := writes.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var held, inTime bool
	if err := old.QueryRow(ctx, oldFence, "job", self.Epoch, self.FenceDeadline()).Scan(&held, &inTime); err != nil || !held || !inTime {
		t.Fatalf("the old fence while leading: held %v, in time %v, %v", held, inTime, err)
	}
	if _, err := old.Exec(ctx, insertWrite, self.Epoch, "old"); err != nil {
		t.Fatal(err)
	}

	agentNet.Freeze()
	writesNet.Freeze()
	var commits [3]error
	var wg sync.WaitGroup
	for i, tx := range []pgx.Tx{tx, fenced, old} {
		wg.Go(func() { commits[i] = tx.Commit(ctx) })
	}
	var reason error
	select {
	case reason = <-told:
	case <-time.After(20 * time.Second):
		t.Fatal("the leader did not step down within 20s of the partition")
	}
	var lost *liveness.LeaseLostError
	if !errors.As(reason, &lost) || lost.Reason != "not_alive" {
		t.Fatalf("the leader stopped because %v; want %s", reason, "not_alive")
	}
	writesNet.Thaw() // the COMMITs arrive; the agent's network stays cut, so nothing races them
	wg.Wait()
	agentNet.Thaw()

	if commits[2] != nil {
		t.Fatalf("the old fence's COMMIT failed (%v): this test reproduced no COMMIT landing after its writer was told", commits[2])
	}
	var fe *liveness.FencedError
	if !errors.As(commits[0], &fe) || !fe.AtCommit || fe.Held || !errors.Is(commits[0], liveness.ErrLeaseLost) {
		t.Fatalf("BeginTx's COMMIT after the step-down: %v; want a *FencedError at commit, lease not held", commits[0])
	}
	var pgErr *pgconn.PgError
	if !errors.As(commits[1], &pgErr) || pgErr.Code != liveness.SQLStateCommitLate {
		t.Fatalf("the COMMIT of a transaction fenced by Fence after the step-down: %v; want SQLSTATE %s", commits[1], liveness.SQLStateCommitLate)
	}
	for how, want := range map[string]int{"leading": 1, "begin_tx": 0, "fence": 0, "old": 1} {
		if n := countWrites(t, ctx, direct, how); n != want {
			t.Errorf("%d %q writes committed, want %d", n, how, want)
		}
	}
	for _, l := range agent.Snapshot().Leases {
		if l.Name == "job" && l.FencedRefused != 1 {
			t.Errorf("lease job: %d fenced writes refused in the snapshot, want 1 (BeginTx's)", l.FencedRefused)
		}
	}
}

// syncBuffer is a log sink that tests read while the code writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLeaseExecRefusesOnceTheLeaseIsNotHeld: Exec commits the holder's write; once the
// row says another epoch (taken over behind the holder's back) the fence refuses the next
// write with a *FencedError (not 0 rows), ends the lease as taken, and every later write
// is refused without being sent; each refusal is counted, and the first is logged once at
// warning level.
func TestLeaseExecRefusesOnceTheLeaseIsNotHeld(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 2)
	db.Exec(t, fencedWrites)
	var logs syncBuffer
	l, err := liveness.NewLeases(liveness.LeasesConfig{Pool: pool, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t, time.Minute)
	le := mustAcquire(t, ctx, l, "job", 30*time.Second)
	if tag, err := le.Exec(ctx, pool, insertWrite, le.Epoch, "held"); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("Exec while held: %v rows, %v", tag.RowsAffected(), err)
	}
	if err := le.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, insertWrite, le.Epoch, "held")
		return err
	}); err != nil {
		t.Fatalf("BeginFunc while held: %v", err)
	}

	db.Exec(t, `UPDATE liveness.leases SET epoch = epoch + 1000 WHERE name = 'job'`)
	_, err = le.Exec(ctx, pool, insertWrite, le.Epoch, "taken")
	var fe *liveness.FencedError
	if !errors.As(err, &fe) || fe.Held || fe.AtCommit || !errors.Is(err, liveness.ErrFenced) || !errors.Is(err, liveness.ErrLeaseLost) {
		t.Fatalf("Exec after a takeover: %v; want a *FencedError, lease not held", err)
	}
	var lost *liveness.LeaseLostError
	if !errors.As(le.Err(), &lost) || lost.Reason != "taken" {
		t.Fatalf("the lease after the refused fence: %v; want lost, taken", le.Err())
	}
	if _, err := le.Exec(ctx, pool, insertWrite, le.Epoch, "ended"); !errors.Is(err, liveness.ErrFenced) {
		t.Fatalf("Exec after the lease ended: %v; want ErrFenced", err)
	}
	if _, err := le.BeginTx(ctx, pool, pgx.TxOptions{}); !errors.Is(err, liveness.ErrFenced) {
		t.Fatalf("BeginTx after the lease ended: %v; want ErrFenced", err)
	}
	if n := countWrites(t, ctx, pool, "held"); n != 2 {
		t.Fatalf("%d writes of the holder committed, want 2", n)
	}
	if n := db.QueryInt(t, `SELECT count(*) FROM fenced_writes WHERE how <> 'held'`); n != 0 {
		t.Fatalf("%d refused writes committed", n)
	}
	if st := l.Stats(); len(st) != 1 || st[0].FencedRefused != 3 {
		t.Fatalf("Stats = %+v; want 3 fenced writes refused", st)
	}
	if n := strings.Count(logs.String(), "fenced write refused"); n != 1 || !strings.Contains(logs.String(), "level=WARN") {
		t.Fatalf("the refusals logged %d times, want once at warning level:\n%s", n, logs.String())
	}
	// The pool got its connections back out of any transaction.
	if tag, err := pool.Exec(ctx, `SELECT 1`); err != nil || tag.String() != "SELECT 1" {
		t.Fatalf("the pool after the refusals: %v, %v", tag, err)
	}
}

// TestLeaseBeginTxCommitsAndRollsBack: a transaction of BeginTx commits its statements,
// or rolls them back, and gives its connection back either way (a pool of one serves
// every step); a failed transaction's Commit says it rolled back.
func TestLeaseBeginTxCommitsAndRollsBack(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 1)
	db.Exec(t, fencedWrites)
	l := newTestLeases(t, pool)
	ctx := testutil.Context(t, time.Minute)
	le := mustAcquire(t, ctx, l, "job", 30*time.Second)

	tx, err := le.BeginTx(ctx, pool, pgx.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := tx.Exec(ctx, insertWrite, le.Epoch, "committed"); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Rollback after Commit: %v, want ErrTxClosed", err)
	}

	tx, err = le.BeginTx(ctx, pool, pgx.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, insertWrite, le.Epoch, "rolled back"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	mine := errors.New("the job's own error")
	if err := le.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, insertWrite, le.Epoch, "rolled back"); err != nil {
			return err
		}
		return mine
	}); !errors.Is(err, mine) {
		t.Fatalf("BeginFunc = %v, want fn's error", err)
	}

	tx, err = le.BeginTx(ctx, pool, pgx.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1/0`); err == nil {
		t.Fatal("1/0 did not fail")
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("Commit of a failed transaction: %v, want ErrTxCommitRollback", err)
	}

	if n := countWrites(t, ctx, pool, "committed"); n != 2 {
		t.Fatalf("%d committed writes, want 2", n)
	}
	if n := countWrites(t, ctx, pool, "rolled back"); n != 0 {
		t.Fatalf("%d rolled-back writes committed", n)
	}
	if st := l.Stats(); st[0].FencedRefused != 0 {
		t.Fatalf("%d refusals counted, want none", st[0].FencedRefused)
	}
}

// TestFencedWritesOfAHealthyLeaderWaitingASecondAreNotRefused: a leader's deadline is at
// most three quarters of the lock grace (1 s) ahead. A write that waits 1.2 s for the
// pool's only connection, or for a row lock, still commits through Exec: the deadline is
// read once the connection is taken, and the COMMIT carries it as of when it is sent.
// The same write with the deadline taken before the wait (the hand-written fence) is
// refused: this is what the horizon used to cost.
func TestFencedWritesOfAHealthyLeaderWaitingASecondAreNotRefused(t *testing.T) {
	t.Parallel()
	db, direct := testdb.MigratedPool(t, 2)
	db.Exec(t, fencedWrites)
	db.Exec(t, `CREATE TABLE counters (id int PRIMARY KEY, n int NOT NULL); INSERT INTO counters VALUES (1, 0)`)
	agent := newAgent(t, agentConfig(db, direct))
	runAgent(t, agent)
	writes := pgtest.Pool(t, db.DSN, 1)
	ctx := testutil.Context(t, time.Minute)
	self, told := lead(t, ctx, agent, "job")
	const wait = 1200 * time.Millisecond

	// busy holds the pool's only connection for wait, from once it returns.
	busy := func() *sync.WaitGroup {
		conn, err := writes.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() { time.Sleep(wait); conn.Release() })
		return &wg
	}
	wg := busy()
	deadline := self.FenceDeadline()
	tag, err := writes.Exec(ctx, `INSERT INTO fenced_writes (epoch, how) SELECT $1, 'hand-written'
		WHERE liveness.lease_is_held('job', $1) AND clock_timestamp() < $2`, self.Epoch, deadline)
	wg.Wait()
	if err != nil || tag.RowsAffected() != 0 {
		t.Fatalf("the hand-written fence after a %s wait for a connection: %d rows, %v; want refused (the deadline is "+
			"no more than 750ms ahead), or this test shows nothing", wait, tag.RowsAffected(), err)
	}

	// The writes that must commit, each under a leadership that stays healthy through
	// them. On a loaded machine the leader's own gate may end a leadership meanwhile
	// (Reason "not_alive": it could not prove life in time), which says nothing of the horizon
	// tested here; the writes then run again under a new one, at most three times. Any
	// other refusal fails.
	counted := 0
	writesCommit := func(self *liveness.Lease) error {
		wg := busy()
		tag, err := self.Exec(ctx, writes, insertWrite, self.Epoch, "exec")
		wg.Wait()
		if err != nil || tag.RowsAffected() != 1 {
			return fmt.Errorf("Exec after a %s wait for a connection: %d rows, %w", wait, tag.RowsAffected(), err)
		}

		// A row lock held for wait by another transaction: past the deadline Exec's
		// pipeline was sent with, so its COMMIT is refused and Exec runs it once more with
		// a COMMIT of its own (without that second try this fails).
		locker, err := direct.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := locker.Exec(ctx, `SELECT * FROM counters WHERE id = 1 FOR UPDATE`); err != nil {
			t.Fatal(err)
		}
		time.AfterFunc(wait, func() { _ = locker.Rollback(context.Background()) })
		start := time.Now()
		tag, err = self.Exec(ctx, writes, `UPDATE counters SET n = n + 1 WHERE id = 1`)
		if err != nil || tag.RowsAffected() != 1 {
			return fmt.Errorf("Exec waiting for a row lock: %d rows, %w", tag.RowsAffected(), err)
		}
		counted++
		if waited := time.Since(start); waited < wait {
			t.Fatalf("the update took %s, so it did not wait for the row lock (%s)", waited, wait)
		}
		if err := self.BeginFunc(ctx, writes, func(tx pgx.Tx) error {
			time.Sleep(wait) // a slow transaction: its statements' time does not count either
			_, err := tx.Exec(ctx, `UPDATE counters SET n = n + 1 WHERE id = 1`)
			return err
		}); err != nil {
			return fmt.Errorf("BeginFunc of a %s transaction: %w", wait, err)
		}
		counted++
		return nil
	}
	for attempt := 1; ; attempt++ {
		err := writesCommit(self)
		if err == nil {
			break
		}
		// Why the leadership ended, as the elector told it.
		var reason error
		select {
		case reason = <-told:
		case <-time.After(5 * time.Second):
		}
		var lost *liveness.LeaseLostError
		if attempt == 3 || !errors.Is(err, liveness.ErrLeaseLost) || !errors.As(reason, &lost) || lost.Reason != "not_alive" {
			t.Fatalf("%v (the leadership ended: %v)", err, reason)
		}
		t.Logf("attempt %d: the leader's gate ended its leadership (%v); again under a new lease", attempt, err)
		self, told = lead(t, ctx, agent, fmt.Sprintf("job-%d", attempt+1))
	}
	if n := db.QueryInt(t, `SELECT n FROM counters WHERE id = 1`); n != counted {
		t.Fatalf("counter %d, want %d (one per update that committed)", n, counted)
	}
}

// TestFencedWritesInEveryQueryExecMode: Exec and BeginFunc commit, and refuse, the same
// in every pgx query mode, the simple protocol and the unprepared ones too, and through
// PgBouncer in transaction mode: Exec's pipeline of BEGIN, fence and
// statement is one multi-statement query there, and a refused fence still keeps the
// statement after it from running.
func TestFencedWritesInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 2)
	db.Exec(t, fencedWrites)
	ctx := testutil.Context(t, time.Minute)
	bouncer := pgtest.NewPgBouncer(t, db.DSN) // transaction mode
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol",
		"pgbouncer_exec", "pgbouncer_simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			dsn := db.DSN + " default_query_exec_mode=" + mode
			if m, ok := strings.CutPrefix(mode, "pgbouncer_"); ok {
				dsn = bouncer.DSN(db.Name) + " default_query_exec_mode=" + m
			}
			writes := pgtest.Pool(t, dsn, 1)
			le := mustAcquire(t, ctx, newTestLeases(t, pool), "job-"+mode, 30*time.Second)
			if tag, err := le.Exec(ctx, writes, insertWrite, le.Epoch, mode); err != nil || tag.RowsAffected() != 1 {
				t.Fatalf("Exec: %v rows, %v", tag.RowsAffected(), err)
			}
			if err := le.BeginFunc(ctx, writes, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, insertWrite, le.Epoch, mode)
				return err
			}); err != nil {
				t.Fatalf("BeginFunc: %v", err)
			}
			db.Exec(t, `UPDATE liveness.leases SET epoch = epoch + 1000 WHERE name = $1`, le.Name)
			if _, err := le.Exec(ctx, writes, insertWrite, le.Epoch, mode); !errors.Is(err, liveness.ErrFenced) {
				t.Fatalf("Exec after a takeover: %v; want ErrFenced", err)
			}
			if n := countWrites(t, ctx, pool, mode); n != 2 {
				t.Fatalf("%d writes committed, want 2", n)
			}
			if tag, err := writes.Exec(ctx, `SELECT 1`); err != nil || tag.String() != "SELECT 1" {
				t.Fatalf("the pool after the refusal: %v, %v", tag, err)
			}
		})
	}
}

// sentMessages records what a connection sends, one entry per write to the socket: pgx
// writes a pipeline (a batch and its Sync) in one, so each entry is a round trip.
type sentMessages struct {
	net.Conn
	mu    sync.Mutex
	sends []string
}

func (c *sentMessages) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.sends = append(c.sends, string(p))
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// since returns the writes after the first n.
func (c *sentMessages) since(n int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.sends[n:])
}

// TestLeaseExecIsOneRoundTrip: Exec sends its fence and its write in one pipeline, with
// no BEGIN or COMMIT; a short BeginTx transaction, whose deadline did not move, commits
// with a bare COMMIT (its fence's check holds it to that deadline), and one whose
// deadline moved sends the deadline with its COMMIT.
func TestLeaseExecIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 1)
	db.Exec(t, fencedWrites)
	l := newTestLeases(t, pool)
	cfg, err := pgxpool.ParseConfig(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	var sent *sentMessages
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		sent = &sentMessages{Conn: c}
		return sent, nil
	}
	ctx := testutil.Context(t, time.Minute)
	writes, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(writes.Close)
	le := mustAcquire(t, ctx, l, "job", 8*time.Second)
	exec := func() []string {
		t.Helper()
		if err := writes.Ping(ctx); err != nil { // the connection, dialled
			t.Fatal(err)
		}
		before := len(sent.since(0))
		if tag, err := le.Exec(ctx, writes, insertWrite, le.Epoch, "exec"); err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("Exec: %d rows, %v", tag.RowsAffected(), err)
		}
		return sent.since(before)
	}
	exec() // prepares the statements on the connection: a round trip of its own, once
	got := exec()
	if len(got) != 1 {
		t.Fatalf("Exec took %d round trips, want 1: %q", len(got), got)
	}

	commitOf := func(tx func(tx pgx.Tx) error) string {
		t.Helper()
		before := len(sent.since(0))
		if err := le.BeginFunc(ctx, writes, tx); err != nil {
			t.Fatalf("BeginFunc: %v", err)
		}
		all := sent.since(before)
		return all[len(all)-1]
	}
	insert := func(tx pgx.Tx) error { _, err := tx.Exec(ctx, insertWrite, le.Epoch, "tx"); return err }
	if c := commitOf(insert); c != commitOf(insert) || !strings.Contains(c, "COMMIT") || strings.Contains(c, "commit_deadline") {
		t.Fatalf("a short transaction's COMMIT sent %q; want a bare COMMIT", c)
	}
	renewed := le.FenceDeadline()
	c := commitOf(func(tx pgx.Tx) error {
		// Until a renewal moves the deadline on (every quarter of the TTL, here 2 s).
		for le.FenceDeadline().Equal(renewed) {
			if err := ctx.Err(); err != nil {
				return err
			}
			time.Sleep(50 * time.Millisecond)
		}
		return insert(tx)
	})
	if !strings.Contains(c, "commit_deadline") || !strings.Contains(c, "COMMIT") {
		t.Fatalf("the COMMIT of a transaction whose deadline moved sent %q; want the new deadline with it", c)
	}
	if n := countWrites(t, ctx, pool, "exec") + countWrites(t, ctx, pool, "tx"); n != 5 {
		t.Fatalf("%d writes committed, want 5", n)
	}
}
