package whizbang_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/whizbang"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Fixture is a Whizbang database as its services leave it: the table from Whizbang's
// documented columns, and alive locks taken the way Whizbang takes them, each from a
// session of its own. The observer connects as a role with only SELECT on the table and
// pg_read_all_stats.
type Fixture struct {
	DB       *pgtest.DB
	Observer *pgxpool.Pool
	Source   whizbang.Source
	locks    map[uuid.UUID]*pgx.Conn
}

func NewFixture(t *testing.T) *Fixture {
	t.Helper()
	db := pgtest.NewDB(t)
	if db.Server == nil {
		t.Fatal("this test needs a server of its own for a password role: unset " + pgtest.EnvDSN)
	}
	db.Exec(t, `CREATE TABLE public.wh_service_instances (
		instance_id       uuid        PRIMARY KEY,
		service_name      text        NOT NULL,
		host_name         text        NOT NULL,
		process_id        integer     NOT NULL,
		started_at        timestamptz NOT NULL DEFAULT now(),
		last_heartbeat_at timestamptz NOT NULL DEFAULT now(),
		metadata          jsonb)`)
	role := "obs_" + db.Name
	const pw = "observer-pw"
	db.Exec(t, fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD '%s';
		GRANT CONNECT ON DATABASE %s TO %[1]s;
		GRANT USAGE ON SCHEMA public TO %[1]s;
		GRANT SELECT ON public.wh_service_instances TO %[1]s;
		GRANT pg_read_all_stats TO %[1]s`, role, pw, db.Name))
	// The observer's sessions are read-only: anything it tried to write would fail.
	db.Exec(t, `ALTER ROLE `+role+` SET default_transaction_read_only = on`)
	obs := pgtest.Pool(t, fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable",
		db.Server.Port, role, pw, db.Name), 2)
	return &Fixture{DB: db, Observer: obs, Source: whizbang.Defaults(), locks: map[uuid.UUID]*pgx.Conn{}}
}

// Register inserts an instance whose last heartbeat is age ago.
func (f *Fixture) Register(t *testing.T, id uuid.UUID, service string, age time.Duration) {
	t.Helper()
	f.DB.Exec(t, `INSERT INTO public.wh_service_instances (instance_id, service_name, host_name, process_id, last_heartbeat_at, metadata)
		VALUES ($1, $2, 'host-a', 1, now() - $3::interval, '{"version": "1.2.3"}')`, id, service, age)
}

// Beat sets the instance's last heartbeat to age ago.
func (f *Fixture) Beat(t *testing.T, id uuid.UUID, age time.Duration) {
	t.Helper()
	f.DB.Exec(t, `UPDATE public.wh_service_instances SET last_heartbeat_at = now() - $2::interval WHERE instance_id = $1`, id, age)
}

// Claim takes the instance's alive lock as Whizbang does, on a session of its own, and
// reports whether it got it.
func (f *Fixture) Claim(t *testing.T, id uuid.UUID) bool {
	t.Helper()
	c := f.DB.Conn(t)
	var ok bool
	if err := c.QueryRow(ctxT(t), `SELECT pg_try_advisory_lock(hashtext($1 || $2::text))`, f.Source.LockKeyPrefix, id).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	if ok {
		f.locks[id] = c
	}
	return ok
}

// Crash ends the session holding the instance's lock.
func (f *Fixture) Crash(t *testing.T, id uuid.UUID) {
	t.Helper()
	c := f.locks[id]
	if c == nil {
		t.Fatalf("%s holds no lock", id)
	}
	if err := c.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	delete(f.locks, id)
}

type verdict struct {
	State     string
	Alive     bool
	LockHeld  *bool
	KeyShared bool
}

// Verdicts reads every instance's verdict as the observer.
func (f *Fixture) Verdicts(t *testing.T) map[uuid.UUID]verdict {
	t.Helper()
	sub, err := f.Source.Verdicts("$1::interval", "$2::interval", "$3::text")
	if err != nil {
		t.Fatal(err)
	}
	rows, err := f.Observer.Query(ctxT(t), `SELECT v.instance_id, v.state, v.alive, v.lock_held, v.key_shared FROM `+sub+` v`,
		f.Source.StaleThreshold, f.Source.DefinitiveDeadCutoff, f.Source.LockKeyPrefix)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uuid.UUID]verdict{}
	for rows.Next() {
		var id uuid.UUID
		var v verdict
		if err := rows.Scan(&id, &v.State, &v.Alive, &v.LockHeld, &v.KeyShared); err != nil {
			t.Fatal(err)
		}
		out[id] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// CollidingIDs returns two instance ids whose Whizbang lock keys are equal: a 32-bit key
// makes such pairs easy to find among a few hundred thousand ids.
func (f *Fixture) CollidingIDs(t *testing.T) (uuid.UUID, uuid.UUID) {
	t.Helper()
	for range 5 {
		var a, b *uuid.UUID
		err := f.DB.Pool(t, 1).QueryRow(ctxT(t), `SELECT ids[1], ids[2] FROM (
				SELECT array_agg(id) AS ids FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, 300000)) g
				 GROUP BY hashtext($1 || id::text) HAVING count(*) > 1 LIMIT 1) c`, f.Source.LockKeyPrefix).Scan(&a, &b)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		return *a, *b
	}
	t.Fatal("no two of 1,500,000 random ids share a 32-bit key")
	return uuid.Nil, uuid.Nil
}

// One instance walks through every state Whizbang's rows can be in, and the verdict
// follows at each step, read by a role that can only SELECT.
func TestVerdictWalksThroughTheStates(t *testing.T) {
	f := NewFixture(t)
	src := f.Source
	id := uuid.New()
	steps := []struct {
		name  string
		do    func()
		state string
		alive bool
		held  bool
	}{
		{"registered, lock held, fresh heartbeat", func() {
			f.Register(t, id, "orders", 0)
			if !f.Claim(t, id) {
				t.Fatal("claim failed")
			}
		}, "alive", true, true},
		{"lock held, heartbeat at the slow cadence", func() { f.Beat(t, id, src.HeartbeatSlowInterval+time.Second) }, "alive", true, true},
		{"lock held, heartbeat stale", func() { f.Beat(t, id, src.StaleThreshold+time.Second) }, "lock_only", true, true},
		{"lock held, heartbeat past the definitive-dead cutoff (hung)", func() { f.Beat(t, id, src.DefinitiveDeadCutoff+time.Second) }, "zombie", false, true},
		{"crashed: lock gone, heartbeat old", func() { f.Crash(t, id) }, "stale", false, false},
		{"heartbeat-only mode, fresh", func() { f.Beat(t, id, time.Second) }, "heartbeat_only", true, false},
		{"heartbeat-only mode, stale", func() { f.Beat(t, id, src.StaleThreshold+time.Second) }, "stale", false, false},
		{"back: lock and heartbeat", func() {
			f.Beat(t, id, 0)
			if !f.Claim(t, id) {
				t.Fatal("claim failed")
			}
		}, "alive", true, true},
	}
	for _, s := range steps {
		s.do()
		v, ok := f.Verdicts(t)[id]
		if !ok {
			t.Fatalf("%s: no verdict for the instance", s.name)
		}
		if v.State != s.state || v.Alive != s.alive || v.LockHeld == nil || *v.LockHeld != s.held || v.KeyShared {
			t.Fatalf("%s: got state %s, alive %v, lock held %v, key shared %v; want %s, %v, %v, false",
				s.name, v.State, v.Alive, deref(v.LockHeld), v.KeyShared, s.state, s.alive, s.held)
		}
	}
}

// Locks that are not Whizbang's alive lock of an instance do not count: the two-int4
// lock on the key's halves, a shared lock on the key, and the key in another database.
func TestOnlyTheExactLockCounts(t *testing.T) {
	f := NewFixture(t)
	id := uuid.New()
	f.Register(t, id, "orders", 0)
	c := f.DB.Conn(t)
	var key int64
	if err := c.QueryRow(ctxT(t), `SELECT hashtext($1 || $2::text)::bigint`, f.Source.LockKeyPrefix, id).Scan(&key); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctxT(t), `SELECT pg_advisory_lock($1::int4, $2::int4), pg_advisory_lock_shared($3)`,
		int32(key>>32), int32(key), key); err != nil {
		t.Fatal(err)
	}
	other := pgtest.NewDBOn(t, f.DB.Server)
	if _, err := other.Conn(t).Exec(ctxT(t), `SELECT pg_advisory_lock($1)`, key); err != nil {
		t.Fatal(err)
	}
	if v := f.Verdicts(t)[id]; v.State != "heartbeat_only" || deref(v.LockHeld) {
		t.Fatalf("with only look-alike locks: got %s, lock held %v; want heartbeat_only, not held", v.State, deref(v.LockHeld))
	}
}

// Two instance ids with the same 32-bit key: the lock cannot say which of them holds it,
// so both are judged by their heartbeats and reported as sharing a key.
//   - both alive: the first holds the lock, the second's claim fails (Whizbang carries
//     on with its heartbeat); both are heartbeat_only, alive.
//   - the holder hangs (its session keeps the lock) while its twin beats: the hung one
//     goes stale by its heartbeat instead of hiding behind the lock as lock_only, then
//     zombie, until the cutoff.
func TestCollidingKeys(t *testing.T) {
	f := NewFixture(t)
	a, b := f.CollidingIDs(t)
	f.Register(t, a, "orders", 0)
	f.Register(t, b, "orders", 0)
	if !f.Claim(t, a) {
		t.Fatal("claim failed")
	}
	if f.Claim(t, b) {
		t.Fatal("test setup: the twin got the lock its key shares")
	}
	vs := f.Verdicts(t)
	for _, id := range []uuid.UUID{a, b} {
		if v := vs[id]; v.State != "heartbeat_only" || !v.Alive || !v.KeyShared || !deref(v.LockHeld) {
			t.Fatalf("both alive, %s: got %+v; want heartbeat_only, alive, key shared, lock held", id, v)
		}
	}
	f.Beat(t, a, f.Source.StaleThreshold+time.Second)
	vs = f.Verdicts(t)
	if v := vs[a]; v.State != "stale" || v.Alive {
		t.Fatalf("hung holder sharing its key: got %+v; want stale, dead", v)
	}
	if v := vs[b]; v.State != "heartbeat_only" || !v.Alive {
		t.Fatalf("its live twin: got %+v; want heartbeat_only, alive", v)
	}
	// A third instance with a key of its own is judged by its lock as usual.
	c := uuid.New()
	f.Register(t, c, "orders", f.Source.StaleThreshold+time.Second)
	if !f.Claim(t, c) {
		t.Fatal("claim failed")
	}
	if v := f.Verdicts(t)[c]; v.State != "lock_only" || v.KeyShared {
		t.Fatalf("an instance with a key of its own: got %+v; want lock_only, key not shared", v)
	}
}

func TestValidateNamesTheField(t *testing.T) {
	for field, mutate := range map[string]func(*whizbang.Source){
		"Schema":                func(s *whizbang.Source) { s.Schema = "" },
		"LockKeyPrefix":         func(s *whizbang.Source) { s.LockKeyPrefix = "" },
		"HeartbeatInterval":     func(s *whizbang.Source) { s.HeartbeatInterval = 0 },
		"HeartbeatSlowInterval": func(s *whizbang.Source) { s.HeartbeatSlowInterval = time.Second },
		"StaleThreshold":        func(s *whizbang.Source) { s.StaleThreshold = s.HeartbeatSlowInterval },
		"DefinitiveDeadCutoff":  func(s *whizbang.Source) { s.DefinitiveDeadCutoff = s.StaleThreshold },
		"Prefix":                func(s *whizbang.Source) { s.Prefix = string(make([]byte, 60)) },
	} {
		s := whizbang.Defaults()
		mutate(&s)
		var fe *whizbang.FieldError
		if err := s.Validate(); !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s out of range: got %v, want a FieldError for %s", field, err, field)
		}
	}
	if err := whizbang.Defaults().Validate(); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
}

func deref(b *bool) bool { return b != nil && *b }
