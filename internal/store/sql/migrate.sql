-- What package migrations sends around each migration file it applies: each file runs in
-- its own transaction, serialized across processes by a transaction-level advisory lock
-- per schema name, and is recorded in <schema>.schema_migrations. They carry no tag: they
-- run only while a schema is being migrated, before the fleet's statements are counted.

-- name: migrate_lock untagged
-- One lock per schema name, taken before anything else, serializes runners. $1 the
-- schema's name.
SELECT pg_advisory_xact_lock(hashtextextended('pg_liveness.migrations:' || $1::text, 0))

-- name: migrate_schema untagged
CREATE SCHEMA IF NOT EXISTS {schema}

-- name: migrate_bookkeeping untagged
-- The table of applied migrations, with compatible_from added to one created before it
-- existed. Two statements: sent without parameters, in one round trip.
CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
		version         integer     PRIMARY KEY,
		name            text        NOT NULL,
		applied_at      timestamptz NOT NULL DEFAULT now(),
		compatible_from integer);
		ALTER TABLE {schema}.schema_migrations ADD COLUMN IF NOT EXISTS compatible_from integer

-- name: migrate_applied untagged
-- Whether another process applied migration $1 meanwhile.
SELECT EXISTS (SELECT FROM {schema}.schema_migrations WHERE version = $1) AS applied

-- name: migrate_search_path untagged
-- Objects in the migration files are unqualified: they land in the schema. $1 the
-- search_path, the schema's quoted identifier first.
SELECT set_config('search_path', $1, true)

-- name: migrate_record untagged
-- $1 version, $2 name, $3 compatible-from.
INSERT INTO {schema}.schema_migrations (version, name, compatible_from) VALUES ($1, $2, $3)
