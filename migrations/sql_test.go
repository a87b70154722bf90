package migrations_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

func lockKey(t *testing.T, q *pgxpool.Pool, id uuid.UUID) int64 {
	t.Helper()
	var k int64
	if err := q.QueryRow(testutil.Context(t, 60*time.Second), `SELECT liveness.instance_lock_key($1)`, id).Scan(&k); err != nil {
		t.Fatal(err)
	}
	return k
}

func queryBool(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, sql string, args ...any) bool {
	t.Helper()
	var b bool
	if err := q.QueryRow(testutil.Context(t, 60*time.Second), sql, args...).Scan(&b); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return b
}

func TestInstanceLockKeyIs64Bit(t *testing.T) {
	_, pool := testdb.MigratedPool(t, 4)
	seen := map[int64]bool{}
	wide := false
	for range 200 {
		id := uuid.New()
		k := lockKey(t, pool, id)
		if k != lockKey(t, pool, id) {
			t.Fatal("instance_lock_key is not deterministic")
		}
		if seen[k] {
			t.Fatalf("key collision among 200 ids: %d", k)
		}
		seen[k] = true
		if k > 1<<31 || k < -(1<<31) {
			wide = true
		}
	}
	if !wide {
		t.Fatal("no key among 200 ids is outside the int32 range: the key is not 64-bit")
	}
}

func TestClaimAliveLock(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	id := uuid.New()
	a, b := db.Conn(t), db.Conn(t)
	if !queryBool(t, a, `SELECT liveness.claim_instance_alive_lock($1)`, id) {
		t.Fatal("first claim returned false")
	}
	if queryBool(t, b, `SELECT liveness.claim_instance_alive_lock($1)`, id) {
		t.Fatal("a second session claimed a held alive lock (duplicate id must get false)")
	}
	if !queryBool(t, pool, `SELECT liveness.alive_lock_held($1)`, id) {
		t.Fatal("alive_lock_held is false while the lock is held")
	}
	if err := a.Close(testutil.Context(t, 60*time.Second)); err != nil {
		t.Fatal(err)
	}
	// The backend ends shortly after the client's Terminate message.
	testutil.Eventually(t, 10*time.Second, "the lock freed once its session closed", func() bool {
		return !queryBool(t, pool, `SELECT liveness.alive_lock_held($1)`, id)
	})
	if !queryBool(t, b, `SELECT liveness.claim_instance_alive_lock($1)`, id) {
		t.Fatal("the lock was not claimable after its session ended")
	}
}

// The public implementation matched pg_locks without objsubid, so a two-int4 lock on the
// key's halves counted as alive.
func TestTwoInt4LockOnKeyHalvesIsNotAlive(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	id := uuid.New()
	k := lockKey(t, pool, id)
	c := db.Conn(t)
	if _, err := c.Exec(testutil.Context(t, 60*time.Second), `SELECT pg_advisory_lock($1::int4, $2::int4)`, int32(k>>32), int32(k)); err != nil {
		t.Fatal(err)
	}
	// The impostor really has the same classid/objid as the key would.
	if !queryBool(t, pool, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2
		AND classid = liveness.lock_key_classid($1) AND objid = liveness.lock_key_objid($1))`, k) {
		t.Fatal("test setup: the two-int4 lock does not share the key's halves")
	}
	if queryBool(t, pool, `SELECT liveness.is_instance_alive($1, 30)`, id) {
		t.Fatal("a two-int4 lock with the key's halves counts as the alive lock")
	}
	if queryBool(t, pool, `SELECT EXISTS (SELECT 1 FROM liveness.instance_alive_locks)`) {
		t.Fatal("instance_alive_locks lists a two-int4 lock")
	}
}

func TestLockInAnotherDatabaseDoesNotCount(t *testing.T) {
	_, pool := testdb.MigratedPool(t, 4)
	other := pgtest.NewDB(t)
	id := uuid.New()
	k := lockKey(t, pool, id)
	c := other.Conn(t)
	if _, err := c.Exec(testutil.Context(t, 60*time.Second), `SELECT pg_advisory_lock($1::bigint)`, k); err != nil {
		t.Fatal(err)
	}
	if queryBool(t, pool, `SELECT liveness.is_instance_alive($1, 30)`, id) {
		t.Fatal("a lock on the same key in another database counts as alive")
	}
}

// Keys with the high bit set and a negative low half broke `::int` casts and
// `classid + objid` in the public implementation.
func TestNegativeKeysWork(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	var id uuid.UUID
	found := false
	for range 1000 {
		id = uuid.New()
		k := lockKey(t, pool, id)
		if k < 0 && int32(k) < 0 && int32(k>>32) < 0 {
			found = true
			break
		}
	}
	if !found {
		t.Fatal("no id with a negative key and negative halves among 1000")
	}
	// A heartbeat past the threshold, so only the lock can make it alive.
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, last_heartbeat_at)
		VALUES ($1, 'svc', now() - interval '1 minute')`, id)
	c := db.Conn(t)
	if !queryBool(t, c, `SELECT liveness.claim_instance_alive_lock($1)`, id) {
		t.Fatal("claim failed")
	}
	if !queryBool(t, pool, `SELECT liveness.is_instance_alive($1, 30)`, id) {
		t.Fatal("is_instance_alive is false for a held negative key")
	}
}

func TestIsInstanceAlive(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	lockOnly, hbOnly, both, neither, stale, zombie := uuid.New(), uuid.New(), uuid.New(), uuid.New(), uuid.New(), uuid.New()
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, last_heartbeat_at) VALUES
		($1, 'svc', now() - interval '2 minutes'),
		($2, 'svc', now() - interval '5 seconds'),
		($3, 'svc', now()),
		($4, 'svc', now() - interval '31 seconds'),
		($5, 'svc', now() - interval '10 minutes')`, lockOnly, hbOnly, both, stale, zombie)
	c := db.Conn(t)
	for _, id := range []uuid.UUID{lockOnly, both, zombie} {
		if !queryBool(t, c, `SELECT liveness.claim_instance_alive_lock($1)`, id) {
			t.Fatal("claim failed")
		}
	}
	for name, tc := range map[string]struct {
		id   uuid.UUID
		want bool
	}{
		"lock only":                {lockOnly, true},
		"heartbeat only":           {hbOnly, true},
		"both":                     {both, true},
		"neither (no row)":         {neither, false},
		"heartbeat older than 30s": {stale, false},
		// Rows without timing of their own get the 5-minute definitive-dead cutoff.
		"lock held, heartbeat past the definitive-dead cutoff": {zombie, false},
	} {
		if got := queryBool(t, pool, `SELECT liveness.is_instance_alive($1, 30)`, tc.id); got != tc.want {
			t.Errorf("%s: is_instance_alive = %v, want %v", name, got, tc.want)
		}
	}
}

func TestCleanupStaleInstances(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	fresh, staleFree, staleLocked, deadLocked, deadFree := uuid.New(), uuid.New(), uuid.New(), uuid.New(), uuid.New()
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, last_heartbeat_at) VALUES
		($1, 'svc', now()),
		($2, 'svc', now() - interval '2 minutes'),
		($3, 'svc', now() - interval '2 minutes'),
		($4, 'svc', now() - interval '10 minutes'),
		($5, 'svc', now() - interval '10 minutes')`, fresh, staleFree, staleLocked, deadLocked, deadFree)
	c := db.Conn(t)
	for _, id := range []uuid.UUID{staleLocked, deadLocked} {
		if !queryBool(t, c, `SELECT liveness.claim_instance_alive_lock($1)`, id) {
			t.Fatal("claim failed")
		}
	}
	reap := func(sql string) []uuid.UUID {
		rows, err := pool.Query(testutil.Context(t, 60*time.Second), sql)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(ids, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
		return ids
	}
	sorted := func(ids ...uuid.UUID) []uuid.UUID {
		slices.SortFunc(ids, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
		return ids
	}

	// Without a definitive-dead cutoff, held locks protect their rows however old.
	got := reap(`SELECT * FROM liveness.cleanup_stale_instances(now() - interval '90 seconds')`)
	if want := sorted(staleFree, deadFree); !slices.Equal(got, want) {
		t.Fatalf("first cleanup deleted %v, want %v", got, want)
	}
	// Past the definitive-dead cutoff the lock no longer protects (a half-open session).
	got = reap(`SELECT * FROM liveness.cleanup_stale_instances(now() - interval '90 seconds', now() - interval '5 minutes')`)
	if want := sorted(deadLocked); !slices.Equal(got, want) {
		t.Fatalf("second cleanup deleted %v, want %v", got, want)
	}
	left := reap(`SELECT instance_id FROM liveness.instances`)
	if want := sorted(fresh, staleLocked); !slices.Equal(left, want) {
		t.Fatalf("rows left %v, want %v", left, want)
	}
}

func TestLeaseIsHeldRejectsOldEpoch(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	var oldEpoch, newEpoch int64
	if err := pool.QueryRow(testutil.Context(t, 60*time.Second), `INSERT INTO liveness.leases (name, holder, expires_at)
		VALUES ('cleanup', 'a:1:1', now() + interval '1 minute') RETURNING epoch`).Scan(&oldEpoch); err != nil {
		t.Fatal(err)
	}
	if !queryBool(t, pool, `SELECT liveness.lease_is_held('cleanup', $1)`, oldEpoch) {
		t.Fatal("lease_is_held is false for the current epoch")
	}
	// A takeover assigns a new epoch from the sequence.
	if err := pool.QueryRow(testutil.Context(t, 60*time.Second), `UPDATE liveness.leases SET holder = 'b:2:2', epoch = nextval('liveness.lease_epoch_seq')
		WHERE name = 'cleanup' RETURNING epoch`).Scan(&newEpoch); err != nil {
		t.Fatal(err)
	}
	if newEpoch <= oldEpoch {
		t.Fatalf("new epoch %d is not above old %d", newEpoch, oldEpoch)
	}
	if queryBool(t, pool, `SELECT liveness.lease_is_held('cleanup', $1)`, oldEpoch) {
		t.Fatal("lease_is_held is true for an old epoch")
	}
	// A write fenced with the old epoch touches nothing.
	db.Exec(t, `CREATE TABLE results (v int)`)
	db.Exec(t, `INSERT INTO results VALUES (1)`)
	tag, err := pool.Exec(testutil.Context(t, 60*time.Second), `UPDATE results SET v = 2 WHERE liveness.lease_is_held('cleanup', $1)`, oldEpoch)
	if err != nil || tag.RowsAffected() != 0 {
		t.Fatalf("fenced write with old epoch: %v rows, %v", tag.RowsAffected(), err)
	}
	tag, err = pool.Exec(testutil.Context(t, 60*time.Second), `UPDATE results SET v = 3 WHERE liveness.lease_is_held('cleanup', $1)`, newEpoch)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("fenced write with current epoch: %v rows, %v", tag.RowsAffected(), err)
	}
	db.Exec(t, `UPDATE liveness.leases SET expires_at = now() - interval '1 second'`)
	if queryBool(t, pool, `SELECT liveness.lease_is_held('cleanup', $1)`, newEpoch) {
		t.Fatal("lease_is_held is true for an expired lease")
	}
}

// TestInstanceStatesWritesNothingWhenNothingChanges: instance_states stamps a vanished
// lock once and clears the stamp once the lock is back; with nothing changing it writes
// nothing at all. A transaction that writes (or row-locks) anything is assigned a
// transaction id, so pg_current_xact_id_if_assigned() after the call tells exactly.
func TestInstanceStatesWritesNothingWhenNothingChanges(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	ids := make([]uuid.UUID, 50)
	for i := range ids {
		ids[i] = uuid.New()
	}
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock)
		SELECT id, 'svc', true FROM unnest($1::uuid[]) AS id`, ids)
	holder := db.Conn(t)
	for _, id := range ids[1:] { // ids[0]'s lock has vanished: its process died
		if !queryBool(t, holder, `SELECT liveness.claim_instance_alive_lock($1)`, id) {
			t.Fatal("claim failed")
		}
	}
	// wrote runs instance_states in a transaction of its own and reports whether that
	// transaction wrote anything.
	wrote := func() bool {
		t.Helper()
		tx, err := pool.Begin(testutil.Context(t, 60*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(testutil.Context(t, 60*time.Second)) }()
		var n int
		var xid *string
		if err := tx.QueryRow(testutil.Context(t, 60*time.Second), `SELECT count(*) FROM liveness.instance_states()`).Scan(&n); err != nil || n != len(ids) {
			t.Fatalf("instance_states: %d rows, %v", n, err)
		}
		if err := tx.QueryRow(testutil.Context(t, 60*time.Second), `SELECT pg_current_xact_id_if_assigned()::text`).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(testutil.Context(t, 60*time.Second)); err != nil {
			t.Fatal(err)
		}
		return xid != nil
	}
	if !wrote() {
		t.Fatal("the first look at a vanished lock wrote no stamp")
	}
	for i := range 3 {
		if wrote() {
			t.Fatalf("look %d with nothing changed wrote something", i+2)
		}
	}
	if !queryBool(t, holder, `SELECT liveness.claim_instance_alive_lock($1)`, ids[0]) {
		t.Fatal("claim failed")
	}
	if !wrote() {
		t.Fatal("the stamp of a lock that came back was not cleared")
	}
	if wrote() {
		t.Fatal("a look with every lock held wrote something")
	}
}

// TestStampAfterVerdict: stamp_alive_lock_absences_seen looks at pg_locks only when the
// caller's verdict saw a lock_lost instance or a stamp stands, and then writes what
// pg_locks says, whatever ids it was given.
func TestStampAfterVerdict(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	gone, held, unknown := uuid.New(), uuid.New(), uuid.New()
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock)
		SELECT id, 'svc', true FROM unnest($1::uuid[]) AS id`, []uuid.UUID{gone, held})
	holder := db.Conn(t)
	if !queryBool(t, holder, `SELECT liveness.claim_instance_alive_lock($1)`, held) {
		t.Fatal("claim failed")
	}
	// stamp calls the function in a transaction of its own and returns its result, whether
	// the transaction wrote anything, and the stamped ids.
	stamp := func(seen []uuid.UUID) (missing *int, wrote bool, stamped []uuid.UUID) {
		t.Helper()
		tx, err := pool.Begin(testutil.Context(t, 60*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(testutil.Context(t, 60*time.Second)) }()
		var xid *string
		if err := tx.QueryRow(testutil.Context(t, 60*time.Second), `SELECT liveness.stamp_alive_lock_absences_seen($1)`, seen).Scan(&missing); err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRow(testutil.Context(t, 60*time.Second), `SELECT pg_current_xact_id_if_assigned()::text`).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(testutil.Context(t, 60*time.Second)); err != nil {
			t.Fatal(err)
		}
		rows, err := pool.Query(testutil.Context(t, 60*time.Second), `SELECT instance_id FROM liveness.alive_lock_absences ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		stamped, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			t.Fatal(err)
		}
		return missing, xid != nil, stamped
	}
	if n, wrote, stamped := stamp(nil); n == nil || *n != 0 || wrote || len(stamped) != 0 {
		t.Fatalf("nothing seen, no stamp: got %v missing, wrote %v, stamps %v; want 0, nothing written", n, wrote, stamped)
	}
	// The ids passed in only decide whether to look: held's lock is held and unknown has
	// no row, so only gone is stamped.
	if n, wrote, stamped := stamp([]uuid.UUID{held, unknown}); n == nil || *n != 1 || !wrote || !slices.Equal(stamped, []uuid.UUID{gone}) {
		t.Fatalf("after a look: got %v missing, wrote %v, stamps %v; want 1, a write, [%v]", n, wrote, stamped, gone)
	}
	// A standing stamp is checked even when the verdict saw nothing lock_lost (it is
	// stale by then): the lock is back, so the stamp is cleared.
	if !queryBool(t, holder, `SELECT liveness.claim_instance_alive_lock($1)`, gone) {
		t.Fatal("claim failed")
	}
	if n, wrote, stamped := stamp(nil); n == nil || *n != 0 || !wrote || len(stamped) != 0 {
		t.Fatalf("lock back: got %v missing, wrote %v, stamps %v; want 0, the stamp cleared", n, wrote, stamped)
	}
	if _, wrote, _ := stamp(nil); wrote {
		t.Fatal("a look with nothing seen and no stamp wrote something")
	}
}

// Only an exclusive lock on the key is an alive lock (claim_instance_alive_lock takes it
// so): shared locks on the key, even from two sessions, neither count as held nor give
// the instance two rows.
func TestSharedLockOnKeyIsNotTheAliveLock(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	id := uuid.New()
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name) VALUES ($1, 'svc')`, id)
	k := lockKey(t, pool, id)
	for range 2 {
		if _, err := db.Conn(t).Exec(testutil.Context(t, 60*time.Second), `SELECT pg_advisory_lock_shared($1)`, k); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	var held *bool
	if err := pool.QueryRow(testutil.Context(t, 60*time.Second), `SELECT count(*), bool_or(lock_held) FROM liveness.instance_state_verdicts() WHERE instance_id = $1`,
		id).Scan(&n, &held); err != nil {
		t.Fatal(err)
	}
	if n != 1 || held == nil || *held {
		t.Fatalf("with two shared locks on the key: %d rows, lock_held %v; want 1 row, false", n, held)
	}
	if !queryBool(t, db.Conn(t), `SELECT liveness.claim_instance_alive_lock($1) IS FALSE`, id) {
		t.Fatal("test setup: the shared locks do not block the claim")
	}
}

// TestRefusedTriesJudgeFromStampsWhileWatched: while a watcher's tick is recent,
// is_instance_alive judges from the instance's row and absence stamp (index lookups,
// nothing written, pg_locks not read); once no watcher has ticked for a second it falls
// back to the full verdict, which reads pg_locks and stamps. The stamps are part of the
// watcher's digest, so one written behind its back is reconciled on the next tick.
func TestRefusedTriesJudgeFromStampsWhileWatched(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	gone, held := uuid.New(), uuid.New()
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock)
		SELECT id, 'svc', true FROM unnest($1::uuid[]) AS id`, []uuid.UUID{gone, held})
	holder := db.Conn(t)
	if !queryBool(t, holder, `SELECT liveness.claim_instance_alive_lock($1)`, held) {
		t.Fatal("claim failed")
	}
	stamps := func(id uuid.UUID) int {
		return db.QueryInt(t, `SELECT count(*) FROM liveness.alive_lock_absences WHERE instance_id = $1`, id)
	}
	// aliveWrote runs is_instance_alive in a transaction of its own: its answer, and
	// whether that transaction wrote anything (a stamp).
	aliveWrote := func(id uuid.UUID) (alive, wrote bool) {
		t.Helper()
		ctx := testutil.Context(t, 60*time.Second)
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		var xid *string
		if err := tx.QueryRow(ctx, `SELECT liveness.is_instance_alive($1)`, id).Scan(&alive); err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id_if_assigned()::text`).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return alive, xid != nil
	}
	tick := func(digest *string) string {
		t.Helper()
		var d string
		if err := pool.QueryRow(testutil.Context(t, 60*time.Second),
			`SELECT digest FROM liveness.watch_alive_locks($1) LIMIT 1`, digest).Scan(&d); err != nil {
			t.Fatal(err)
		}
		return d
	}

	// No watcher has ticked: the full verdict, which stamps the vanished lock.
	if alive, wrote := aliveWrote(gone); !alive || !wrote || stamps(gone) != 1 {
		t.Fatalf("without a watcher: alive %v, wrote %v, %d stamps; want alive (within its grace), a stamp written", alive, wrote, stamps(gone))
	}
	db.Exec(t, `DELETE FROM liveness.alive_lock_absences`)

	// A watcher ticks (and stamps); a stamp removed behind its back is not written again
	// by a refused try, which counts the unstamped lock as held and writes nothing.
	digest := tick(nil)
	db.Exec(t, `DELETE FROM liveness.alive_lock_absences`)
	if alive, wrote := aliveWrote(gone); !alive || wrote || stamps(gone) != 0 {
		t.Fatalf("while watched: alive %v, wrote %v, %d stamps; want alive from the row, nothing written", alive, wrote, stamps(gone))
	}
	// The stamp is what the answer rests on: one of the present claim past the grace is
	// dead, even though the instance holds its lock (the next tick clears it: see below).
	db.Exec(t, `INSERT INTO liveness.alive_lock_absences (instance_id, missing_since, server_started_at, lock_pid)
		SELECT instance_id, now() - interval '5 seconds', pg_postmaster_start_time(), lock_pid
		  FROM liveness.instances WHERE instance_id = $1`, held)
	if alive, _ := aliveWrote(held); alive {
		t.Fatal("while watched, an instance with a stamp past its grace is alive: the stamp was not read")
	}
	// The stamps are in the digest: the next tick sees the change, clears the stamp of
	// the lock that is held and stamps the one that is not.
	if next := tick(&digest); next == digest {
		t.Fatalf("the digest %q did not change with the stamps", digest)
	}
	if stamps(held) != 0 || stamps(gone) != 1 {
		t.Fatalf("after the tick: %d stamps for the held lock, %d for the vanished one; want 0 and 1", stamps(held), stamps(gone))
	}
	if alive, _ := aliveWrote(held); !alive {
		t.Fatal("the holder is dead after the tick cleared its stamp")
	}

	// The watcher stops: five seconds later (migration 0014) the full verdict answers
	// again, and writes; two seconds later the rows still do.
	db.Exec(t, `UPDATE liveness.alive_lock_watch SET watched_at = clock_timestamp() - interval '2 seconds'`)
	db.Exec(t, `DELETE FROM liveness.alive_lock_absences`)
	if alive, wrote := aliveWrote(gone); !alive || wrote || stamps(gone) != 0 {
		t.Fatalf("with the watcher 2 s late: alive %v, wrote %v, %d stamps; want the rows' answer, nothing written", alive, wrote, stamps(gone))
	}
	db.Exec(t, `UPDATE liveness.alive_lock_watch SET watched_at = clock_timestamp() - interval '6 seconds'`)
	db.Exec(t, `DELETE FROM liveness.alive_lock_absences`)
	if alive, wrote := aliveWrote(gone); !alive || !wrote || stamps(gone) != 1 {
		t.Fatalf("with the watcher stale: alive %v, wrote %v, %d stamps; want the full verdict's stamp", alive, wrote, stamps(gone))
	}
}

// TestStampOfAnEarlierClaimDoesNotCount: a stamp says that the session that claimed an
// instance's alive lock no longer holds it. After a server restart (or the end of its
// lock session) the instance claims its lock again from a new session; a stamp taken
// before that claim, or by a look that ran during it (pg_locks shows the new lock the
// moment it is taken, while the claim's update of the row's claimant is not committed),
// is about the old session, and stays until the next look at the locks. Looks come with
// the watcher's ticks, which come late on a server slowed down by a fleet reconnecting
// at once, while its record counts as fresh for five seconds (migration 0014). Such a
// stamp was the answer: one lock grace after it, refused tries called the instance dead
// and ticks told its followers that its leases were free, while it held its lock,
// counted itself alive and kept leading (the two-hour soak saw two processes in one
// lease's job, 65–375 ms, after restarts). A stamp counts only for the claim it was
// taken under (migration 0016).
func TestStampOfAnEarlierClaimDoesNotCount(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	id := uuid.New()
	// A lock grace of 100 ms: a stamp goes past it without a long wait.
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock, lock_grace)
		VALUES ($1, 'svc', true, interval '100 milliseconds')`, id)
	ctx := testutil.Context(t, 60*time.Second)
	tick := func() {
		t.Helper()
		if _, err := pool.Exec(ctx, `SELECT liveness.watch_alive_locks(NULL)`); err != nil {
			t.Fatal(err)
		}
	}
	stampedFor := func() *int32 {
		t.Helper()
		var pid *int32
		if err := pool.QueryRow(ctx, `SELECT max(lock_pid) FROM liveness.alive_lock_absences WHERE instance_id = $1`, id).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		return pid
	}
	first := db.Conn(t)
	if !queryBool(t, first, `SELECT liveness.claim_instance_alive_lock($1)`, id) {
		t.Fatal("the first claim failed")
	}
	// The first session ends (a restart ends them all), and its lock with it.
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the first session's lock is gone", func() bool {
		return !queryBool(t, pool, `SELECT liveness.alive_lock_held($1)`, id)
	})
	// The claim again, from a new session, held open between its lock and its commit
	// while the watcher looks.
	again := db.Conn(t)
	claim, err := again.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !queryBool(t, claim, `SELECT liveness.claim_instance_alive_lock($1)`, id) {
		t.Fatal("the second claim failed")
	}
	tick()
	if err := claim.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if stampedFor() == nil {
		t.Fatal("test setup: the look during the claim stamped nothing")
	}
	if !queryBool(t, pool, `SELECT liveness.alive_lock_held($1)`, id) {
		t.Fatal("test setup: the lock is not held by its claimant")
	}
	// No look comes before the stamp is past the lock grace; the watcher's record is
	// still fresh, so refused tries answer from the rows and stamps.
	time.Sleep(300 * time.Millisecond)
	if !queryBool(t, pool, `SELECT liveness.alive_lock_watch_is_fresh()`) {
		t.Fatal("test setup: the watcher's record is not fresh")
	}
	if !queryBool(t, pool, `SELECT liveness.is_instance_alive($1)`, id) {
		t.Fatal("an instance that holds its lock is dead by a stamp taken under its earlier claim")
	}
	var alive bool
	if err := pool.QueryRow(ctx, `SELECT alive FROM liveness.instance_state_verdicts(p_instance_id => $1)`, id).Scan(&alive); err != nil {
		t.Fatal(err)
	}
	if !alive {
		t.Fatal("the full verdict calls the instance that holds its lock dead")
	}
	// Its lock vanishes again: the earlier claim's stamp must not hide the new absence,
	// nor date it. The next look stamps it for the new claim, and one lock grace later
	// the instance is dead.
	var pid int32
	if err := again.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if err := again.Close(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the second session's lock is gone", func() bool {
		return !queryBool(t, pool, `SELECT liveness.alive_lock_held($1)`, id)
	})
	if !queryBool(t, pool, `SELECT liveness.is_instance_alive($1)`, id) {
		t.Fatal("an absence not looked at yet is dated by the earlier claim's stamp: dead at once")
	}
	tick()
	if got := stampedFor(); got == nil || *got != pid {
		t.Fatalf("after a look, the stamp is for claimant %v; want %d", got, pid)
	}
	testutil.Eventually(t, 10*time.Second, "the instance is dead once its lock is gone past its grace", func() bool {
		return !queryBool(t, pool, `SELECT liveness.is_instance_alive($1)`, id)
	})
}

// TestLeaseEventsTakenAndExpired: taking a lease notifies taken:<name> (a renewal does
// not), and the watcher's tick notifies free:<name> for a lease that expired since the
// previous tick, once.
func TestLeaseEventsTakenAndExpired(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 4)
	listener := db.Conn(t)
	ctx := testutil.Context(t, 60*time.Second)
	if _, err := listener.Exec(ctx, `SELECT liveness.events_listen()`); err != nil {
		t.Fatal(err)
	}
	next := func() string {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		n, err := listener.WaitForNotification(wctx)
		if err != nil {
			return ""
		}
		return n.Payload
	}
	tick := func() {
		t.Helper()
		if _, err := pool.Exec(ctx, `SELECT count(*) FROM liveness.watch_alive_locks(NULL)`); err != nil {
			t.Fatal(err)
		}
	}
	tick() // the first tick: the reference for "since"
	db.Exec(t, `INSERT INTO liveness.leases (name, holder, epoch, taken_at, expires_at)
		VALUES ('job', 'h1', 1, now(), now() + interval '300 milliseconds')`)
	if got := next(); got != "taken:job" {
		t.Fatalf("after the lease was taken: %q; want taken:job", got)
	}
	db.Exec(t, `UPDATE liveness.leases SET expires_at = now() + interval '300 milliseconds'`)
	time.Sleep(400 * time.Millisecond) // the lease's own expiry: what is being waited for
	tick()
	if got := next(); got != "free:job" {
		t.Fatalf("after the lease expired and the watcher ticked: %q; want free:job (and no taken: for the renewal)", got)
	}
	tick()
	if got := next(); got != "" {
		t.Fatalf("a second tick notified %q; want nothing (the expiry was told once)", got)
	}
	db.Exec(t, `UPDATE liveness.leases SET epoch = 2, holder = 'h2', expires_at = now() + interval '1 minute'`)
	if got := next(); got != "taken:job" {
		t.Fatalf("after a takeover: %q; want taken:job", got)
	}
	// A name too long for a notification's 8000 bytes is taken and released without one:
	// pg_notify would fail the statement.
	long := strings.Repeat("l", 9000)
	db.Exec(t, `INSERT INTO liveness.leases (name, holder, epoch, taken_at, expires_at) VALUES ($1, 'h', 3, now(), now() + interval '1 minute')`, long)
	db.Exec(t, `DELETE FROM liveness.leases WHERE name = $1`, long)
}
