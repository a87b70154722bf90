-- Where a schema stands: which migrations it has (package migrations reads it at
-- start-up, and an Agent before it runs). They need USAGE on the schema and SELECT on
-- schema_migrations, nothing else.

-- name: schema_state
-- Whether the schema_migrations table exists. $1 its quoted identifier.
SELECT pg_catalog.to_regclass($1) IS NOT NULL AS exists

-- name: schema_migrations tag=schema_state
-- Every applied migration and the compatible-from it recorded; to_jsonb reads
-- compatible_from whether or not the column exists yet (NULL for rows recorded before it
-- did).
SELECT m.version, (pg_catalog.to_jsonb(m) ->> 'compatible_from')::integer AS compatible_from
  FROM {schema}.schema_migrations AS m

-- name: schema_version tag=schema_state
-- The highest applied migration.
SELECT coalesce(max(version), 0) AS version FROM {schema}.schema_migrations
