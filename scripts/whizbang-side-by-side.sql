-- Moving a Whizbang fleet to pg_liveness, side by side. Generated from the exporter's
-- Whizbang source (internal/store/sql/whizbang_side_by_side.sql); do not edit by hand.
--
-- Run it once, after pg_liveness's migrations created schema "liveness", as a role that may
-- create functions there. It reads "public"."wh_service_instances"
-- and writes nothing to it. Then, in this order:
--   1. Point callers at "liveness".is_fleet_instance_alive(id) instead of Whizbang's
--      is_instance_alive(id, seconds): it answers for instances of either fleet.
--   2. Deploy services built on pg_liveness one at a time. Their instances register in
--      "liveness".instances; the Whizbang instances they replace leave Whizbang's table when
--      Whizbang removes or reaps them.
--   3. Watch both fleets: SELECT * FROM "liveness".fleet_instance_states(), and an exporter
--      with --no-agent --source=whizbang next to the usual one.
--   4. When SELECT count(*) FROM "liveness".whizbang_instance_states() is 0, switch callers
--      to "liveness".is_instance_alive(id), drop these three functions (below, commented
--      out) and then Whizbang's tables.

-- Whizbang's instances by pg_liveness's states. A Whizbang row records no timing, so the
-- stale threshold and definitive-dead cutoff are arguments (defaults: Whizbang's cadence).
-- Instances whose 32-bit lock keys collide are judged by their heartbeats (key_shared).
CREATE OR REPLACE FUNCTION "liveness".whizbang_instance_states(
        p_stale_threshold        interval DEFAULT '1m30s',
        p_definitive_dead_cutoff interval DEFAULT '5m0s',
        p_lock_key_prefix        text     DEFAULT 'wh_instance_alive:')
    RETURNS TABLE (instance_id uuid, service_name text, host_name text, process_id integer,
                   started_at timestamptz, metadata jsonb, state text, alive boolean,
                   lock_held boolean, key_shared boolean, last_heartbeat_at timestamptz)
    LANGUAGE sql STABLE
AS $$
    SELECT * FROM (SELECT w.instance_id, w.service_name, w.host_name, w.process_id, w.started_at, w.metadata, s.state,
           s.state IN ('alive', 'lock_only', 'lock_lost', 'heartbeat_only') AS alive,
           w.locked AS lock_held, w.key_shared, w.last_heartbeat_at
      FROM (SELECT i.instance_id, i.service_name, i.host_name, i.process_id, i.started_at, i.metadata, i.last_heartbeat_at,
                   coalesce(h.shared, false) AS key_shared,
                   CASE WHEN NOT (SELECT pg_catalog.pg_is_in_recovery()) THEN h.key IS NOT NULL END AS locked
              FROM "public"."wh_service_instances" i
              LEFT JOIN (SELECT k.key, count(*) > 1 AS shared
                           FROM (SELECT pg_catalog.hashtext(p_lock_key_prefix::text || i.instance_id::text)::bigint AS key FROM "public"."wh_service_instances" i) k
                           JOIN (SELECT l.classid, l.objid
                                                   FROM pg_catalog.pg_locks l
                                                  WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.mode = 'ExclusiveLock'
                                                    AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                                                       WHERE d.datname = pg_catalog.current_database())) l
                             ON l.classid = ((k.key >> 32) & 4294967295)::oid AND l.objid = (k.key & 4294967295)::oid
                          GROUP BY k.key) h
                     ON h.key = pg_catalog.hashtext(p_lock_key_prefix::text || i.instance_id::text)::bigint) w
     CROSS JOIN LATERAL (SELECT CASE
         WHEN p_locked AND p_last_heartbeat_at <= p_now - p_dead THEN 'zombie'
         WHEN p_locked AND p_last_heartbeat_at > p_now - p_stale THEN 'alive'
         WHEN p_locked THEN 'lock_only'
         WHEN p_last_heartbeat_at <= p_now - p_stale THEN 'stale'
         WHEN p_holds_alive_lock AND coalesce(p_missing_since > p_now - p_grace, true) THEN 'lock_lost'
         WHEN p_holds_alive_lock THEN 'stale'
         ELSE 'heartbeat_only'
     END AS state
                           FROM (SELECT coalesce(w.locked AND NOT w.key_shared, false) AS p_locked,
                                        false AS p_holds_alive_lock,
                                        w.last_heartbeat_at AS p_last_heartbeat_at,
                                        pg_catalog.now() AS p_now,
                                        p_stale_threshold::interval AS p_stale,
                                        p_definitive_dead_cutoff::interval AS p_dead,
                                        NULL::timestamptz AS p_missing_since,
                                        NULL::interval AS p_grace) p) s) v
$$;

-- Both fleets: source is 'liveness' or 'whizbang'. An id in both (an instance that
-- re-registered under pg_liveness with its Whizbang id) counts once, as pg_liveness's.
CREATE OR REPLACE FUNCTION "liveness".fleet_instance_states()
    RETURNS TABLE (source text, instance_id uuid, service_name text, state text, alive boolean,
                   last_heartbeat_at timestamptz)
    LANGUAGE sql VOLATILE
AS $$
    SELECT 'liveness', s.instance_id, s.service_name, s.state, s.alive, s.last_heartbeat_at
      FROM "liveness".instance_states() s
    UNION ALL
    SELECT 'whizbang', w.instance_id, w.service_name, w.state, w.alive, w.last_heartbeat_at
      FROM "liveness".whizbang_instance_states() w
     WHERE NOT EXISTS (SELECT 1 FROM "liveness".instances i WHERE i.instance_id = w.instance_id)
$$;

-- Alive in either fleet; false for an id in neither.
CREATE OR REPLACE FUNCTION "liveness".is_fleet_instance_alive(p_instance_id uuid) RETURNS boolean
    LANGUAGE sql VOLATILE STRICT
AS $$
    SELECT CASE
        WHEN EXISTS (SELECT 1 FROM "liveness".instances i WHERE i.instance_id = p_instance_id)
            THEN "liveness".is_instance_alive(p_instance_id)
        ELSE coalesce((SELECT w.alive FROM "liveness".whizbang_instance_states() w
                        WHERE w.instance_id = p_instance_id), false)
    END
$$;

-- When the move is done:
-- DROP FUNCTION "liveness".is_fleet_instance_alive(uuid);
-- DROP FUNCTION "liveness".fleet_instance_states();
-- DROP FUNCTION "liveness".whizbang_instance_states(interval, interval, text);
