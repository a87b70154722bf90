-- compatible-from: 1
-- Instances and the alive lock. The migration runner sets search_path to the target
-- schema, so objects are created there; functions that touch tables pin that search_path
-- with SET search_path FROM CURRENT so callers' settings cannot redirect them.

CREATE TABLE instances (
    instance_id       uuid        PRIMARY KEY,
    service_name      text        NOT NULL,
    host_name         text        NOT NULL DEFAULT '',
    process_id        integer     NOT NULL DEFAULT 0,
    started_at        timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at timestamptz NOT NULL DEFAULT now(),
    -- Which signal the instance relies on: the alive lock with the heartbeat as fallback,
    -- or the heartbeat alone.
    liveness_mode     text        NOT NULL DEFAULT 'advisory-lock-when-available'
        CHECK (liveness_mode IN ('advisory-lock-when-available', 'heartbeat-table-only')),
    metadata          jsonb       NOT NULL DEFAULT '{}'::jsonb
);

CREATE INDEX instances_last_heartbeat_at_idx ON instances (last_heartbeat_at);
CREATE INDEX instances_service_name_idx ON instances (service_name);

-- The one place the alive-lock key is defined: 64 bits, so keys of different instances
-- do not collide the way 32-bit hashtext keys do.
CREATE FUNCTION instance_lock_key(p_instance_id uuid) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT pg_catalog.hashtextextended('pg_liveness.alive:' || p_instance_id::text, 0) $$;

-- A bigint advisory lock shows in pg_locks as classid = high 32 bits, objid = low 32 bits,
-- objsubid = 1 (a two-int4 lock has objsubid = 2). oid is unsigned, so mask before casting.
CREATE FUNCTION lock_key_classid(p_key bigint) RETURNS oid
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT ((p_key >> 32) & 4294967295)::oid $$;

CREATE FUNCTION lock_key_objid(p_key bigint) RETURNS oid
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT (p_key & 4294967295)::oid $$;

-- Single-key (bigint) advisory locks in this database, granted or awaited.
CREATE VIEW bigint_advisory_locks AS
SELECT l.pid, l.granted, l.classid, l.objid, l.mode
  FROM pg_catalog.pg_locks l
 WHERE l.locktype = 'advisory'
   AND l.objsubid = 1
   AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                      WHERE d.datname = pg_catalog.current_database());

-- Granted alive locks joined to their instances: the same match is_instance_alive,
-- cleanup_stale_instances and the exporter use.
CREATE VIEW instance_alive_locks AS
SELECT i.instance_id, l.pid
  FROM instances i
  JOIN bigint_advisory_locks l
    ON l.granted
   AND l.classid = lock_key_classid(instance_lock_key(i.instance_id))
   AND l.objid = lock_key_objid(instance_lock_key(i.instance_id));

-- Whether some session holds the instance's alive lock.
CREATE FUNCTION alive_lock_held(p_instance_id uuid) RETURNS boolean
    LANGUAGE sql VOLATILE STRICT
    SET search_path FROM CURRENT
AS $$
    SELECT EXISTS (
        SELECT 1 FROM bigint_advisory_locks l
         WHERE l.granted
           AND l.classid = lock_key_classid(instance_lock_key(p_instance_id))
           AND l.objid = lock_key_objid(instance_lock_key(p_instance_id)))
$$;

-- Claims the alive lock for this session without waiting. False when another session
-- holds it (a duplicate instance id). The lock lasts until the session ends.
CREATE FUNCTION claim_instance_alive_lock(p_instance_id uuid) RETURNS boolean
    LANGUAGE sql VOLATILE STRICT
    SET search_path FROM CURRENT
AS $$ SELECT pg_catalog.pg_try_advisory_lock(instance_lock_key(p_instance_id)) $$;

-- Alive when either signal says so: the alive lock is granted to some session, or the
-- heartbeat is newer than threshold_seconds by the database clock.
CREATE FUNCTION is_instance_alive(p_instance_id uuid, threshold_seconds integer) RETURNS boolean
    LANGUAGE sql VOLATILE STRICT
    SET search_path FROM CURRENT
AS $$
    SELECT alive_lock_held(p_instance_id)
        OR EXISTS (SELECT 1 FROM instances i
                    WHERE i.instance_id = p_instance_id
                      AND i.last_heartbeat_at > now() - make_interval(secs => threshold_seconds))
$$;

-- Deletes instances whose heartbeat is older than p_stale_cutoff, except those whose
-- alive lock is still held. When p_definitive_dead_cutoff is given, a heartbeat older
-- than it is deleted even with the lock held: an OOM-killed process on a half-open TCP
-- session keeps its lock until keepalive fires. Returns the deleted ids.
CREATE FUNCTION cleanup_stale_instances(p_stale_cutoff timestamptz,
                                        p_definitive_dead_cutoff timestamptz DEFAULT NULL)
    RETURNS SETOF uuid
    LANGUAGE sql VOLATILE
    SET search_path FROM CURRENT
AS $$
    DELETE FROM instances i
     WHERE i.last_heartbeat_at < p_stale_cutoff
       AND (i.last_heartbeat_at < p_definitive_dead_cutoff
            OR NOT EXISTS (SELECT 1 FROM instance_alive_locks a
                            WHERE a.instance_id = i.instance_id))
    RETURNING i.instance_id
$$;
