// Package whizbangtest builds a Whizbang database as Whizbang's services leave it, for
// tests of observers that read one.
package whizbangtest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

// Fixture is a Whizbang database as its services leave it: the table from Whizbang's
// documented columns, and alive locks taken the way Whizbang takes them, each from a
// session of its own. The observer connects as a role with only SELECT on the table and
// pg_read_all_stats.
type Fixture struct {
	DB       *pgtest.DB
	Observer *pgxpool.Pool
	// ObserverDSN connects as the observer role.
	ObserverDSN string
	// Source is the Whizbang database as a reader configures it: Whizbang's defaults,
	// every field set, which the fixture's table and locks follow.
	Source store.Whizbang
	locks  map[uuid.UUID]*pgx.Conn
	admin  *pgxpool.Pool
}

func NewFixture(t *testing.T, db *pgtest.DB) *Fixture {
	t.Helper()
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
	dsn := fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable", db.Server.Port, role, pw, db.Name)
	obs := pgtest.Pool(t, dsn, 2)
	return &Fixture{DB: db, Observer: obs, ObserverDSN: dsn, Source: store.DefaultWhizbang(),
		locks: map[uuid.UUID]*pgx.Conn{}, admin: db.Pool(t, 2)}
}

// Reads returns the fixture's source as a reader takes it.
func (f *Fixture) Reads(t testing.TB) *store.Source {
	t.Helper()
	src, err := store.NewSource(store.SourceConfig{Kind: store.SourceWhizbang, Whizbang: f.Source})
	if err != nil {
		t.Fatal(err)
	}
	return src
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
	if err := c.QueryRow(testutil.Context(t, 30*time.Second), `SELECT pg_try_advisory_lock(hashtext($1 || $2::text))`, f.Source.LockKeyPrefix, id).Scan(&ok); err != nil {
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
	if err := c.Close(testutil.Context(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	delete(f.locks, id)
	// The server frees the lock when the backend notices the closed session: wait for it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var held bool
		if err := f.admin.QueryRow(testutil.Context(t, 30*time.Second), `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1
				AND ((classid::bigint << 32) | objid::bigint) = hashtext($1 || $2::text)::bigint)`, f.Source.LockKeyPrefix, id).Scan(&held); err != nil {
			t.Fatal(err)
		}
		if !held {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lock of %s is still held 10 s after its session closed", id)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CollidingIDs returns two instance ids whose Whizbang lock keys are equal: a 32-bit key
// makes such pairs easy to find among a few hundred thousand ids.
func (f *Fixture) CollidingIDs(t *testing.T) (uuid.UUID, uuid.UUID) {
	t.Helper()
	for range 5 {
		var a, b *uuid.UUID
		err := f.admin.QueryRow(testutil.Context(t, 30*time.Second), `SELECT ids[1], ids[2] FROM (
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
