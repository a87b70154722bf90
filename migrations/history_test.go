package migrations_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// historyEvent is one row of liveness.history as the tests compare it.
type historyEvent struct {
	ID         int64              `db:"id"`
	At         time.Time          `db:"at"`
	Kind       string             `db:"kind"`
	Lease      string             `db:"lease"`
	Epoch      int64              `db:"epoch"`
	InstanceID *uuid.UUID         `db:"instance_id"`
	How        string             `db:"how"`
	Reason     string             `db:"reason"`
	Since      pgtype.Timestamptz `db:"since"`
	DeadAt     pgtype.Timestamptz `db:"dead_at"`
}

func (e historyEvent) String() string {
	s := e.Kind
	if e.Lease != "" {
		s += fmt.Sprintf(" %s#%d", e.Lease, e.Epoch)
	}
	if e.How != "" {
		s += " " + e.How
	}
	if e.Reason != "" {
		s += "(" + e.Reason + ")"
	}
	return s
}

// TestHistoryTellsTheStoryOfALease drives a lease through each way a leadership begins
// and ends, and two instances through joining, dying and leaving, with the schema's own
// functions, and checks that the history says exactly that, with the database's times:
// the gaps it records are the ones that happened, a death is recorded once whoever
// notices it, and lease_holder_at answers for any moment.
func TestHistoryTellsTheStoryOfALease(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	ctx := testutil.Context(t, 2*time.Minute)
	a, b, c := uuid.New(), uuid.New(), uuid.New()
	// Lock graces of 150 ms: a vanished lock is dead without a long wait.
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, host_name, holds_alive_lock, lock_grace)
		SELECT id, 'svc', 'host-' || n, true, interval '150 milliseconds'
		  FROM unnest($1::uuid[]) WITH ORDINALITY AS u(id, n)`, []uuid.UUID{a, b, c})
	sessions := map[uuid.UUID]*pgx.Conn{}
	for _, id := range []uuid.UUID{a, b, c} {
		sessions[id] = db.Conn(t)
		if !queryBool(t, sessions[id], `SELECT liveness.claim_instance_alive_lock($1)`, id) {
			t.Fatal("claim failed")
		}
	}
	take := func(lease, holder string, ttl float64, id uuid.UUID) int64 {
		t.Helper()
		var epoch *int64
		if err := pool.QueryRow(ctx, `SELECT t.epoch FROM liveness.lease_take($1, $2, $3, $4, 'host') t`,
			lease, holder, ttl, id).Scan(&epoch); err != nil {
			t.Fatal(err)
		}
		if epoch == nil {
			t.Fatalf("%s could not take %s", holder, lease)
		}
		return *epoch
	}
	release := store.LeaseRelease.In("").SQL
	letGo := func(lease, holder string, epoch int64, reason string) {
		t.Helper()
		var n int64
		if err := pool.QueryRow(ctx, release, lease, holder, epoch, reason).Scan(&n); err != nil || n != 1 {
			t.Fatalf("release of %s: %v, %d rows", lease, err, n)
		}
	}

	e1 := take("job", "a1", 60, a)
	letGo("job", "a1", e1, "")
	e2 := take("job", "b1", 60, b)
	// b crashes: its session ends, the watcher stamps the vanished lock, and after the
	// grace a takes the lease over from the dead holder.
	if err := sessions[b].Close(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "b's lock is gone", func() bool {
		return !queryBool(t, pool, `SELECT liveness.alive_lock_held($1)`, b)
	})
	if _, err := pool.Exec(ctx, `SELECT liveness.watch_alive_locks(NULL)`); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "b is dead", func() bool {
		return !queryBool(t, pool, `SELECT liveness.is_instance_alive($1)`, b)
	})
	e3 := take("job", "a2", 0.2, a)
	var e3Expiry time.Time
	if err := pool.QueryRow(ctx, `SELECT expires_at FROM liveness.leases WHERE name = 'job' AND epoch = $1`, e3).Scan(&e3Expiry); err != nil {
		t.Fatal(err)
	}
	// The watcher notifies b dead after the takeover: its death is already recorded.
	if _, err := pool.Exec(ctx, `SELECT liveness.notify_dead_instances($1)`, []uuid.UUID{b}); err != nil {
		t.Fatal(err)
	}
	// a's lease expires unrenewed (ttl 200 ms), and c takes it over.
	testutil.Eventually(t, 10*time.Second, "a's lease expired", func() bool {
		return queryBool(t, pool, `SELECT expires_at < now() FROM liveness.leases WHERE name = 'job'`)
	})
	e4 := take("job", "c1", 60, c)
	// A leader that lost its lease lets it go, saying why.
	e5 := take("step", "c2", 60, c)
	letGo("step", "c2", e5, "not_alive")
	// b's row is reaped; a leaves.
	if _, err := pool.Exec(ctx, `SELECT liveness.cleanup_stale_instances(now() - interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	db.Exec(t, `DELETE FROM liveness.instances WHERE instance_id = $1`, a)

	rows, err := pool.Query(ctx, `SELECT id, at, kind, coalesce(lease_name, '') AS lease, coalesce(epoch, 0) AS epoch, instance_id,
		coalesce(how, '') AS how, coalesce(reason, '') AS reason, since, dead_at FROM liveness.history ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	events, err := pgx.CollectRows(rows, pgx.RowToStructByName[historyEvent])
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range events {
		got = append(got, e.String())
	}
	want := []string{
		"joined", "joined", "joined",
		fmt.Sprintf("acquired job#%d free", e1),
		fmt.Sprintf("ended job#%d released", e1),
		fmt.Sprintf("acquired job#%d released", e2),
		"lock_vanished",
		"dead lock_lost",
		fmt.Sprintf("ended job#%d holder_dead", e2),
		fmt.Sprintf("acquired job#%d holder_dead", e3),
		fmt.Sprintf("ended job#%d expired", e3),
		fmt.Sprintf("acquired job#%d expired", e4),
		fmt.Sprintf("acquired step#%d free", e5),
		fmt.Sprintf("ended step#%d stepped_down(not_alive)", e5),
		"reaped",
		"left",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("history:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	byKind := func(kind string, i int) historyEvent { // the i-th event of kind
		for _, e := range events {
			if e.Kind == kind {
				if i == 0 {
					return e
				}
				i--
			}
		}
		t.Fatalf("no %s event %d", kind, i)
		return historyEvent{}
	}
	vanished, dead := byKind("lock_vanished", 0), byKind("dead", 0)
	if *vanished.InstanceID != b || *dead.InstanceID != b {
		t.Fatalf("the vanishing and the death are b's (%s): %v, %v", b, vanished.InstanceID, dead.InstanceID)
	}
	// The death: its last sign of life is the stamp, its verdict a grace later.
	if !dead.Since.Time.Equal(vanished.At) || dead.At.Sub(vanished.At) != 150*time.Millisecond || !dead.DeadAt.Time.Equal(dead.At) {
		t.Errorf("death since %v at %v dead_at %v; want since the stamp %v, dead 150 ms later", dead.Since.Time, dead.At, dead.DeadAt.Time, vanished.At)
	}
	// Each acquisition's gap starts where the previous leadership ended.
	for i, prev := range []historyEvent{byKind("ended", 0), byKind("ended", 1), byKind("ended", 2)} {
		next := byKind("acquired", i+1)
		if !next.Since.Valid || !next.Since.Time.Equal(prev.At) || next.At.Before(prev.At) {
			t.Errorf("%v: since %v; want the end of %v at %v", next, next.Since.Time, prev, prev.At)
		}
	}
	takeover := byKind("acquired", 2)
	if !takeover.DeadAt.Valid || !takeover.DeadAt.Time.Equal(dead.At) || !takeover.Since.Time.Equal(vanished.At) {
		t.Errorf("the takeover from dead b: since %v dead_at %v; want the vanishing %v and the verdict %v",
			takeover.Since.Time, takeover.DeadAt.Time, vanished.At, dead.At)
	}
	// The expired leadership ends at its row's expiry (its ttl after its transaction began),
	// and began when the row says it was taken.
	expired := byKind("ended", 2)
	if !expired.At.Equal(e3Expiry) || !expired.Since.Valid || expired.At.Sub(expired.Since.Time) != 200*time.Millisecond {
		t.Errorf("the expired leadership: since %v, ended %v; want its row's taken_at and expiry %v, 200ms apart",
			expired.Since.Time, expired.At, e3Expiry)
	}

	// Who held job when: in each leadership its holder, in the gap nobody.
	holderAt := func(at time.Time) (epoch int64, ok bool) {
		t.Helper()
		err := pool.QueryRow(ctx, `SELECT epoch FROM liveness.lease_holder_at('job', $1)`, at).Scan(&epoch)
		if err == pgx.ErrNoRows {
			return 0, false
		}
		if err != nil {
			t.Fatal(err)
		}
		return epoch, true
	}
	for _, c := range []struct {
		at    time.Time
		epoch int64
	}{
		{byKind("acquired", 0).At, e1},
		{byKind("acquired", 1).At, e2},
		{vanished.At.Add(-time.Microsecond), e2},
		{takeover.At, e3},
		{byKind("acquired", 3).At.Add(time.Hour), e4},
	} {
		if got, ok := holderAt(c.at); !ok || got != c.epoch {
			t.Errorf("lease_holder_at(job, %v) = %d, %v; want epoch %d", c.at, got, ok, c.epoch)
		}
	}
	for _, at := range []time.Time{byKind("acquired", 0).At.Add(-time.Second), vanished.At.Add(time.Microsecond)} {
		if got, ok := holderAt(at); ok {
			t.Errorf("lease_holder_at(job, %v) = %d; want nobody (before the first, in the gap after b's death)", at, got)
		}
	}
}

// TestHistoryPruneIsBounded: whatever the history holds (a backlog of rows past the
// retention, rows dated ahead of the clock by a jump or by hand), one prune deletes at
// most its batch, oldest ids first, keeps what the retention keeps, and says how many
// rows it deleted for being dated ahead.
func TestHistoryPruneIsBounded(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	ctx := testutil.Context(t, 2*time.Minute)
	// 120,000 old rows, 12 dated a week ahead among them, then 5 recent ones.
	db.Exec(t, `INSERT INTO liveness.history (at, kind, lease_name)
		SELECT CASE WHEN g % 10000 = 0 THEN now() + interval '7 days' ELSE now() - interval '30 days' END, 'acquired', 'junk'
		  FROM generate_series(1, 120000) g`)
	db.Exec(t, `INSERT INTO liveness.history (at, kind, lease_name) SELECT now(), 'acquired', 'kept' FROM generate_series(1, 5)`)
	prune := store.HistoryPrune.In("").SQL
	var total, ahead int64
	for round := 1; ; round++ {
		var pruned, a int64
		if err := pool.QueryRow(ctx, prune, (7*24*time.Hour).Seconds(), 50000).Scan(&pruned, &a); err != nil {
			t.Fatal(err)
		}
		if pruned > 50000 {
			t.Fatalf("round %d pruned %d rows; the batch is 50,000", round, pruned)
		}
		total, ahead = total+pruned, ahead+a
		if pruned == 0 {
			break
		}
		if round > 4 {
			t.Fatalf("still pruning after %d rounds of 50,000: %d of 120,000", round, total)
		}
	}
	if total != 120000 || ahead != 12 {
		t.Fatalf("pruned %d rows, %d of them ahead; want 120,000, 12 ahead", total, ahead)
	}
	if n := db.QueryInt(t, `SELECT count(*) FROM liveness.history WHERE lease_name = 'kept'`); n != 5 {
		t.Fatalf("%d recent rows left; want the 5 within the retention", n)
	}
}

// TestConcurrentStampsRecordOneVanishing: two watchers stamp the same vanished lock at the
// same time (each read pg_locks before the other committed). The second waits on the
// first's row and then keeps it: one lock_vanished in the history, and the stamp's time is
// the first's, not moved later by the second.
func TestConcurrentStampsRecordOneVanishing(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	ctx := testutil.Context(t, 2*time.Minute)
	id := uuid.New()
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, host_name, holds_alive_lock)
		VALUES ($1, 'svc', 'host', true)`, id)
	session := db.Conn(t)
	if !queryBool(t, session, `SELECT liveness.claim_instance_alive_lock($1)`, id) {
		t.Fatal("claim failed")
	}
	if err := session.Close(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the lock is gone", func() bool {
		return !queryBool(t, pool, `SELECT liveness.alive_lock_held($1)`, id)
	})
	first, second := db.Conn(t), db.Conn(t)
	var secondPID uint32
	if err := second.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&secondPID); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*pgx.Conn{first, second} {
		if _, err := c.Exec(ctx, `BEGIN`); err != nil {
			t.Fatal(err)
		}
	}
	stamp := `SELECT liveness.stamp_alive_lock_absences($1)`
	if _, err := first.Exec(ctx, stamp, id); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := second.Exec(ctx, stamp, id)
		done <- err
	}()
	testutil.Eventually(t, 30*time.Second, "the second stamper waits on the first's row", func() bool {
		return queryBool(t, pool, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock')`, secondPID)
	})
	if _, err := first.Exec(ctx, `COMMIT`); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := second.Exec(ctx, `COMMIT`); err != nil {
		t.Fatal(err)
	}
	var vanishings int
	var at, missingSince time.Time
	if err := pool.QueryRow(ctx, `SELECT count(*), max(h.at), (SELECT missing_since FROM liveness.alive_lock_absences WHERE instance_id = $1)
		FROM liveness.history h WHERE h.kind = 'lock_vanished' AND h.instance_id = $1`, id).Scan(&vanishings, &at, &missingSince); err != nil {
		t.Fatal(err)
	}
	if vanishings != 1 || !at.Equal(missingSince) {
		t.Fatalf("%d lock_vanished rows, the last at %v, the stamp at %v; want one, at the stamp", vanishings, at, missingSince)
	}
}

// TestHistoryLeadershipBegunAfterTheLastSignOfLife: a holder may take a lease after its
// lock was stamped vanished (still alive by the verdict, within its grace) and then be
// called dead. The leadership's end is recorded at its beginning, not before it (the soak,
// seed 1206, saw an end 290 ms before its acquisition), and the takeover's gap counts
// from that end.
func TestHistoryLeadershipBegunAfterTheLastSignOfLife(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	ctx := testutil.Context(t, 2*time.Minute)
	late, heir := uuid.New(), uuid.New()
	// A grace of 3 s for the late taker: room for its acquisition after the stamp on a
	// loaded machine.
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, host_name, holds_alive_lock, lock_grace)
		VALUES ($1, 'svc', 'late', true, interval '3 seconds'), ($2, 'svc', 'heir', true, interval '1 second')`, late, heir)
	sessions := map[uuid.UUID]*pgx.Conn{}
	for _, id := range []uuid.UUID{late, heir} {
		sessions[id] = db.Conn(t)
		if !queryBool(t, sessions[id], `SELECT liveness.claim_instance_alive_lock($1)`, id) {
			t.Fatal("claim failed")
		}
	}
	if err := sessions[late].Close(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the late taker's lock is gone", func() bool {
		return !queryBool(t, pool, `SELECT liveness.alive_lock_held($1)`, late)
	})
	if _, err := pool.Exec(ctx, `SELECT liveness.stamp_alive_lock_absences($1)`, late); err != nil {
		t.Fatal(err)
	}
	take := func(holder string, id uuid.UUID) int64 {
		t.Helper()
		var epoch *int64
		if err := pool.QueryRow(ctx, `SELECT t.epoch FROM liveness.lease_take('job', $1, 60, $2, 'host') t`, holder, id).Scan(&epoch); err != nil {
			t.Fatal(err)
		}
		if epoch == nil {
			t.Fatalf("%s could not take the lease", holder)
		}
		return *epoch
	}
	first := take("late-1", late) // after its stamp, within its grace
	testutil.Eventually(t, 30*time.Second, "the late taker is dead", func() bool {
		return !queryBool(t, pool, `SELECT liveness.is_instance_alive($1)`, late)
	})
	second := take("heir-1", heir)

	var acquired, ended, takeover time.Time
	var takeoverSince pgtype.Timestamptz
	if err := pool.QueryRow(ctx, `SELECT
		(SELECT at FROM liveness.history WHERE lease_name = 'job' AND kind = 'acquired' AND epoch = $1),
		(SELECT at FROM liveness.history WHERE lease_name = 'job' AND kind = 'ended' AND epoch = $1 AND how = 'holder_dead'),
		(SELECT at FROM liveness.history WHERE lease_name = 'job' AND kind = 'acquired' AND epoch = $2),
		(SELECT since FROM liveness.history WHERE lease_name = 'job' AND kind = 'acquired' AND epoch = $2)`,
		first, second).Scan(&acquired, &ended, &takeover, &takeoverSince); err != nil {
		t.Fatal(err)
	}
	if ended.Before(acquired) || ended.After(takeover) {
		t.Errorf("epoch %d acquired at %v, ended at %v, taken over at %v; want its end between", first, acquired, ended, takeover)
	}
	if !takeoverSince.Valid || !takeoverSince.Time.Equal(ended) {
		t.Errorf("the takeover's gap counts from %v; want the end %v", takeoverSince.Time, ended)
	}
}
