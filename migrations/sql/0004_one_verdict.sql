-- compatible-from: 1
-- Older binaries keep working: the new columns are nullable or defaulted, and
-- is_instance_alive(uuid, integer) and cleanup_stale_instances keep their signatures.
-- One liveness verdict. instance_states is the only place where an instance's state is
-- defined; is_instance_alive, cleanup_stale_instances, the exporter and the Go readers all
-- read it. Each instance records its own timing, so every observer judges it by the
-- settings it actually runs with.

-- The instance's own timing, written by its heartbeat. NULL for rows written by other
-- software: observers then use their own defaults.
ALTER TABLE instances
    ADD COLUMN heartbeat_interval      interval,
    ADD COLUMN heartbeat_slow_interval interval,
    ADD COLUMN stale_threshold         interval,
    ADD COLUMN definitive_dead_cutoff  interval,
    ADD COLUMN lock_grace              interval,
    -- Whether the instance held and verified its alive lock at its last heartbeat. While
    -- it is true, a vanished lock means the session ended: the instance is dead unless it
    -- proves life (a heartbeat that sets it false) within its lock_grace.
    ADD COLUMN holds_alive_lock        boolean NOT NULL DEFAULT false;

-- When an observer first saw an instance's alive lock missing while the row said it was
-- held: the start of the instance's grace. Written only on a change (a lock vanishing or
-- coming back), so a fleet with nothing changing causes no writes. A stamp belongs to one
-- server lifetime: after a restart or a failover nobody holds any lock, and every
-- instance gets its grace anew from the first look.
CREATE TABLE alive_lock_absences (
    instance_id       uuid        PRIMARY KEY,
    missing_since     timestamptz NOT NULL,
    server_started_at timestamptz NOT NULL
);

-- The rules of the table below (see instance_states), for one instance. p_missing_for is how long the lock has
-- been seen missing (NULL: not stamped yet, which counts as just seen).
CREATE FUNCTION instance_state_rule(p_locked boolean, p_holds_alive_lock boolean, p_heartbeat_age interval,
                                    p_stale interval, p_dead interval, p_missing_for interval, p_grace interval)
    RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN p_locked AND p_heartbeat_age >= p_dead THEN 'zombie'
        WHEN p_locked AND p_heartbeat_age < p_stale THEN 'alive'
        WHEN p_locked THEN 'lock_only'
        WHEN p_heartbeat_age >= p_stale THEN 'stale'
        WHEN p_holds_alive_lock AND coalesce(p_missing_for < p_grace, true) THEN 'lock_lost'
        WHEN p_holds_alive_lock THEN 'stale'
        ELSE 'heartbeat_only'
    END
$$;

-- Every instance's state, by the rules below, evaluated on the database clock. Timing
-- comes from the row; the arguments only fill in for rows that carry none.
--
--   zombie          lock held, heartbeat older than definitive_dead_cutoff  (dead)
--   alive           lock held, heartbeat fresher than stale_threshold
--   lock_only       lock held, heartbeat stale                              (alive)
--   stale           no lock, heartbeat older than stale_threshold           (dead)
--   lock_lost       no lock although the row says held, within lock_grace   (alive: proving life)
--   stale           no lock although the row says held, past lock_grace     (dead: no proof of life)
--   heartbeat_only  no lock, the row says not held, heartbeat fresh
--
-- On a hot standby pg_locks does not show the primary's locks, so no verdict rests on
-- them there: lock_held is NULL, a fresh heartbeat is heartbeat_only and a stale one stale.
--
-- SECURITY DEFINER so that observers with only SELECT (and EXECUTE) can stamp absences;
-- in a read-only transaction or on a standby nothing is written, and an unstamped
-- absence counts as just seen.
CREATE FUNCTION instance_states(
        p_stale_threshold        interval DEFAULT '90 seconds',
        p_definitive_dead_cutoff interval DEFAULT '5 minutes',
        p_instance_id            uuid     DEFAULT NULL)
    RETURNS TABLE (instance_id uuid, service_name text, state text, alive boolean,
                   lock_held boolean, last_heartbeat_at timestamptz)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
    -- A generic plan cannot see that p_instance_id is NULL, and may then nest-loop every
    -- instance over every lock: a thousand times slower at 10,000 instances.
    SET plan_cache_mode = force_custom_plan
    -- The per-row stamp lookup inflates the cost estimate past jit_above_cost, and JIT
    -- compiling the plan takes 40 times longer than running it.
    SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := pg_catalog.now();
    v_started timestamptz := pg_catalog.pg_postmaster_start_time();
BEGIN
    IF pg_catalog.pg_is_in_recovery() THEN
        RETURN QUERY
        SELECT i.instance_id, i.service_name, v.state, v.state = 'heartbeat_only', NULL::boolean, i.last_heartbeat_at
          FROM instances i
         CROSS JOIN LATERAL (SELECT CASE WHEN i.last_heartbeat_at > v_now - coalesce(i.stale_threshold, p_stale_threshold)
                                         THEN 'heartbeat_only' ELSE 'stale' END AS state) v
         WHERE p_instance_id IS NULL OR i.instance_id = p_instance_id;
        RETURN;
    END IF;

    IF pg_catalog.current_setting('transaction_read_only') = 'on' THEN
        RETURN QUERY
        WITH cur AS MATERIALIZED (
            SELECT i.instance_id, i.service_name, i.last_heartbeat_at, i.holds_alive_lock,
                   coalesce(i.stale_threshold, p_stale_threshold) AS stale,
                   coalesce(i.definitive_dead_cutoff, p_definitive_dead_cutoff) AS dead,
                   coalesce(i.lock_grace, interval '1 second') AS grace,
                   (i.lock_classid, i.lock_objid) IN (SELECT l.classid, l.objid FROM bigint_advisory_locks l
                                                       WHERE l.granted) AS locked
              FROM instances i
             WHERE p_instance_id IS NULL OR i.instance_id = p_instance_id)
        SELECT c.instance_id, c.service_name, s.state,
               s.state IN ('alive', 'lock_only', 'lock_lost', 'heartbeat_only'), c.locked, c.last_heartbeat_at
          FROM cur c
          LEFT JOIN alive_lock_absences a ON a.instance_id = c.instance_id AND a.server_started_at = v_started
         CROSS JOIN LATERAL (SELECT instance_state_rule(c.locked, c.holds_alive_lock, v_now - c.last_heartbeat_at,
                                                        c.stale, c.dead, v_now - a.missing_since, c.grace) AS state) s;
        RETURN;
    END IF;

    -- Only instances whose row says held while no session holds the lock need their
    -- absence stamp, so the stamps are read per such row, never joined to every row.
    RETURN QUERY
    WITH cur AS MATERIALIZED (
        SELECT i.instance_id, i.service_name, i.last_heartbeat_at, i.holds_alive_lock,
               coalesce(i.stale_threshold, p_stale_threshold) AS stale,
               coalesce(i.definitive_dead_cutoff, p_definitive_dead_cutoff) AS dead,
               coalesce(i.lock_grace, interval '1 second') AS grace,
               -- A hashed subplan: pg_locks is read once and probed per instance.
               (i.lock_classid, i.lock_objid) IN (SELECT l.classid, l.objid FROM bigint_advisory_locks l
                                                   WHERE l.granted) AS locked
          FROM instances i
         WHERE p_instance_id IS NULL OR i.instance_id = p_instance_id),
    missing AS MATERIALIZED (
        SELECT c.instance_id FROM cur c WHERE c.holds_alive_lock AND NOT c.locked),
    known AS MATERIALIZED (
        SELECT a.instance_id, a.missing_since
          FROM alive_lock_absences a JOIN missing m ON m.instance_id = a.instance_id
         WHERE a.server_started_at = v_started),
    stamped AS (
        INSERT INTO alive_lock_absences AS a (instance_id, missing_since, server_started_at)
        SELECT m.instance_id, v_now, v_started FROM missing m
         WHERE NOT EXISTS (SELECT 1 FROM known k WHERE k.instance_id = m.instance_id)
        ON CONFLICT ON CONSTRAINT alive_lock_absences_pkey DO UPDATE
           SET missing_since = excluded.missing_since, server_started_at = excluded.server_started_at
        RETURNING a.instance_id, a.missing_since),
    cleared AS (
        DELETE FROM alive_lock_absences a
         WHERE (p_instance_id IS NULL OR a.instance_id = p_instance_id)
           AND NOT EXISTS (SELECT 1 FROM missing m WHERE m.instance_id = a.instance_id)
        RETURNING 1),
    since AS (
        SELECT k.instance_id, k.missing_since FROM known k
        UNION ALL
        SELECT n.instance_id, n.missing_since FROM stamped n)
    SELECT c.instance_id, c.service_name, s.state,
           s.state IN ('alive', 'lock_only', 'lock_lost', 'heartbeat_only'), c.locked, c.last_heartbeat_at
      FROM cur c
     CROSS JOIN LATERAL (SELECT instance_state_rule(c.locked, c.holds_alive_lock, v_now - c.last_heartbeat_at,
                                                    c.stale, c.dead,
                                                    CASE WHEN c.holds_alive_lock AND NOT c.locked
                                                         THEN v_now - (SELECT max(x.missing_since) FROM since x
                                                                        WHERE x.instance_id = c.instance_id)
                                                    END,
                                                    c.grace) AS state) s;
END
$$;

-- Alive by the one verdict, with each row's own timing; rows without timing use the
-- defaults of instance_states. False for an unknown id.
CREATE FUNCTION is_instance_alive(p_instance_id uuid) RETURNS boolean
    LANGUAGE sql VOLATILE STRICT
    SET search_path FROM CURRENT
AS $$
    SELECT coalesce((SELECT s.alive FROM instance_states(p_instance_id => p_instance_id) s), false)
$$;

-- The original form: threshold_seconds is the stale threshold for rows that carry no
-- timing of their own; rows written by our heartbeat are judged by their own.
CREATE OR REPLACE FUNCTION is_instance_alive(p_instance_id uuid, threshold_seconds integer) RETURNS boolean
    LANGUAGE sql VOLATILE STRICT
    SET search_path FROM CURRENT
AS $$
    SELECT coalesce((SELECT s.alive
                       FROM instance_states(make_interval(secs => threshold_seconds),
                                            p_instance_id => p_instance_id) s), false)
$$;

-- Deletes the instances that are dead by instance_states (stale or zombie) and returns
-- their ids. The cutoffs are points in time, as before: now() - p_stale_cutoff is the
-- stale threshold and now() - p_definitive_dead_cutoff the definitive-dead cutoff for rows
-- that carry no timing of their own; without p_definitive_dead_cutoff such rows are never
-- deleted while their lock is held. A row that beats while this runs is kept.
CREATE OR REPLACE FUNCTION cleanup_stale_instances(p_stale_cutoff timestamptz,
                                                   p_definitive_dead_cutoff timestamptz DEFAULT NULL)
    RETURNS SETOF uuid
    LANGUAGE sql VOLATILE
    SET search_path FROM CURRENT
AS $$
    DELETE FROM instances i
     USING instance_states(now() - p_stale_cutoff,
                           coalesce(now() - p_definitive_dead_cutoff, interval '1000 years')) s
     WHERE s.instance_id = i.instance_id
       AND NOT s.alive
       AND i.last_heartbeat_at = s.last_heartbeat_at
    RETURNING i.instance_id
$$;
