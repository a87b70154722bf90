package collector

import (
	"cmp"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// AdvisoryLocksStatement returns the advisory-locks collector's statement for schema
// (the default when empty) and source, with its arguments, so that other views of the
// same data send the same text. Its rows: kind ('backends' or 'locks'), then for
// 'backends' application_name, backend state, backends, of which holding a granted
// advisory lock, of which waiting for one, and the longest an idle holder has been idle
// in seconds; for 'locks' the kind of lock ('alive_lock' or 'other'), granted ('true' or
// 'false'), how many, and three zeros.
func AdvisoryLocksStatement(schema string, source SourceConfig) (string, []any) {
	return advisoryLocksStatement(pgx.Identifier{cmp.Or(schema, liveness.DefaultSchema)}.Sanitize(), source)
}
