package store

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
)

// ConfigError is a configuration value the data layer or the exporter's pool refuses.
// Field names the configuration field ("SourceConfig.Whizbang.Timing.StaleThreshold",
// "PoolConfig.MaxConns"), never a flag: a binary maps fields to its flags. The library
// returns the same field and reason as its own liveness.ConfigError (Reader's
// configuration is checked here, under the name "ReaderConfig").
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string { return "liveness: " + e.Field + " " + e.Reason }

// DefaultSchema is where the migrations put the liveness objects unless configured.
const DefaultSchema = defaults.Schema

// Timing is an instance's heartbeat timing, as a source's fallback and a Whizbang
// source's cadence: liveness.Timing, field for field, which converts to it
// (store.Timing(t)), so that the two cannot drift apart without the library failing to
// build. Observers use SourceConfig.Fallback for rows that record no timing (written by
// other software); a Whizbang source carries its services' timing in one, since Whizbang
// records none.
type Timing struct {
	// HeartbeatInterval is the fast cadence: while the alive lock is not held and
	// verified, and always in heartbeat-table-only mode.
	HeartbeatInterval time.Duration
	// HeartbeatSlowInterval is the cadence while the alive lock is held and verified.
	HeartbeatSlowInterval time.Duration
	// StaleThreshold is the heartbeat age past which an instance without its lock is dead.
	StaleThreshold time.Duration
	// DefinitiveDeadCutoff is the heartbeat age past which an instance is dead even with
	// its lock held (a zombie: a hung process, a half-open session).
	DefinitiveDeadCutoff time.Duration
	// LockGrace is how long observers wait, after the alive lock vanished, for the
	// instance to prove life before they call it dead.
	LockGrace time.Duration
}

// The fallback's defaults: the library's.
const (
	DefaultStaleThreshold       = defaults.StaleThreshold
	DefaultDefinitiveDeadCutoff = defaults.DefinitiveDeadCutoff
)

// MaxIdentifierLength is PostgreSQL's longest identifier in bytes (NAMEDATALEN - 1).
// Longer names are silently cut by the server, so two different names could share one
// schema.
const MaxIdentifierLength = 63

// IdentifierKind is what an identifier names, for ValidateIdentifier.
type IdentifierKind int

const (
	// SchemaName: PostgreSQL reserves names starting with "pg_" for system schemas
	// (CREATE SCHEMA refuses them), so no schema of ours, Whizbang's or a leases table's
	// can have one.
	SchemaName IdentifierKind = iota
	// TableName: any name PostgreSQL keeps as given.
	TableName
)

// ValidateIdentifier is the one check of every name the product quotes into SQL from
// its configuration (a schema, a Whizbang table, a leases table): it refuses what
// PostgreSQL would not keep as given and what can only be a typing mistake. That is an
// empty name; one longer than 63 bytes (the server silently cuts it, so two names could
// meet, or the name fails later as "not found"); invalid UTF-8, a NUL byte or another
// control character; and for a schema, the "pg_" prefix. The error is a predicate for
// the caller to put after the name of its field or flag ("must not be empty").
func ValidateIdentifier(kind IdentifierKind, name string) error {
	switch {
	case name == "":
		return errors.New("must not be empty")
	case len(name) > MaxIdentifierLength:
		return fmt.Errorf("is %d bytes long; PostgreSQL keeps only the first %d, so use a shorter name", len(name), MaxIdentifierLength)
	case !utf8.ValidString(name) || strings.ContainsRune(name, 0):
		return errors.New("must be valid UTF-8 without NUL bytes")
	case strings.ContainsFunc(name, unicode.IsControl):
		i := strings.IndexFunc(name, unicode.IsControl)
		r, _ := utf8.DecodeRuneInString(name[i:])
		return fmt.Errorf("must not contain control characters (%U at byte %d)", r, i)
	case kind == SchemaName && strings.HasPrefix(name, "pg_"):
		return errors.New(`must not start with "pg_": PostgreSQL reserves those names for system schemas`)
	}
	return nil
}

// ValidateSchemaName is ValidateIdentifier for a schema.
func ValidateSchemaName(schema string) error { return ValidateIdentifier(SchemaName, schema) }

// Table is a table a user names: "table" or "schema.table" (a leases table). Without a
// Schema the name is looked up in the search_path, as PostgreSQL does.
type Table struct {
	Schema, Name string
}

// ParseTable reads "table" or "schema.table". Each part is checked by
// ValidateIdentifier; errors are predicates that quote s, for the caller to put after
// its field or flag.
func ParseTable(s string) (Table, error) {
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return Table{}, fmt.Errorf(`%q: want "table" or "schema.table"`, s)
	}
	for i, p := range parts {
		kind, what := TableName, "table"
		if i == 0 && len(parts) == 2 {
			kind, what = SchemaName, "schema"
		}
		if p == "" {
			return Table{}, fmt.Errorf(`%q: want "table" or "schema.table"`, s)
		}
		if err := ValidateIdentifier(kind, p); err != nil {
			return Table{}, fmt.Errorf("%q: the %s name %w", s, what, err)
		}
	}
	if len(parts) == 1 {
		return Table{Name: parts[0]}, nil
	}
	return Table{Schema: parts[0], Name: parts[1]}, nil
}

// identifier is the table's parts, its schema's when it has one.
func (t Table) identifier() pgx.Identifier {
	if t.Schema == "" {
		return pgx.Identifier{t.Name}
	}
	return pgx.Identifier{t.Schema, t.Name}
}

// Quoted is the table as a quoted identifier, "schema"."table": as SQL text, or as a
// parameter that to_regclass or ::regclass reads.
func (t Table) Quoted() string { return t.identifier().Sanitize() }

// String is the table as people write it, for messages.
func (t Table) String() string { return strings.Join(t.identifier(), ".") }
