package collector

import (
	"cmp"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// AdvisoryLocksStatement returns the advisory-locks collector's statement for schema
// (the default when empty) and source, with its arguments, so that other views of the
// same data send the same text. Scan its rows by name into AdvisoryLocksRow
// (pgx.RowToStructByName).
func AdvisoryLocksStatement(schema string, source SourceConfig) (string, []any) {
	return advisoryLocksStatement(pgx.Identifier{cmp.Or(schema, liveness.DefaultSchema)}.Sanitize(), source)
}

// AdvisoryLocksRow is one row of the advisory-locks statement, by column name.
type AdvisoryLocksRow struct {
	// Kind is "backends" or "locks".
	Kind string `db:"kind"`
	// Name is, for "backends", the application_name; for "locks", the kind of lock:
	// "alive_lock" (an instance's alive-lock key) or "other".
	Name string `db:"name"`
	// State is, for "backends", the backend state; for "locks", whether the locks are
	// granted: "true" or "false" (waiting).
	State string `db:"state"`
	// Count is how many backends, or locks.
	Count int64 `db:"count"`
	// Holders and Waiters are the backends that hold a granted advisory lock, and that
	// wait for one; IdleHolderMaxSeconds is the longest an idle holder has been idle.
	// All 0 for "locks".
	Holders              int64   `db:"holders"`
	Waiters              int64   `db:"waiters"`
	IdleHolderMaxSeconds float64 `db:"idle_holder_max_seconds"`
}
