package migrations_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/migrationstest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestApplyTwiceIsNoOp(t *testing.T) {
	ctx := testutil.Context(t, 60*time.Second)
	db := pgtest.NewDB(t)
	pool := db.Pool(t, 2)

	applied, err := migrations.Apply(ctx, pool, migrations.DefaultSchema)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != migrations.Latest() {
		t.Fatalf("first Apply applied %v, want all %d", applied, migrations.Latest())
	}
	applied, err = migrations.Apply(ctx, pool, migrations.DefaultSchema)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != 0 {
		t.Fatalf("second Apply applied %v, want none", applied)
	}
	v, err := migrations.Version(ctx, pool, migrations.DefaultSchema)
	if err != nil || v != migrations.Latest() {
		t.Fatalf("Version = %d, %v; want %d", v, err, migrations.Latest())
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM liveness.schema_migrations`).Scan(&n); err != nil || n != migrations.Latest() {
		t.Fatalf("schema_migrations has %d rows (%v), want %d", n, err, migrations.Latest())
	}
}

func TestConcurrentApplyAppliesOnce(t *testing.T) {
	ctx := testutil.Context(t, 60*time.Second)
	db := pgtest.NewDB(t)
	const runners = 5
	var wg sync.WaitGroup
	results := make([][]int, runners)
	errs := make([]error, runners)
	for i := range runners {
		// One connection each: separate sessions, as separate processes would have.
		conn := db.Conn(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = migrations.Apply(ctx, conn, "concurrent")
		}()
	}
	wg.Wait()
	total := 0
	for i := range runners {
		if errs[i] != nil {
			t.Fatalf("runner %d: %v", i, errs[i])
		}
		total += len(results[i])
	}
	if total != migrations.Latest() {
		t.Fatalf("runners applied %d migrations in all (%v), want %d", total, results, migrations.Latest())
	}
}

func TestNewerDatabaseIsRefused(t *testing.T) {
	ctx := testutil.Context(t, 60*time.Second)
	db, pool := testdb.MigratedPool(t, 2)
	future := migrations.Latest() + 1
	db.Exec(t, `INSERT INTO liveness.schema_migrations (version, name) VALUES ($1, 'from_the_future')`, future)
	_, err := migrations.Apply(ctx, pool, "liveness")
	if !errors.Is(err, migrations.ErrDatabaseNewer) {
		t.Fatalf("Apply on a newer database: %v, want ErrDatabaseNewer", err)
	}
	for _, want := range []string{`"liveness"`, "upgrade", "--db.schema"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

func TestSchemaNameIsAnIdentifierNotSQL(t *testing.T) {
	ctx := testutil.Context(t, 60*time.Second)
	db := pgtest.NewDB(t)
	pool := db.Pool(t, 2)
	db.Exec(t, `CREATE TABLE public.victim (x int)`)
	schema := `We"ird; DROP TABLE public.victim; --`
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	var victim, instances bool
	err := pool.QueryRow(ctx, `SELECT to_regclass('public.victim') IS NOT NULL, to_regclass($1) IS NOT NULL`,
		pgx.Identifier{schema, "instances"}.Sanitize()).Scan(&victim, &instances)
	if err != nil {
		t.Fatal(err)
	}
	if !victim {
		t.Fatal("the schema name was executed as SQL: public.victim is gone")
	}
	if !instances {
		t.Fatal("instances was not created in the oddly named schema")
	}
	// Its functions resolve their own schema whatever the caller's search_path.
	var alive bool
	err = pool.QueryRow(ctx, `SELECT `+pgx.Identifier{schema, "is_instance_alive"}.Sanitize()+`(gen_random_uuid(), 30)`).Scan(&alive)
	if err != nil || alive {
		t.Fatalf("is_instance_alive in odd schema = %v, %v", alive, err)
	}
}

func TestEmptySchemaRefused(t *testing.T) {
	if _, err := migrations.Apply(context.Background(), nil, ""); err == nil {
		t.Fatal("Apply accepted an empty schema name")
	}
}

// Names PostgreSQL would cut or refuses are refused before any statement is sent.
func TestApplyRefusesBadSchemaNames(t *testing.T) {
	// store.ValidateSchemaName is tested with every kind of bad name; here, that Apply
	// asks it first.
	for _, bad := range []string{"", strings.Repeat("s", store.MaxIdentifierLength+1), "pg_liveness"} {
		if _, err := migrations.Apply(context.Background(), nil, bad); err == nil {
			t.Errorf("Apply accepted schema %q", bad)
		}
	}
}

// A later release's migration that states it still serves this binary's version leaves
// this binary working; one that does not is refused with ErrDatabaseNewer.
func TestNewerSchemaServesOlderBinaryWhenCompatible(t *testing.T) {
	for _, tc := range []struct {
		name       string
		compatFrom int
		serves     bool
	}{
		{"additive", 1, true},
		{"breaking", migrations.Latest() + 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testutil.Context(t, 60*time.Second)
			db := pgtest.NewDB(t)
			pool := db.Pool(t, 2)
			future := migrationstest.Future(t, tc.compatFrom)
			if applied, err := future.Apply(ctx, pool, "liveness"); err != nil || len(applied) != future.Latest() {
				t.Fatalf("future set: applied %v, %v", applied, err)
			}
			st, err := migrations.ReadState(ctx, pool, "liveness")
			if err != nil {
				t.Fatal(err)
			}
			// The schema serves what every migration in it serves: the newest compatible-from.
			want := tc.compatFrom
			for _, m := range migrations.All() {
				want = max(want, m.CompatibleFrom)
			}
			if st.Version != migrations.Latest()+1 || st.CompatibleFrom != want {
				t.Fatalf("state %+v, want version %d compatible from %d", st, migrations.Latest()+1, want)
			}
			if st.Serves(migrations.Latest()) != tc.serves {
				t.Fatalf("Serves(%d) = %v", migrations.Latest(), !tc.serves)
			}
			applied, err := migrations.Apply(ctx, pool, "liveness")
			if tc.serves && (err != nil || len(applied) != 0) {
				t.Fatalf("this binary against a compatible newer schema: applied %v, %v", applied, err)
			}
			if !tc.serves && !errors.Is(err, migrations.ErrDatabaseNewer) {
				t.Fatalf("this binary against an incompatible newer schema: %v, want ErrDatabaseNewer", err)
			}
		})
	}
}

// A schema that is current needs no privilege but reading schema_migrations: a role
// without CREATE on the database applies nothing and succeeds.
func TestCurrentSchemaNeedsNoCreatePrivilege(t *testing.T) {
	ctx := testutil.Context(t, 60*time.Second)
	db := testdb.Migrated(t)
	reader := pgx.Identifier{"reader_" + db.Name}.Sanitize()
	db.Exec(t, `CREATE ROLE `+reader+` LOGIN; REVOKE CREATE ON DATABASE `+pgx.Identifier{db.Name}.Sanitize()+` FROM PUBLIC;
		GRANT USAGE ON SCHEMA liveness TO `+reader+`; GRANT SELECT ON liveness.schema_migrations TO `+reader)
	conn := db.Conn(t)
	if _, err := conn.Exec(ctx, `SET ROLE `+reader); err != nil {
		t.Fatal(err)
	}
	applied, err := migrations.Apply(ctx, conn, "liveness")
	if err != nil || len(applied) != 0 {
		t.Fatalf("Apply on a current schema without CREATE: applied %v, %v", applied, err)
	}
	// The same role cannot apply anything: the check is real.
	if _, err := migrationstest.Future(t, 1).Apply(ctx, conn, "liveness"); err == nil {
		t.Fatal("a role without CREATE applied a migration")
	}
}
