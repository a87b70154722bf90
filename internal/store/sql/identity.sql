-- The identity of the database a session is on, unique across servers and clusters: the
-- server's system identifier (initdb's, which its physical standbys keep) with the
-- database's oid; its name for people. The exporters read it (package collector) so that
-- the lease alerts meet the agents' beliefs and the lease rows of one database, whatever
-- namespace, release or cluster scraped them. pg_control_system() is any role's.

-- name: database_identity
-- One row: system_identifier and database_oid as text (a system identifier is a bigint
-- beyond float8's precision), datname.
SELECT s.system_identifier::text AS system_identifier, d.oid::text AS database_oid, d.datname
  FROM pg_catalog.pg_control_system() AS s, pg_catalog.pg_database AS d
 WHERE d.datname = pg_catalog.current_database()
