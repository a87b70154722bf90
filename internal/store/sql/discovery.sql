-- Discovery within a server (--config.file's discover section): which databases of a
-- server the exporter watches. Read at start and at every re-check, never per scrape.

-- name: discover_databases
-- The server's databases, templates left out, by name, and whether each takes
-- connections: one that does not is not watched, unless it was before (it is then down,
-- not gone).
SELECT d.datname::text AS datname, d.datallowconn AS allows_connections
  FROM pg_catalog.pg_database d
 WHERE NOT d.datistemplate
 ORDER BY d.datname

-- name: discover_source
-- Whether this database holds the source's instances table and the role may read it:
-- no row when the table does not exist. $1 the table's quoted identifier.
SELECT pg_catalog.has_table_privilege(c.oid, 'SELECT') AS readable
  FROM pg_catalog.pg_class c
 WHERE c.oid = pg_catalog.to_regclass($1)
