-- The statements collector's reads of pg_stat_statements. They carry no tag: they are
-- not the fleet's statements, and a tag would have the collector count its own reads.
-- {schema} is the schema pg_stat_statements is installed in, which may be any.

-- name: stat_statements_schema untagged
-- Where pg_stat_statements is installed. Returns its schema; no row without it.
SELECT n.nspname::text AS schema
  FROM pg_catalog.pg_extension e
  JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
 WHERE e.extname = 'pg_stat_statements'

-- name: stat_statements untagged
-- This database's counters without query texts: reading texts means reading
-- pg_stat_statements' whole text file, so it is done only for new queryids
-- (stat_statements_texts). Only the entries of the queryids in $1 (those that match a
-- pattern) travel, unless $2 asks for all of them; a last row sums up every entry (count
-- and two hashes of the queryids), so that a change in the set of entries (a new one:
-- unclassified) is seen without reading them all. Entries whose queryid is hidden from
-- this role are skipped. It is one statement, not a batch of two, on purpose: the entries
-- and the summary come from one read of pg_stat_statements, which is no transactional
-- snapshot; from two, an entry new in the summary could be missing from the entries read
-- in full, and would not be classified until the set changed again.
WITH s AS MATERIALIZED (
    SELECT s.userid, s.queryid, s.toplevel, s.calls, (s.total_exec_time + s.total_plan_time) / 1000 AS seconds, s.rows
      FROM {schema}.pg_stat_statements(false) s
     WHERE s.dbid = (SELECT d.oid FROM pg_catalog.pg_database d
                      WHERE d.datname = pg_catalog.current_database())
       AND s.queryid IS NOT NULL)
SELECT s.userid, s.queryid, s.toplevel, s.calls, s.seconds, s.rows,
       NULL::bigint AS entries, NULL::bigint AS hash1, NULL::bigint AS hash2
  FROM s WHERE $2 OR s.queryid = ANY($1)
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, count(*), coalesce(sum(pg_catalog.hashint8(s.queryid)), 0),
       coalesce(sum(pg_catalog.hashint8(s.queryid # 6148914691236517205)), 0)
  FROM s

-- name: stat_statements_texts untagged
-- The query texts of the queryids in $1, one per queryid.
SELECT DISTINCT ON (s.queryid) s.queryid, coalesce(s.query, '') AS query
  FROM {schema}.pg_stat_statements(true) s
 WHERE s.dbid = (SELECT d.oid FROM pg_catalog.pg_database d
                  WHERE d.datname = pg_catalog.current_database())
   AND s.queryid = ANY($1)
