package collector

import (
	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// The schema metrics show how the binary stands with its schema (Config.Status, a
// store.BinaryStatus the binary keeps current); the exporter reads it on every scrape.

var (
	schemaVersionDesc = gauge("schema_version",
		"Highest migration version applied to the liveness schema; absent until it was read.")
	schemaCompatibleFromDesc = gauge("schema_compatible_from",
		"Oldest binary schema version the liveness schema still serves (the largest compatible-from of its migrations); absent until it was read.")
	schemaBinaryVersionDesc = gauge("schema_binary_version",
		"Newest migration version this binary knows.")
	schemaCompatibleDesc = gauge("schema_compatible",
		"1 when this binary can run against the liveness schema; 0 when the schema was migrated by a newer release that no longer serves this binary's version, and the agent does not run. Absent until the schema was read.")
)

// statusMetrics exports the schema's state as the status says.
func statusMetrics(out *exposition.Builder, s store.BinaryStatus) {
	out.Add(schemaBinaryVersionDesc, float64(s.BinaryVersion))
	if s.SchemaRead {
		out.Add(schemaVersionDesc, float64(s.SchemaVersion))
		out.Add(schemaCompatibleFromDesc, float64(s.SchemaCompatibleFrom))
		out.Add(schemaCompatibleDesc, boolFloat(s.SchemaCompatible))
	}
}
