package store_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/whizbangtest"
)

// exclusiveKeys are the granted exclusive bigint advisory locks of the pool's database,
// as an observer of the server reads them for it.
func exclusiveKeys(t *testing.T, ctx context.Context, q testdb.Querier) (classids, objids []uint32, pids []int32) {
	t.Helper()
	return lockKeys(t, ctx, q, `SELECT classid, objid, pid FROM liveness.bigint_advisory_locks WHERE granted AND mode = 'ExclusiveLock'`)
}

// lockKeys reads the (classid, objid, pid) rows of query.
func lockKeys(t *testing.T, ctx context.Context, q testdb.Querier, query string) (classids, objids []uint32, pids []int32) {
	t.Helper()
	rows, err := q.Query(ctx, query)
	if err != nil {
		t.Fatal(err)
	}
	classids, objids, pids = []uint32{}, []uint32{}, []int32{}
	for rows.Next() {
		var c, o uint32
		var p int32
		if err := rows.Scan(&c, &o, &p); err != nil {
			t.Fatal(err)
		}
		classids, objids, pids = append(classids, c), append(objids, o), append(pids, p)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return classids, objids, pids
}

// The verdict of given locks (migration 0008) is instance_state_verdicts' when given the
// locks pg_locks shows, for an instance in every state: alive, lock_only, zombie (lock
// held), lock_lost and stale (lock vanished within and past its grace), heartbeat_only.
func TestVerdictOfGivenLocksIsTheVerdict(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 2)
	ctx := testutil.Context(t, time.Minute)
	ids := map[string]uuid.UUID{}
	for _, c := range []struct {
		name, age string
		holds     bool // the row says it holds its alive lock
		locked    bool // a session holds it
		missing   string
	}{
		{"alive", "1 second", true, true, ""}, {"lock_only", "2 minutes", true, true, ""}, {"zombie", "10 minutes", true, true, ""},
		{"lock_lost", "1 second", true, false, "0.1 seconds"}, {"stale", "1 second", true, false, "1 hour"},
		{"heartbeat_only", "1 second", false, false, ""},
	} {
		id := uuid.New()
		ids[c.name] = id
		db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock, last_heartbeat_at, lock_grace)
		            VALUES ($1, 'svc', $2, now() - $3::interval, '10 seconds')`, id, c.holds, c.age)
		if c.locked {
			conn := db.Conn(t)
			if _, err := conn.Exec(ctx, `SELECT liveness.claim_instance_alive_lock($1)`, id); err != nil {
				t.Fatal(err)
			}
			db.Exec(t, `UPDATE liveness.instances SET last_heartbeat_at = now() - $2::interval WHERE instance_id = $1`, id, c.age)
		}
		if c.missing != "" {
			db.Exec(t, `INSERT INTO liveness.alive_lock_absences (instance_id, missing_since, server_started_at) VALUES ($1, now() - $2::interval, pg_postmaster_start_time())`, id, c.missing)
		}
	}
	// Other advisory locks, which are no alive lock: a shared one on an instance's key
	// would not count either.
	other := db.Conn(t)
	if _, err := other.Exec(ctx, `SELECT pg_advisory_lock(42), pg_advisory_lock(1, 2)`); err != nil {
		t.Fatal(err)
	}
	classids, objids, pids := exclusiveKeys(t, ctx, pool)
	rows, err := pool.Query(ctx, `
	    SELECT v.instance_id::text, v.state, g.state, v.alive = g.alive AND v.lock_held IS NOT DISTINCT FROM g.lock_held
	      FROM liveness.instance_state_verdicts() v
	      JOIN liveness.instance_state_verdicts_of_locks('90 seconds', '5 minutes', $1::oid[], $2::oid[], $3::integer[]) g USING (instance_id)`,
		classids, objids, pids)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		ID, Own, Given string
		Same           bool
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(ids) {
		t.Fatalf("%d instances judged by both, want %d: %+v", len(got), len(ids), got)
	}
	for _, r := range got {
		if r.Own != r.Given || !r.Same {
			t.Errorf("instance %s: %s by its own read of pg_locks, %s by the given locks (alive and lock_held same: %v)", r.ID, r.Own, r.Given, r.Same)
		}
		if r.ID == ids[r.Own].String() {
			continue
		}
		t.Errorf("instance %s is %s, not the state it was set up in", r.ID, r.Own)
	}
}

// A lock taken after the server's locks were read (the instance claims it between the
// snapshot and its database's statement) is a lock the snapshot says is missing: the
// instances statement of given locks calls the instance lock_lost (alive, within its
// grace: an unstamped absence counts as just seen), never dead, and the stamping that
// follows reads pg_locks itself and records no absence, so the next scrape, whose
// snapshot holds the lock, calls it alive.
func TestLockTakenAfterTheSnapshotIsNeverDead(t *testing.T) {
	db, pool := testdb.MigratedPool(t, 2)
	ctx := testutil.Context(t, time.Minute)
	id := uuid.New()
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock, last_heartbeat_at, lock_grace) VALUES ($1, 'svc', true, now(), '1 second')`, id)
	before, _, _ := exclusiveKeys(t, ctx, pool) // the snapshot: no lock yet
	if len(before) != 0 {
		t.Fatalf("locks before the claim: %v", before)
	}
	holder := db.Conn(t)
	if _, err := holder.Exec(ctx, `SELECT liveness.claim_instance_alive_lock($1)`, id); err != nil {
		t.Fatal(err)
	}
	q := store.InstancesOfLocks(nil)
	read := func(classids, objids []uint32, pids []int32) (lockLost, alive int64) {
		rows, err := pool.Query(ctx, q.SQL, q.Args(10, classids, objids, pids)...)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByName[store.InstancesRow])
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range got {
			if r.ServiceName.String == "svc" && !r.InstanceID.Valid {
				if r.Stale.Int64+r.Zombie.Int64 != 0 {
					t.Errorf("the instance, its lock held, is called dead: %+v", r)
				}
				return r.LockLost.Int64, r.Alive.Int64
			}
		}
		t.Fatalf("no row of service svc: %+v", got)
		return 0, 0
	}
	if lost, _ := read([]uint32{}, []uint32{}, []int32{}); lost != 1 {
		t.Errorf("with the lock taken after the snapshot: %d lock_lost, want 1", lost)
	}
	if n := db.QueryInt(t, `SELECT count(*) FROM liveness.alive_lock_absences`); n != 0 {
		t.Errorf("the stamping recorded %d absences of a lock that is held", n)
	}
	time.Sleep(1100 * time.Millisecond) // past the grace: a stamp, had one been written, would now say dead
	if _, alive := read(exclusiveKeys(t, ctx, pool)); alive != 1 {
		t.Errorf("with the next snapshot, which holds the lock: %d alive, want 1", alive)
	}
}

// A Whizbang source's instances statement of given locks counts what its own read of
// pg_locks counts: instances alive, lock_only and zombie by their locks, stale and
// heartbeat_only without, and two instances sharing a held 32-bit key.
func TestWhizbangVerdictOfGivenLocksIsTheVerdict(t *testing.T) {
	db, _ := testdb.MigratedPool(t, 2)
	wb := whizbangtest.NewFixture(t, db)
	ctx := testutil.Context(t, time.Minute)
	for _, c := range []struct {
		svc   string
		age   time.Duration
		claim bool
	}{{"wh-a", time.Second, true}, {"wh-a", 2 * time.Minute, true}, {"wh-a", 10 * time.Minute, true},
		{"wh-b", 3 * time.Minute, false}, {"wh-b", time.Second, false}} {
		id := uuid.New()
		wb.Register(t, id, c.svc, c.age)
		if c.claim && !wb.Claim(t, id) {
			t.Fatal("whizbang claim failed")
		}
	}
	a, b := wb.CollidingIDs(t)
	wb.Register(t, a, "wh-c", time.Second)
	wb.Register(t, b, "wh-c", time.Second)
	if !wb.Claim(t, a) {
		t.Fatal("whizbang claim failed")
	}
	src := wb.Reads(t)
	classids, objids, pids := lockKeys(t, ctx, wb.Observer, `SELECT classid, objid, pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted
	    AND mode = 'ExclusiveLock' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
	if len(classids) != 4 {
		t.Fatalf("%d exclusive locks read, want 4", len(classids))
	}
	counts := func(q store.Query, args ...any) []store.InstancesRow {
		rows, err := wb.Observer.Query(ctx, q.SQL, q.Args(args...)...)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByName[store.InstancesRow])
		if err != nil {
			t.Fatal(err)
		}
		var out []store.InstancesRow
		for _, r := range got {
			if !r.InstanceID.Valid { // the counts, not the ages, which move
				r.Age = pgtype.Float8{}
				out = append(out, r)
			}
		}
		return out
	}
	own, given := counts(store.Instances.For(src), 0), counts(store.InstancesOfLocks(src), 0, classids, objids, pids)
	if !reflect.DeepEqual(own, given) || len(own) != 4 {
		t.Errorf("own read of pg_locks:\n%+v\ngiven locks:\n%+v", own, given)
	}
	for _, r := range own {
		if r.InRecovery.Valid && r.KeyShared.Int64 != 2 {
			t.Errorf("key shared by %d instances, want 2: %+v", r.KeyShared.Int64, r)
		}
	}
}
