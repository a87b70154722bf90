// Package sqltag names every statement that pg_liveness sends at run time, so that the
// exporter's statements collector can find them in pg_stat_statements and count them
// under statement="<name>". It is a leaf: the liveness library, the collectors, the
// migrations and the status page all import it, and it imports nothing.
//
// Each tag is a comment, written right after the statement's first keyword:
//
//	SELECT /* pg_liveness:lease_leader */ l.holder_instance_id, …
//	WITH /* pg_liveness:read_fleet */ v AS MATERIALIZED (…
//
// because pg_stat_statements keeps a statement's text from its first keyword on:
// PostgreSQL 18 drops a comment that comes before it (14 to 17 keep it), and every major
// from 14 to 18 keeps one inside the statement. Comments are not part of the query id:
// two statements that differ only in their tag share one entry, whose text is that of
// whichever ran first. So statements with different tags must differ in shape (tables,
// columns, clauses), not only in their comment; the collector's tests check it on every
// major.
//
// It guarantees that every tag is listed in All and named once. It must never hold
// anything but names: no SQL, and no dependency.
package sqltag
