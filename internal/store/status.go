package store

// BinaryStatus is how a binary stands with its schema, as the schema_state statements
// read it at start-up, and whether its agent was started. The binary keeps it current;
// the views show it: the schema metrics (collector) and the status page.
type BinaryStatus struct {
	// SchemaRead is false until the schema's migrations were read once; the rest but
	// BinaryVersion and AgentStarted is unknown until then.
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

// StatusSource returns the current BinaryStatus.
type StatusSource interface {
	Status() BinaryStatus
}
