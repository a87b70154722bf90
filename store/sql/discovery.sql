-- Discovery within a server (--config.file's discover section): which databases of a
-- server the exporter watches. Read at start and at every re-check, never per scrape.

-- name: discover_databases
-- The server's databases that take connections, templates left out, by name.
SELECT d.datname::text AS datname
  FROM pg_catalog.pg_database d
 WHERE d.datallowconn AND NOT d.datistemplate
 ORDER BY d.datname

-- name: discover_source
-- Whether this database holds the source's instances table and the role may read it:
-- no row when the table does not exist. $1 the table's quoted identifier.
SELECT pg_catalog.has_table_privilege(c.oid, 'SELECT') AS readable
  FROM pg_catalog.pg_class c
 WHERE c.oid = pg_catalog.to_regclass($1)
