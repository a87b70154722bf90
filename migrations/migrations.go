// Package migrations holds every SQL object pg_liveness_exporter and the liveness package
// rely on, as embedded, ordered SQL files, and applies them to a configurable schema.
//
// Each file runs in its own transaction, serialized across processes by
// pg_advisory_xact_lock, and is recorded in <schema>.schema_migrations; applying again is
// a no-op. A database that is newer than this binary is refused. The schema name is only
// ever used as a quoted identifier or a bind parameter, never pasted into SQL.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

//go:embed sql/*.sql
var files embed.FS

// DefaultSchema is the schema the objects live in unless configured otherwise.
const DefaultSchema = "liveness"

// Migration is one embedded SQL file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

var fileName = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.sql$`)

var all = mustLoad(files)

func mustLoad(fsys fs.FS) []Migration {
	ms, err := load(fsys)
	if err != nil {
		panic(err)
	}
	return ms
}

func load(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, "sql")
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, e := range entries {
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migration file %q is not named NNNN_name.sql", e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		b, err := fs.ReadFile(fsys, path.Join("sql", e.Name()))
		if err != nil {
			return nil, err
		}
		ms = append(ms, Migration{Version: v, Name: m[2], SQL: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i, m := range ms {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration versions must run 1, 2, 3… without gaps; found %04d at position %d", m.Version, i+1)
		}
	}
	return ms, nil
}

// All returns the embedded migrations in order.
func All() []Migration { return append([]Migration(nil), all...) }

// Latest is the highest version this binary knows.
func Latest() int { return all[len(all)-1].Version }

// ErrDatabaseNewer is returned when the schema records a version this binary does not know.
var ErrDatabaseNewer = errors.New("database schema is newer than this binary")

// Beginner is satisfied by *pgx.Conn, *pgxpool.Pool and *pgxpool.Conn.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// MaxIdentifierLength is PostgreSQL's longest identifier in bytes (NAMEDATALEN - 1).
// Longer names are silently cut by the server, so two different names could share one
// schema.
const MaxIdentifierLength = 63

// ValidateSchemaName refuses names PostgreSQL would not keep as given: empty, longer
// than 63 bytes, invalid UTF-8 or holding a NUL byte, or starting with "pg_", which is
// reserved for system schemas (CREATE SCHEMA refuses it, so migrations would never
// succeed).
func ValidateSchemaName(schema string) error {
	switch {
	case schema == "":
		return errors.New("must not be empty")
	case len(schema) > MaxIdentifierLength:
		return fmt.Errorf("is %d bytes long; PostgreSQL keeps only the first %d, so use a shorter name", len(schema), MaxIdentifierLength)
	case !utf8.ValidString(schema) || strings.ContainsRune(schema, 0):
		return errors.New("must be valid UTF-8 without NUL bytes")
	case strings.HasPrefix(schema, "pg_"):
		return errors.New(`must not start with "pg_": PostgreSQL reserves those names for system schemas`)
	}
	return nil
}

// Apply brings schema up to Latest and returns the versions it applied (none when the
// schema is current). It is safe to call concurrently from many processes.
func Apply(ctx context.Context, db Beginner, schema string) ([]int, error) {
	if err := ValidateSchemaName(schema); err != nil {
		return nil, fmt.Errorf("migrations: schema name %w", err)
	}
	var applied []int
	for _, m := range all {
		did, err := applyOne(ctx, db, schema, m)
		if err != nil {
			return applied, err
		}
		if did {
			applied = append(applied, m.Version)
		}
	}
	return applied, nil
}

func applyOne(ctx context.Context, db Beginner, schema string, m Migration) (bool, error) {
	ident := pgx.Identifier{schema}.Sanitize()
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("migrations: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	// One lock per schema name, taken before anything else, serializes runners.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('pg_liveness.migrations:' || $1::text, 0))`, schema); err != nil {
		return false, fmt.Errorf("migrations: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+ident); err != nil {
		return false, fmt.Errorf("migrations: create schema %s: %w", ident, err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+ident+`.schema_migrations (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return false, fmt.Errorf("migrations: create %s.schema_migrations: %w", ident, err)
	}
	var current int
	var done bool
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0), coalesce(bool_or(version = $1), false) FROM `+ident+`.schema_migrations`, m.Version).Scan(&current, &done); err != nil {
		return false, fmt.Errorf("migrations: read versions: %w", err)
	}
	if current > Latest() {
		return false, fmt.Errorf("%w: schema %s is at migration version %d but this binary knows versions up to %d; upgrade pg_liveness_exporter or use another --db.schema",
			ErrDatabaseNewer, ident, current, Latest())
	}
	if done {
		return false, tx.Commit(ctx)
	}
	// Objects in the file are unqualified; they land in the schema.
	if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, ident+", pg_catalog, pg_temp"); err != nil {
		return false, fmt.Errorf("migrations: set search_path: %w", err)
	}
	if _, err := tx.Exec(ctx, m.SQL); err != nil {
		return false, fmt.Errorf("migrations: %04d_%s: %w", m.Version, m.Name, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+ident+`.schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
		return false, fmt.Errorf("migrations: record %04d: %w", m.Version, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("migrations: commit %04d_%s: %w", m.Version, m.Name, err)
	}
	return true, nil
}

// Version returns the highest applied version in schema, 0 when none.
func Version(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, schema string) (int, error) {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{schema, "schema_migrations"}.Sanitize()).Scan(&exists); err != nil {
		return 0, err
	}
	if !exists {
		return 0, nil
	}
	var v int
	err := q.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+pgx.Identifier{schema}.Sanitize()+`.schema_migrations`).Scan(&v)
	return v, err
}
