package collector

import "github.com/pg-liveness/pg_liveness_exporter/internal/exposition"

// Status is how the binary stands with the database's schema and whether its agent was
// started. The caller keeps it current (the exporter binary from its start-up step); the
// exporter reads it on every scrape.
type Status struct {
	// SchemaRead is false until the schema's migrations were read once; the schema
	// metrics other than the binary's version are absent until then.
	SchemaRead bool
	// SchemaVersion is the highest migration applied to the schema.
	SchemaVersion int
	// SchemaCompatibleFrom is the oldest binary schema version the schema still serves.
	SchemaCompatibleFrom int
	// BinaryVersion is the newest migration version this binary knows.
	BinaryVersion int
	// SchemaCompatible is true when this binary can run against the schema.
	SchemaCompatible bool
	// AgentStarted is true once the agent was started, after the schema was found
	// usable. An agent that is not started never joins.
	AgentStarted bool
}

// StatusSource returns the current Status.
type StatusSource interface {
	Status() Status
}

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
func statusMetrics(out *exposition.Builder, s Status) {
	out.Add(schemaBinaryVersionDesc, float64(s.BinaryVersion))
	if s.SchemaRead {
		out.Add(schemaVersionDesc, float64(s.SchemaVersion))
		out.Add(schemaCompatibleFromDesc, float64(s.SchemaCompatibleFrom))
		out.Add(schemaCompatibleDesc, boolFloat(s.SchemaCompatible))
	}
}
