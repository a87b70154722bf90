// Package testdb builds, on pgtest's databases, what the tests of several packages start
// from: the liveness objects migrated, a SQL_ASCII database (which hands out whatever
// bytes were stored); and it reads what they check against: every instance's state by the
// one verdict, and the backend that holds an instance's alive lock. A session with an
// application_name of its own is pgtest's DB.ConnAs, a count on a connection of its own
// is DB.QueryInt. Only tests import it; it holds no SQL the product sends.
package testdb

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// onOwnConn runs f on a connection of its own to dsn, within the given time, and closes
// the connection before it returns, so that a test counting backends finds none left
// behind. It fails the test on f's error, prefixed with what.
func onOwnConn(t testing.TB, dsn string, within time.Duration, what string, f func(context.Context, *pgx.Conn) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := f(ctx, conn); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Migrate applies every migration in schema on a connection of its own.
func Migrate(t testing.TB, dsn, schema string) {
	t.Helper()
	onOwnConn(t, dsn, 60*time.Second, "migrations", func(ctx context.Context, c *pgx.Conn) error {
		_, err := migrations.Apply(ctx, c, schema)
		return err
	})
}

// Migrated is a fresh database (pgtest.NewDB) with every migration applied in the default
// schema.
func Migrated(t testing.TB) *pgtest.DB {
	t.Helper()
	db := pgtest.NewDB(t)
	Migrate(t, db.DSN, migrations.DefaultSchema)
	return db
}

// MigratedPool is Migrated with a pool of maxConns connections on the database, closed
// when the test ends.
func MigratedPool(t testing.TB, maxConns int32) (*pgtest.DB, *pgxpool.Pool) {
	t.Helper()
	db := Migrated(t)
	return db, db.Pool(t, maxConns)
}

// Querier is what States reads through: a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// States is the state of every instance in the default schema, by instance id, as
// instance_states() judges it now: what a view must show.
func States(t testing.TB, q Querier) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := q.Query(ctx, `SELECT instance_id::text, state FROM `+pgx.Identifier{migrations.DefaultSchema}.Sanitize()+`.instance_states()`)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for rows.Next() {
		var id, state string
		if err := rows.Scan(&id, &state); err != nil {
			t.Fatal(err)
		}
		states[id] = state
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return states
}

// AliveLockHolder returns the pid of the backend that holds the instance's alive lock in
// the default schema, or 0.
func AliveLockHolder(t testing.TB, ctx context.Context, pool *pgxpool.Pool, id uuid.UUID) int {
	t.Helper()
	var pid int
	err := pool.QueryRow(ctx, `SELECT coalesce(max(l.pid), 0) FROM liveness.bigint_advisory_locks l
	                            WHERE l.granted
	                              AND l.classid = liveness.lock_key_classid(liveness.instance_lock_key($1))
	                              AND l.objid = liveness.lock_key_objid(liveness.instance_lock_key($1))`, id).Scan(&pid)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}
