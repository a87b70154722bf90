-- The metrics collectors' reads (package collector), one statement per collector and
-- scrape. The advisory-locks statement is the status page's too.

-- name: instances
-- One summary row per service (state counts and the oldest heartbeat, by the one
-- definition of states) followed by the max-series instances with the oldest heartbeats,
-- so that 10,000 instances never leave the server. The first row says whether the server
-- is a standby, where the verdict rests on heartbeats alone. The verdict is plain SQL
-- that the planner inlines here, so the counting is one pass over the instances and the
-- granted locks (each row's state evaluated once, below the OFFSET 0 fence); the oldest
-- heartbeats come off the last_heartbeat_at index.
--
-- {verdicts} is the source's verdict without stamping. Vanished locks are then stamped
-- ({stamp}, our schema only) from the instances the verdict called lock_lost: an
-- unstamped absence counts as just seen, so the states are those of stamping first; with
-- none, and no stamp standing, the stamping reads nothing more. {key_shared} counts
-- instances whose alive-lock key another shares (a Whizbang source's 32-bit keys; false
-- for ours).
--
-- $1 max series. The first row has in_recovery and key_shared set, a service's row
-- service_name and the counts, an instance's row service_name and instance_id; age is
-- the oldest heartbeat's age, or the instance's, in seconds.
WITH services AS MATERIALIZED (
    SELECT s.service_name,
           count(*) FILTER (WHERE s.state = 'alive') AS alive,
           count(*) FILTER (WHERE s.state = 'lock_only') AS lock_only,
           count(*) FILTER (WHERE s.state = 'lock_lost') AS lock_lost,
           count(*) FILTER (WHERE s.state = 'heartbeat_only') AS heartbeat_only,
           count(*) FILTER (WHERE s.state = 'stale') AS stale,
           count(*) FILTER (WHERE s.state = 'zombie') AS zombie,
           count(*) FILTER (WHERE s.key_shared) AS key_shared,
           min(s.last_heartbeat_at) AS oldest,
           array_agg(s.instance_id) FILTER (WHERE s.state = 'lock_lost') AS lost
      FROM (SELECT v.instance_id, v.service_name, v.state, v.last_heartbeat_at, {key_shared} AS key_shared
              FROM {verdicts} v
            OFFSET 0) s -- so that each row's state is evaluated once, not once per count
     GROUP BY s.service_name)
SELECT NULL::text AS service_name, NULL::text AS instance_id, NULL::bigint AS alive, NULL::bigint AS lock_only,
       NULL::bigint AS lock_lost, NULL::bigint AS heartbeat_only, NULL::bigint AS stale, NULL::bigint AS zombie,
       NULL::float8 AS age, pg_catalog.pg_is_in_recovery() AS in_recovery,
       (SELECT sum(v.key_shared) FROM services v)::bigint AS key_shared
  FROM (SELECT {stamp}) stamp
UNION ALL
SELECT v.service_name, NULL::text, v.alive, v.lock_only, v.lock_lost, v.heartbeat_only, v.stale, v.zombie,
       extract(epoch FROM now() - v.oldest)::float8, NULL, NULL
  FROM services v
UNION ALL
(SELECT i.service_name, i.instance_id::text, NULL, NULL, NULL, NULL, NULL, NULL,
        extract(epoch FROM now() - i.last_heartbeat_at)::float8, NULL, NULL
   FROM {instances} i
  ORDER BY i.last_heartbeat_at, i.instance_id
  LIMIT $1)

-- name: leases
-- Reads a leases table by the database clock, folded in the database so that only the
-- exported rows travel. Nothing is assumed of a foreign table: names may repeat and any
-- column may be NULL. One row per name counts ({lease_rows}); of those, the max-series
-- most urgent ($2: expired longest ago, then soonest to expire, NULL last, then by name)
-- come one row each, in that order, followed by one summary row: the folded leases (how
-- many, how many unexpired, the soonest expiry, the earliest taken_at), the anomalies
-- (rows without a name, named rows with a NULL holder, taken_at or expires_at, and extra
-- rows of a name), and the table's shape ($1, the table, as a regclass): which of the
-- optional columns it has, and "unique name" when a unique index guarantees one row per
-- name.
--
-- {table} is the table. The optional columns {epoch}, {holder_instance_id} and
-- {holder_host} are the table's columns (lease_column_*), or NULL when it has none
-- (lease_no_*: a plain leases table without an epoch, or one from before holder
-- identities); the summary row tells when the shape changed.
WITH best AS {lease_rows}, kept AS MATERIALIZED (
    SELECT b.* FROM best b ORDER BY b.expires_at, b.name LIMIT $2
)
(SELECT k.name, k.holder::text AS holder, k.epoch::bigint AS epoch, k.holder_instance_id::text AS holder_instance_id,
        k.holder_host::text AS holder_host, extract(epoch FROM k.expires_at - now())::float8 AS expires_in,
        k.expires_at >= now() AS held, extract(epoch FROM now() - k.taken_at)::float8 AS held_for,
        NULL::bigint AS folded, NULL::bigint AS folded_held, NULL::bigint AS null_names, NULL::bigint AS null_values,
        NULL::bigint AS duplicates, NULL::text[] AS shape
   FROM kept k
  ORDER BY k.expires_at, k.name)
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL,
       extract(epoch FROM f.soonest - now())::float8, NULL, extract(epoch FROM now() - f.first_taken)::float8,
       f.n, f.held, a.null_names, a.null_values, a.named - f.n - (SELECT count(*) FROM kept),
       ARRAY(SELECT c.attname::text FROM pg_catalog.pg_attribute c
              WHERE c.attrelid = $1::regclass AND c.attnum > 0 AND NOT c.attisdropped
                AND c.attname IN ('epoch', 'holder_instance_id', 'holder_host')
             UNION ALL
             (SELECT 'unique name' FROM pg_catalog.pg_index x
                JOIN pg_catalog.pg_attribute c ON c.attrelid = x.indrelid AND c.attnum = x.indkey[0]
               WHERE x.indrelid = $1::regclass AND x.indisunique AND x.indisvalid AND x.indnkeyatts = 1
                 AND x.indpred IS NULL AND c.attname = 'name'
               LIMIT 1))
  FROM (SELECT count(*) FILTER (WHERE l.name IS NULL) AS null_names,
               count(*) FILTER (WHERE l.name IS NOT NULL AND (l.holder IS NULL OR l.expires_at IS NULL OR l.taken_at IS NULL)) AS null_values,
               count(*) FILTER (WHERE l.name IS NOT NULL) AS named
          FROM {table} AS l) a,
       (SELECT min(b.expires_at) AS soonest, min(b.taken_at) AS first_taken, count(*) AS n,
               count(*) FILTER (WHERE b.expires_at >= now()) AS held
          FROM best b
         WHERE b.name NOT IN (SELECT k.name FROM kept k)) f

-- fragment: lease_rows_any
-- {lease_rows} for a table whose names may repeat: of a name's rows, the one expiring
-- last, then the higher epoch, then the holder.
MATERIALIZED (
    SELECT DISTINCT ON (l.name::text COLLATE "C")
           l.name::text COLLATE "C" AS name, l.holder, {epoch} AS epoch, {holder_instance_id} AS holder_instance_id,
           {holder_host} AS holder_host, l.expires_at, l.taken_at
      FROM {table} AS l
     WHERE l.name IS NOT NULL
     ORDER BY l.name::text COLLATE "C", l.expires_at DESC NULLS LAST, 3 DESC NULLS LAST, l.holder::text COLLATE "C" DESC NULLS LAST
)

-- fragment: lease_rows_unique
-- {lease_rows} for a table with a unique index on name, as ours has: every named row,
-- without sorting them all; the most urgent come off an index on expires_at when there
-- is one.
NOT MATERIALIZED (
    SELECT l.name::text COLLATE "C" AS name, l.holder, {epoch} AS epoch, {holder_instance_id} AS holder_instance_id,
           {holder_host} AS holder_host, l.expires_at, l.taken_at
      FROM {table} AS l
     WHERE l.name IS NOT NULL
)

-- fragment: lease_column_epoch
l.epoch

-- fragment: lease_no_epoch
NULL::bigint

-- fragment: lease_column_holder_instance_id
l.holder_instance_id

-- fragment: lease_no_holder_instance_id
NULL::text

-- fragment: lease_column_holder_host
l.holder_host

-- fragment: lease_no_holder_host
NULL::text

-- name: advisory_locks
-- This database's advisory locks and client backends in one statement. A lock is an
-- alive lock when it is a bigint lock (objsubid = 1) that {alive_lock_match}es the
-- source's alive-lock keys. Rows of kind 'locks' count locks by (alive, granted); rows of
-- kind 'backends' count client backends by (application_name, state), with how many of
-- them hold a granted advisory lock, how many wait for one, and the longest an idle
-- holder has been idle. "Idle" covers idle in transaction too: either way the backend
-- sits on its locks. It is one statement, not a batch of two, on purpose: both kinds of
-- rows come from one materialized read of pg_locks, which is no transactional snapshot,
-- so the holders and the lock counts always agree.
WITH db AS (
    SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database()
), locks AS MATERIALIZED (
    SELECT l.pid, l.granted,
           l.objsubid = 1 AND {alive_lock_match} AS alive
      FROM pg_catalog.pg_locks l
     WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM db)
), per_pid AS (
    SELECT pid, bool_or(granted) AS holds, bool_or(NOT granted) AS waits
      FROM locks GROUP BY pid
), backends AS (
    SELECT coalesce(a.application_name, '') AS app, coalesce(a.state, '') AS state,
           coalesce(p.holds, false) AS holds, coalesce(p.waits, false) AS waits,
           extract(epoch FROM now() - a.state_change)::float8 AS idle_for
      FROM pg_catalog.pg_stat_activity a
      LEFT JOIN per_pid p ON p.pid = a.pid
     WHERE a.datid = (SELECT oid FROM db) AND a.backend_type = 'client backend'
)
SELECT 'backends' AS kind, app AS name, state, count(*) AS count,
       count(*) FILTER (WHERE holds) AS holders, count(*) FILTER (WHERE waits) AS waiters,
       coalesce(max(idle_for) FILTER (WHERE holds AND state LIKE 'idle%'), 0) AS idle_holder_max_seconds
  FROM backends GROUP BY app, state
UNION ALL
SELECT 'locks', CASE WHEN alive THEN 'alive_lock' ELSE 'other' END, granted::text, count(*), 0, 0, 0
  FROM locks GROUP BY 2, 3

-- name: server_advisory_locks
-- The advisory locks and client backends of several databases of one server, in one read
-- of pg_locks and pg_stat_activity (both cluster-wide: every read copies the server's
-- whole lock table, whichever database holds the locks), for an observer of many
-- databases on one server: it hands each database its part (advisory_locks_of_snapshot,
-- and the instances statement's verdict of given locks) instead of each reading pg_locks
-- itself. Sent on any database of the server. $1 the databases' names (text[]).
--
-- Rows by database (datname) and kind: 'backends' rows as the advisory-locks statement's
-- (client backends by application_name and state, with holders, waiters and the longest
-- idle holder), 'locks' rows counting the advisory locks on two int4 keys (objsubid 2,
-- never an alive lock) by granted, and one 'keys' row with the locks on bigint keys
-- (objsubid 1) as arrays: classids, objids, granted, whether the mode is ExclusiveLock,
-- and the holder's (or waiter's) backend pid. Holders and waiters count from the same materialized read of pg_locks
-- as the locks, so they agree, as in the advisory-locks statement.
WITH dbs AS (
    SELECT d.oid, d.datname::text AS datname FROM pg_catalog.pg_database d WHERE d.datname = ANY ($1::text[])
), locks AS MATERIALIZED (
    SELECT l.database, l.pid, l.granted, l.objsubid = 1 AS on_bigint, l.classid, l.objid,
           l.mode = 'ExclusiveLock' AS exclusive
      FROM pg_catalog.pg_locks l
     WHERE l.locktype = 'advisory' AND l.database IN (SELECT oid FROM dbs)
), per_pid AS (
    SELECT database, pid, bool_or(granted) AS holds, bool_or(NOT granted) AS waits
      FROM locks GROUP BY database, pid
), backends AS (
    SELECT a.datid, coalesce(a.application_name, '') AS app, coalesce(a.state, '') AS state,
           coalesce(p.holds, false) AS holds, coalesce(p.waits, false) AS waits,
           extract(epoch FROM now() - a.state_change)::float8 AS idle_for
      FROM pg_catalog.pg_stat_activity a
      LEFT JOIN per_pid p ON p.database = a.datid AND p.pid = a.pid
     WHERE a.datid IN (SELECT oid FROM dbs) AND a.backend_type = 'client backend'
)
SELECT d.datname, 'backends' AS kind, b.app AS name, b.state, count(*) AS count,
       count(*) FILTER (WHERE b.holds) AS holders, count(*) FILTER (WHERE b.waits) AS waiters,
       coalesce(max(b.idle_for) FILTER (WHERE b.holds AND b.state LIKE 'idle%'), 0) AS idle_holder_max_seconds,
       NULL::oid[] AS classids, NULL::oid[] AS objids, NULL::boolean[] AS granted, NULL::boolean[] AS exclusive,
       NULL::integer[] AS pids
  FROM backends b JOIN dbs d ON d.oid = b.datid
 GROUP BY d.datname, b.app, b.state
UNION ALL
SELECT d.datname, 'locks', 'other', l.granted::text, count(*), 0, 0, 0, NULL, NULL, NULL, NULL, NULL
  FROM locks l JOIN dbs d ON d.oid = l.database
 WHERE NOT l.on_bigint
 GROUP BY d.datname, l.granted
UNION ALL
SELECT d.datname, 'keys', '', '', count(*), 0, 0, 0,
       array_agg(l.classid), array_agg(l.objid), array_agg(l.granted), array_agg(l.exclusive), array_agg(l.pid)
  FROM locks l JOIN dbs d ON d.oid = l.database
 WHERE l.on_bigint
 GROUP BY d.datname

-- name: advisory_locks_of_snapshot
-- The advisory-locks statement's 'locks' rows for the locks on bigint keys of this
-- database that server_advisory_locks read, without reading pg_locks: each lock
-- ($1 classids, $2 objids, $3 granted, as that statement's 'keys' row gives them) is an
-- alive lock when it {alive_lock_match}es the source's alive-lock keys. Counts by
-- (alive, granted), in the advisory-locks statement's columns.
SELECT 'locks' AS kind, CASE WHEN s.alive THEN 'alive_lock' ELSE 'other' END AS name, s.granted::text AS state,
       count(*) AS count, 0::bigint AS holders, 0::bigint AS waiters, 0::float8 AS idle_holder_max_seconds
  FROM (SELECT l.granted, {alive_lock_match} AS alive
          FROM ROWS FROM (pg_catalog.unnest($1::oid[]), pg_catalog.unnest($2::oid[]), pg_catalog.unnest($3::boolean[])) AS l(classid, objid, granted)) s
 GROUP BY 2, 3
