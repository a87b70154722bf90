package store_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

const schemaFile = "schema.sql"

// schemaFileMajor is the PostgreSQL major schema.sql is read back from: the default
// major of the test runs (Debian's), whose deparsed view and function bodies it holds.
const schemaFileMajor = 15

const regenerate = "go test ./internal/store -run TestSchemaFileIsCurrent -update (on PostgreSQL 15: PG_LIVENESS_TEST_PG_MAJOR unset)"

// schema.sql is every object of the schema as the migrations leave it, read back from a
// server that applied them all, so that nobody has to replay the migrations to read
// today's instance_state_verdicts. On its major the file must equal what the server
// shows; on the others, every object must exist with the same columns, constraints,
// indexes and signatures (their bodies are deparsed by each major in its own way).
func TestSchemaFileIsCurrent(t *testing.T) {
	_, pool := testdb.MigratedPool(t, 2)
	conn, err := pool.Acquire(testutil.Context(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var major int
	if err := conn.QueryRow(testutil.Context(t, 30*time.Second), `SELECT current_setting('server_version_num')::int / 10000`).Scan(&major); err != nil {
		t.Fatal(err)
	}
	// The header names the file's major whatever this server's: on another the bodies
	// are left out of the comparison.
	got, err := dumpSchema(testutil.Context(t, 30*time.Second), conn.Conn(), store.DefaultSchema, schemaFileMajor)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if major != schemaFileMajor {
			t.Fatalf("schema.sql is read back from PostgreSQL %d, this server is %d: %s", schemaFileMajor, major, regenerate)
		}
		if err := os.WriteFile(schemaFile, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatalf("%v: %s", err, regenerate)
	}
	want := string(b)
	if major != schemaFileMajor {
		got, want = structure(got), structure(want)
	}
	if got != want {
		t.Fatalf("internal/store/schema.sql is not the schema the migrations make on PostgreSQL %d; run %s\n%s", major, regenerate, firstDifference(want, got))
	}
}

// structure keeps what every major deparses alike: the tables, sequences and indexes
// whole, and of a view or a function its first line.
func structure(dump string) string {
	var out []string
	body := false
	for _, line := range strings.Split(dump, "\n") {
		switch {
		case strings.HasPrefix(line, "CREATE VIEW "), strings.HasPrefix(line, "CREATE OR REPLACE FUNCTION "):
			out, body = append(out, line), true
		case strings.HasPrefix(line, "-- "), line == "":
			body = false
			out = append(out, line)
		case !body:
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

func firstDifference(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := range max(len(w), len(g)) {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d:\n  file:   %s\n  server: %s", i+1, wl, gl)
		}
	}
	return ""
}

// dumpSchema reads the schema's objects back from the catalog, in a fixed order: the
// schema, its sequences, tables (columns, constraints, then indexes), views and
// functions, each group by name. With an empty search_path every name of ours is shown
// qualified.
func dumpSchema(ctx context.Context, c *pgx.Conn, schema string, major int) (string, error) {
	if _, err := c.Exec(ctx, `SET search_path = ''`); err != nil {
		return "", err
	}
	last := migrations.All()[len(migrations.All())-1]
	var b strings.Builder
	var create string
	if err := c.QueryRow(ctx, `SELECT format('CREATE SCHEMA %I;', $1::text)`, schema).Scan(&create); err != nil {
		return "", err
	}
	fmt.Fprintf(&b, `-- The schema as it stands after the last migration, %04d_%s: every table, sequence,
-- index, view, trigger and function with its body, read back from the catalog of PostgreSQL %d
-- once every migration is applied. The migrations (internal/store/schema/) are the history,
-- this is the result; it is ordered by kind for reading, not by dependency for running.
-- Generated and checked by TestSchemaFileIsCurrent; do not edit by hand:
--   %s

%s
`, last.Version, last.Name, major, regenerate, create)
	section := func(title, sql string, args ...any) error {
		rows, err := c.Query(ctx, sql, args...)
		if err != nil {
			return fmt.Errorf("%s: %w", title, err)
		}
		defs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("%s: %w", title, err)
		}
		if len(defs) == 0 {
			return nil
		}
		fmt.Fprintf(&b, "\n-- %s\n", title)
		for _, d := range defs {
			b.WriteString("\n" + strings.TrimRight(d, "\n") + "\n")
		}
		return nil
	}
	steps := []struct{ title, sql string }{
		{"Sequences", `
SELECT format('CREATE SEQUENCE %s AS %s START %s INCREMENT %s MINVALUE %s MAXVALUE %s CACHE %s%s;', c.oid::regclass,
              format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, s.seqmin, s.seqmax, s.seqcache,
              CASE WHEN s.seqcycle THEN ' CYCLE' ELSE '' END)
       || coalesce((SELECT format(E'\nALTER SEQUENCE %s OWNED BY %s.%I;', c.oid::regclass, d.refobjid::regclass, a.attname)
                      FROM pg_depend d JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                     WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'a'), '')
  FROM pg_class c JOIN pg_sequence s ON s.seqrelid = c.oid
 WHERE c.relnamespace = $1::regnamespace
 ORDER BY c.relname`},
		{"Tables", `
SELECT format(E'CREATE TABLE %s (\n%s\n);', c.oid::regclass, array_to_string(
         ARRAY(SELECT format('    %I %s%s%s%s', a.attname, format_type(a.atttypid, a.atttypmod),
                             CASE WHEN a.attgenerated = 's' THEN ' GENERATED ALWAYS AS (' || pg_get_expr(d.adbin, d.adrelid) || ') STORED' END,
                             CASE WHEN a.attnotnull THEN ' NOT NULL' END,
                             CASE WHEN a.attgenerated = '' AND d.adbin IS NOT NULL THEN ' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid) END)
                 FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                ORDER BY a.attnum)
         || ARRAY(SELECT format('    CONSTRAINT %I %s', k.conname, pg_get_constraintdef(k.oid))
                    FROM pg_constraint k WHERE k.conrelid = c.oid AND k.contype <> 'n' ORDER BY k.conname), -- NOT NULL is on its column (18 lists it here too)
         E',\n'))
       || coalesce(E'\n' || (SELECT string_agg(pg_get_indexdef(x.indexrelid) || ';', E'\n' ORDER BY i.relname)
                               FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
                              WHERE x.indrelid = c.oid
                                AND NOT EXISTS (SELECT FROM pg_constraint k WHERE k.conindid = x.indexrelid)), '')
  FROM pg_class c
 WHERE c.relnamespace = $1::regnamespace AND c.relkind = 'r'
 ORDER BY c.relname`},
		{"Views", `
SELECT format(E'CREATE VIEW %s AS\n%s', c.oid::regclass, pg_get_viewdef(c.oid, true))
  FROM pg_class c
 WHERE c.relnamespace = $1::regnamespace AND c.relkind = 'v'
 ORDER BY c.relname`},
		{"Triggers", `
SELECT pg_get_triggerdef(t.oid, true) || ';'
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE c.relnamespace = $1::regnamespace AND NOT t.tgisinternal
 ORDER BY c.relname, t.tgname`},
		{"Functions", `
SELECT pg_get_functiondef(p.oid) || ';'
  FROM pg_proc p
 WHERE p.pronamespace = $1::regnamespace
 ORDER BY p.proname, pg_get_function_identity_arguments(p.oid)`},
		{"Comments", `
SELECT format('COMMENT ON %s IS %L;', pg_describe_object(d.classoid, d.objoid, d.objsubid), d.description)
  FROM pg_description d
 WHERE (d.classoid = 'pg_class'::regclass AND d.objoid IN (SELECT oid FROM pg_class WHERE relnamespace = $1::regnamespace))
    OR (d.classoid = 'pg_proc'::regclass AND d.objoid IN (SELECT oid FROM pg_proc WHERE pronamespace = $1::regnamespace))
 ORDER BY 1`},
	}
	for _, s := range steps {
		if err := section(s.title, s.sql, pgx.Identifier{schema}.Sanitize()); err != nil {
			return "", err
		}
	}
	// Trailing spaces of the server's deparsed text would make the file's lines differ
	// from what an editor keeps.
	return regexp.MustCompile(`(?m)[ \t]+$`).ReplaceAllString(b.String(), ""), nil
}
