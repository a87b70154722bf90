// Package migrations applies the SQL objects pg_liveness_exporter and the liveness package
// rely on to a configurable schema, and reads where a schema stands. The objects are the
// data layer's ordered files, internal/store/schema/NNNN_name.sql (the migrations, which
// this package embeds through the data layer), and internal/store/schema.sql shows them as
// they stand after the last one; every statement this package sends around them is the
// data layer's too (internal/store/sql/migrate.sql and schema_state.sql).
//
// Each file runs in its own transaction, serialized across processes by
// pg_advisory_xact_lock, and is recorded in <schema>.schema_migrations; applying again is
// a no-op. The schema name is only ever used as a quoted identifier or a bind parameter,
// never pasted into SQL.
//
// # Compatibility across versions
//
// Every file states, in a header line among its leading comments,
//
//	-- compatible-from: N
//
// the oldest binary schema version (the Latest of a binary) that still works with a
// database once this file is applied. A migration that only adds nullable columns,
// tables, views or functions states 1; one that drops or changes what older binaries use
// states its own version. The line is required: a file without it does not load. Applying
// a file records N in schema_migrations.compatible_from.
//
// The database serves binaries from the largest N of its applied migrations on. Reading
// where a database stands (ReadState) needs only SELECT on schema_migrations, and Apply
// sends no DDL when nothing is to be done. A binary whose Latest is below the database's
// version runs normally when the database still serves it, and gets ErrDatabaseNewer
// otherwise. During a rolling upgrade old pods therefore keep working as long as every
// new migration is additive.
package migrations

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// DefaultSchema is the schema the objects live in unless configured otherwise.
const DefaultSchema = store.DefaultSchema

// Migration is one embedded SQL file.
type Migration struct {
	Version int
	Name    string
	// SQL is the file's text; empty in Embedded, which reads it from the file when it
	// applies it (All has it).
	SQL string
	// CompatibleFrom is the oldest binary schema version that still works once this
	// migration is applied, from the file's "-- compatible-from: N" line.
	CompatibleFrom int

	src  fs.FS // where SQL is read from when it was left out; nil when SQL is set
	file string
}

// text is the migration's SQL, read from its file when the set was loaded without it.
func (m Migration) text() (string, error) {
	if m.src == nil {
		return m.SQL, nil
	}
	b, err := fs.ReadFile(m.src, m.file)
	return string(b), err
}

var (
	fileName       = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.sql$`)
	compatibleLine = regexp.MustCompile(`^--\s*compatible-from:\s*(\d+)\s*$`)
)

// compatibleFrom finds the "-- compatible-from: N" line among the leading comment lines.
func compatibleFrom(name, sql string, version int) (int, error) {
	for _, line := range strings.Split(sql, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if !strings.HasPrefix(line, "--") {
			break
		}
		if m := compatibleLine.FindStringSubmatch(line); m != nil {
			n, err := strconv.Atoi(m[1])
			if err != nil || n < 1 || n > version {
				return 0, fmt.Errorf("migration file %q: compatible-from %s must be between 1 and its own version %d", name, m[1], version)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("migration file %q has no \"-- compatible-from: N\" line among its leading comments: "+
		"state the oldest binary schema version that still works once it is applied (1 for additions only, %d when it breaks older binaries)", name, version)
}

// all is the embedded set without the files' text (78 KB that only applying needs).
var all = mustLoad(store.MigrationFiles(), false)

func mustLoad(fsys fs.FS, withSQL bool) []Migration {
	ms, err := load(fsys, withSQL)
	if err != nil {
		panic(err)
	}
	return ms
}

// load reads and checks every file; withSQL keeps the files' text, or else where to read
// it again.
func load(fsys fs.FS, withSQL bool) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
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
		b, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, err
		}
		cf, err := compatibleFrom(e.Name(), string(b), v)
		if err != nil {
			return nil, err
		}
		mig := Migration{Version: v, Name: m[2], CompatibleFrom: cf, src: fsys, file: e.Name()}
		if withSQL {
			mig.SQL, mig.src, mig.file = string(b), nil, ""
		}
		ms = append(ms, mig)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i, m := range ms {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration versions must run 1, 2, 3… without gaps; found %04d at position %d", m.Version, i+1)
		}
	}
	return ms, nil
}

// Set is an ordered list of migrations without gaps, starting at 1. Embedded is this
// binary's; tests build others with LoadSet.
type Set []Migration

// Embedded is the set of migrations compiled into this binary.
var Embedded = Set(all)

// LoadSet reads NNNN_name.sql files from fsys's root, as the embedded set is read.
func LoadSet(fsys fs.FS) (Set, error) {
	ms, err := load(fsys, true)
	return Set(ms), err
}

// All returns the embedded migrations in order, with their SQL.
func All() []Migration { return mustLoad(store.MigrationFiles(), true) }

// Latest is the highest version this binary knows.
func Latest() int { return Embedded.Latest() }

// Latest is the highest version of the set.
func (s Set) Latest() int { return s[len(s)-1].Version }

// ErrDatabaseNewer is returned when the schema has migrations this binary does not know
// and no longer serves binaries at this binary's version.
var ErrDatabaseNewer = errors.New("database schema is newer than this binary and no longer compatible with it")

// State is where a schema stands.
type State struct {
	// Version is the highest applied migration, 0 when none is.
	Version int
	// CompatibleFrom is the oldest binary schema version the schema still serves: the
	// largest compatible-from of its applied migrations (0 when none is applied).
	CompatibleFrom int
}

// Serves reports whether a binary whose Latest is binary can run against the schema
// (once the migrations it knows are applied).
func (st State) Serves(binary int) bool { return st.CompatibleFrom <= binary }

// ReadState reads the schema's migrations. It needs USAGE on the schema and SELECT on
// schema_migrations, nothing else, and sends no DDL. Rows recorded before
// compatible_from existed take the value of the set's file of that version (a version
// the set does not know counts as compatible from itself).
func (s Set) ReadState(ctx context.Context, q Querier, schema string) (State, error) {
	var exists bool
	if err := q.QueryRow(ctx, store.SchemaState.In(schema).SQL, pgx.Identifier{schema, "schema_migrations"}.Sanitize()).Scan(&exists); err != nil {
		return State{}, fmt.Errorf("migrations: find %s.schema_migrations: %w", pgx.Identifier{schema}.Sanitize(), err)
	}
	if !exists {
		return State{}, nil
	}
	rows, err := q.Query(ctx, store.SchemaMigrations.In(schema).SQL)
	if err != nil {
		return State{}, fmt.Errorf("migrations: read %s.schema_migrations: %w", pgx.Identifier{schema}.Sanitize(), err)
	}
	var st State
	var version int
	var cf *int
	_, err = pgx.ForEachRow(rows, []any{&version, &cf}, func() error {
		st.Version = max(st.Version, version)
		c := version
		switch {
		case cf != nil:
			c = *cf
		case version >= 1 && version <= len(s):
			c = s[version-1].CompatibleFrom
		}
		st.CompatibleFrom = max(st.CompatibleFrom, c)
		return nil
	})
	if err != nil {
		return State{}, fmt.Errorf("migrations: read %s.schema_migrations: %w", pgx.Identifier{schema}.Sanitize(), err)
	}
	return st, nil
}

// ReadState reads the schema's state as the embedded set sees it.
func ReadState(ctx context.Context, q Querier, schema string) (State, error) {
	return Embedded.ReadState(ctx, q, schema)
}

// Querier is satisfied by *pgx.Conn, *pgxpool.Pool and *pgxpool.Conn.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// newerError explains a schema this binary cannot serve.
func (s Set) newerError(schema string, st State) error {
	return fmt.Errorf("%w: schema %s is at migration version %d and serves binaries from schema version %d on, but this binary knows versions up to %d; upgrade pg_liveness_exporter or use another --db.schema",
		ErrDatabaseNewer, pgx.Identifier{schema}.Sanitize(), st.Version, st.CompatibleFrom, s.Latest())
}

// Beginner is satisfied by *pgx.Conn, *pgxpool.Pool and *pgxpool.Conn.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Apply brings schema up to Latest with the embedded migrations; see Set.Apply.
func Apply(ctx context.Context, db Beginner, schema string) ([]int, error) {
	return Embedded.Apply(ctx, db, schema)
}

// Apply brings schema up to the set's Latest and returns the versions it applied (none
// when the schema is current). It first reads the schema's state: when nothing is to be
// done it needs no privilege beyond reading schema_migrations and sends no DDL. A schema
// newer than the set that still serves it is left alone (nil error); one that does not
// gives ErrDatabaseNewer. It is safe to call concurrently from many processes.
func (s Set) Apply(ctx context.Context, db Beginner, schema string) ([]int, error) {
	if err := store.ValidateSchemaName(schema); err != nil {
		return nil, fmt.Errorf("migrations: schema name %w", err)
	}
	if q, ok := db.(Querier); ok {
		st, err := s.ReadState(ctx, q, schema)
		if err != nil {
			return nil, err
		}
		if st.Version >= s.Latest() {
			if !st.Serves(s.Latest()) {
				return nil, s.newerError(schema, st)
			}
			return nil, nil
		}
	}
	var applied []int
	for _, m := range s {
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
	ident := pgx.Identifier{schema}.Sanitize() // for messages and the search_path
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("migrations: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	// One lock per schema name, taken before anything else, serializes runners.
	if _, err := tx.Exec(ctx, store.MigrateLock.In(schema).SQL, schema); err != nil {
		return false, fmt.Errorf("migrations: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, store.MigrateSchema.In(schema).SQL); err != nil {
		return false, fmt.Errorf("migrations: create schema %s: %w", ident, err)
	}
	if _, err := tx.Exec(ctx, store.MigrateBookkeeping.In(schema).SQL); err != nil {
		return false, fmt.Errorf("migrations: create %s.schema_migrations: %w", ident, err)
	}
	var done bool
	if err := tx.QueryRow(ctx, store.MigrateApplied.In(schema).SQL, m.Version).Scan(&done); err != nil {
		return false, fmt.Errorf("migrations: read versions: %w", err)
	}
	if done { // another process applied it meanwhile
		return false, tx.Commit(ctx)
	}
	// Objects in the file are unqualified; they land in the schema.
	if _, err := tx.Exec(ctx, store.MigrateSearchPath.In(schema).SQL, ident+", pg_catalog, pg_temp"); err != nil {
		return false, fmt.Errorf("migrations: set search_path: %w", err)
	}
	sql, err := m.text()
	if err != nil {
		return false, fmt.Errorf("migrations: %04d_%s: %w", m.Version, m.Name, err)
	}
	if _, err := tx.Exec(ctx, sql); err != nil {
		return false, fmt.Errorf("migrations: %04d_%s: %w", m.Version, m.Name, err)
	}
	if _, err := tx.Exec(ctx, store.MigrateRecord.In(schema).SQL,
		m.Version, m.Name, m.CompatibleFrom); err != nil {
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
	if err := q.QueryRow(ctx, store.SchemaState.In(schema).SQL, pgx.Identifier{schema, "schema_migrations"}.Sanitize()).Scan(&exists); err != nil {
		return 0, err
	}
	if !exists {
		return 0, nil
	}
	var v int
	err := q.QueryRow(ctx, store.SchemaVersion.In(schema).SQL).Scan(&v)
	return v, err
}
