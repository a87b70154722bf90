-- A Whizbang database, read as it is: the <prefix>service_instances table ({table}) its
-- services write and the session advisory lock each of them takes,
-- pg_try_advisory_lock(hashtext(<lock key prefix> || instance_id::text)): a 32-bit key,
-- sign-extended to a bigint, shown in pg_locks as an advisory lock with objsubid = 1. Its
-- instances are judged by the newest migration's instance_state_rule, taken from the
-- migration itself ({instance_state_rule}), not copied. Everything here is a SELECT that
-- needs only SELECT on the table and pg_read_all_stats. {stale}, {dead} and
-- {lock_key_prefix} are the source's timing and key prefix, passed as parameters.

-- name: whizbang_table
-- Whether the source's table exists and the role may read it. $1 the table's quoted
-- identifier.
SELECT pg_catalog.to_regclass($1) IS NOT NULL
   AND pg_catalog.has_table_privilege(pg_catalog.to_regclass($1), 'SELECT') AS readable

-- fragment: whizbang.verdicts
-- Every instance of the table with instance_state_rule's state, the lock counted only
-- when no other row shares the instance's key, and the columns
--   instance_id, service_name, host_name, process_id, started_at, metadata, state, alive,
--   lock_held, key_shared, last_heartbeat_at.
-- Locks ({exclusive_locks}: pg_locks', or those an observer of the server read once for
-- every database, passed in) are matched by a hash join on the key's halves as pg_locks
-- shows a bigint key (classid the high 32 bits, objid the low); only the keys of held locks are counted for
-- sharing (a key nobody holds says nothing either way), so the table is scanned twice but
-- nothing is sorted or kept. On a standby pg_locks does not show the primary's locks:
-- locked is NULL there and the verdict rests on heartbeats. The rule's parameters are
-- the columns of p, Whizbang's values for them: its rows record no lock (so no
-- lock_lost), no absence and no grace.
(SELECT w.instance_id, w.service_name, w.host_name, w.process_id, w.started_at, w.metadata, s.state,
       s.state IN ('alive', 'lock_only', 'lock_lost', 'heartbeat_only') AS alive,
       w.locked AS lock_held, w.key_shared, w.last_heartbeat_at
  FROM (SELECT i.instance_id, i.service_name, i.host_name, i.process_id, i.started_at, i.metadata, i.last_heartbeat_at,
               coalesce(h.shared, false) AS key_shared,
               CASE WHEN NOT (SELECT pg_catalog.pg_is_in_recovery()) THEN h.key IS NOT NULL END AS locked
          FROM {table} i
          LEFT JOIN (SELECT k.key, count(*) > 1 AS shared
                       FROM (SELECT pg_catalog.hashtext({lock_key_prefix}::text || i.instance_id::text)::bigint AS key FROM {table} i) k
                       JOIN {exclusive_locks} l
                         ON l.classid = ((k.key >> 32) & 4294967295)::oid AND l.objid = (k.key & 4294967295)::oid
                      GROUP BY k.key) h
                 ON h.key = pg_catalog.hashtext({lock_key_prefix}::text || i.instance_id::text)::bigint) w
 CROSS JOIN LATERAL (SELECT {instance_state_rule} AS state
                       FROM (SELECT coalesce(w.locked AND NOT w.key_shared, false) AS p_locked,
                                    false AS p_holds_alive_lock,
                                    w.last_heartbeat_at AS p_last_heartbeat_at,
                                    pg_catalog.now() AS p_now,
                                    {stale}::interval AS p_stale,
                                    {dead}::interval AS p_dead,
                                    NULL::timestamptz AS p_missing_since,
                                    NULL::interval AS p_grace) p) s)

-- fragment: whizbang.states
{verdicts}

-- fragment: whizbang.all_states
{verdicts}

-- fragment: whizbang.stamp
-- Nothing to stamp: Whizbang's rows record no lock.
NULL::integer

-- fragment: whizbang.key_shared
v.key_shared

-- fragment: whizbang.instances
{table}

-- fragment: whizbang.leases
-- No leases: an empty relation with the columns read_fleet reads.
(SELECT NULL::text AS name, NULL::uuid AS holder_instance_id, NULL::text AS holder_host, NULL::text AS holder,
        NULL::bigint AS epoch, NULL::timestamptz AS taken_at, NULL::timestamptz AS expires_at WHERE false)

-- fragment: whizbang.mode
-- Whizbang records no mode.
''::text

-- fragment: whizbang.heartbeat_interval
-- Whizbang records no timing: the source's, in seconds.
{heartbeat_interval_seconds}::float8

-- fragment: whizbang.heartbeat_slow_interval
{heartbeat_slow_interval_seconds}::float8

-- fragment: whizbang.stale_threshold
{stale_threshold_seconds}::float8

-- fragment: whizbang.definitive_dead_cutoff
{definitive_dead_cutoff_seconds}::float8

-- fragment: whizbang.lock_grace
NULL::float8

-- fragment: whizbang.alive_lock_match
-- A bigint lock (objsubid = 1, checked by the caller) whose key is the hashtext key of
-- some instance in the table: the keys are hashed once per scrape into one hashed
-- subplan.
((l.classid::bigint << 32) | l.objid::bigint) IN (
               SELECT pg_catalog.hashtext({lock_key_prefix}::text || i.instance_id::text)::bigint FROM {table} i)

-- fragment: whizbang.exclusive_locks
-- This database's advisory locks granted in ExclusiveLock mode on bigint keys, as
-- pg_locks shows them: classid the key's high 32 bits, objid the low.
(SELECT l.classid, l.objid
                        FROM pg_catalog.pg_locks l
                       WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.mode = 'ExclusiveLock'
                         AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                            WHERE d.datname = pg_catalog.current_database()))

-- fragment: exclusive_locks_given
-- {exclusive_locks} as an observer of the server read them for this database
-- (server_advisory_locks), passed in: $2 the classids, $3 the objids ($4, the holders'
-- pids, is not needed: Whizbang records no claimant).
(SELECT g.classid, g.objid FROM ROWS FROM (pg_catalog.unnest($2::oid[]), pg_catalog.unnest($3::oid[])) AS g(classid, objid)
  WHERE $4::integer[] IS NOT DISTINCT FROM $4::integer[])
