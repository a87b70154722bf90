// Package store is the data layer of pg_liveness: every SQL text the product sends, the
// sources it reads instances from, and the rows its readers get back. The views read it
// and nothing else: the liveness library (the agent's writes, Reader), the metrics
// collectors, the status page, and package migrations, which applies the schema. Views
// never take SQL from one another.
//
// It is internal: a service imports liveness (and migrations) and never sees these
// types. The library converts at its boundary: liveness.Timing and liveness.FleetQuery
// are this package's Timing and FleetQuery field for field (a conversion, checked by the
// compiler), liveness.ReaderConfig carries SourceConfig's fields under the same names
// (NewSourceNamed checks them, naming ReaderConfig's fields), and a *ConfigError leaves
// the library as a *liveness.ConfigError with the same field and reason.
//
// # What is where
//
//   - sql/*.sql: every statement, by what sends it (alive_lock.sql, heartbeat.sql,
//     leases.sql, reader.sql, collectors.sql, pg_stat_statements.sql, schema_state.sql,
//     migrate.sql), each under a "-- name:" line that says what it does, its parameters
//     and its columns. Statements is the list; Statement and SourceStatement are the
//     handles the views render once, when they are built.
//   - sql/source_liveness.sql and sql/source_whizbang.sql: what each source fills into
//     the statements that read instances (its verdict, its tables, its timing).
//   - schema/NNNN_name.sql: the schema's history, the migrations (MigrationFiles), which
//     package migrations applies in order; schema.sql: every object as it stands after
//     the last one, read back from a server and checked by the tests.
//   - rows.go: the row types of the statements the views read, by column name.
//
// # Tags
//
// Every statement sent at run time carries a tag, /* pg_liveness:<name> */, so that the
// exporter's statements collector can find it in pg_stat_statements and count it under
// statement="<name>" (Tags). A statement's tag is its name unless its "-- name:" line says
// tag=<another's> (three lease statements are sent as lease_release) or untagged (the
// statements collector's own reads, and the migrations' bookkeeping). The tag is written
// right after the statement's first keyword, where pg_stat_statements keeps it on every
// major from 14 to 18 (18 drops a comment before the first keyword). Comments are not
// part of the query id: two statements that differ only in their tag share one entry, so
// statements with different tags differ in shape, which the tests check on every major
// together with the count of every tag.
//
// # Rendering
//
// One renderer fills a statement's {placeholders} in one pass: the schema and the user's
// tables as identifiers it quotes itself (pgx.Identifier), the source's fragments by the
// same pass, and the source's values (its timing, a Whizbang key prefix) as bind
// parameters numbered after the statement's own, which Query.Args appends. Filled-in
// text is never scanned again, so an identifier such as "{table}" stays that name.
//
// # Sources
//
// SourceConfig says where instances are read from: this project's schema, or a Whizbang
// database as it is (Whizbang), judged by the newest migration's instance_state_rule,
// taken from the migration, not copied. NewSource checks it once; the *Source it returns
// is what every reader of the exporter takes, so that they read the same tables by the
// same rules. Errors are *ConfigError naming the SourceConfig field (or, through
// NewSourceNamed, liveness.ReaderConfig's).
//
// # What it guarantees
//
//   - Every statement is rendered from its file: a placeholder that neither a value nor
//     a fragment fills is a defect of the files, found when the tests render them all.
//   - A configured name enters SQL only as a quoted identifier checked by
//     ValidateIdentifier, and a configured value only as a bind parameter (a script's
//     defaults excepted, as quoted literals).
//   - Nothing of a Whizbang source writes: everything it sends is a SELECT that needs
//     only SELECT on its table and pg_read_all_stats.
//
// # What it must never do
//
//   - Import another package of this module, or Prometheus: the public liveness library
//     depends on it.
//   - Appear in the library's API: no exported name of liveness or migrations may
//     mention a type or constant of this package (liveness's TestAPINamesNoOtherPackage).
//   - Paste a configured name or value into SQL unquoted, or fill text that already
//     holds one.
//   - Hold a connection or keep state between statements; the one statement it sends
//     itself (Source.CheckTable) uses the connection it is given.
package store
