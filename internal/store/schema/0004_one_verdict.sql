-- compatible-from: 1
-- Older binaries keep working: the new columns are nullable or defaulted, and
-- is_instance_alive(uuid, integer) and cleanup_stale_instances keep their signatures.
-- One liveness verdict. instance_state_verdicts (with instance_state_rule) is the only
-- place where an instance's state is defined; is_instance_alive, cleanup_stale_instances
-- and the Go readers read it through instance_states, the exporter directly (after
-- stamp_alive_lock_absences, as instance_states does). Each instance records its own
-- timing, so every observer judges it by the settings it actually runs with.

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

-- Finds the instance whose alive-lock key a pg_locks row holds with one index lookup per
-- lock, so that classifying a few thousand locks does not hash every instance.
CREATE INDEX instances_lock_key_idx ON instances (lock_classid, lock_objid);

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

-- The rules of the table below (see instance_state_verdicts), for one instance.
-- p_missing_for is how long the lock has been seen missing (NULL: not stamped yet, which
-- counts as just seen).
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

-- The stamps of this server lifetime, for the verdict below; with its owner's rights, so
-- that observers need no grant on alive_lock_absences.
CREATE FUNCTION current_alive_lock_absences() RETURNS TABLE (instance_id uuid, missing_since timestamptz)
    LANGUAGE sql STABLE SECURITY DEFINER
    -- A stamp lives only while a lock is missing: few rows, so the planner hashes these
    -- rather than the instances.
    ROWS 10
    SET search_path FROM CURRENT
AS $$
    SELECT a.instance_id, a.missing_since FROM alive_lock_absences a
     WHERE a.server_started_at = pg_catalog.pg_postmaster_start_time()
$$;

-- The one verdict: every instance's state, by the rules below, evaluated on the database
-- clock. Timing comes from the row; the arguments only fill in for rows that carry none.
--
--   zombie          lock held, heartbeat older than definitive_dead_cutoff  (dead)
--   alive           lock held, heartbeat fresher than stale_threshold
--   lock_only       lock held, heartbeat stale                              (alive)
--   stale           no lock, heartbeat older than stale_threshold           (dead)
--   lock_lost       no lock although the row says held, within lock_grace   (alive: proving life)
--   stale           no lock although the row says held, past lock_grace     (dead: no proof of life)
--   heartbeat_only  no lock, the row says not held, heartbeat fresh
--
-- The lock's absence is timed from its stamp (see instance_states, which writes them);
-- an unstamped absence counts as just seen. On a hot standby pg_locks does not show the
-- primary's locks, so no verdict rests on them there: lock_held is NULL, a fresh
-- heartbeat is heartbeat_only and a stale one stale.
--
-- This function writes nothing. It is plain SQL, stable, without SET clauses, and its
-- body is bound at creation (BEGIN ATOMIC), so the planner inlines it into the calling
-- statement: a caller that aggregates gets one pass over the instances with no
-- intermediate result. Locks are matched by a hash join of the instances' stored key
-- halves against the granted locks, read once.
CREATE FUNCTION instance_state_verdicts(
        p_stale_threshold        interval DEFAULT '90 seconds',
        p_definitive_dead_cutoff interval DEFAULT '5 minutes',
        p_instance_id            uuid     DEFAULT NULL)
    RETURNS TABLE (instance_id uuid, service_name text, state text, alive boolean,
                   lock_held boolean, last_heartbeat_at timestamptz)
    LANGUAGE sql STABLE
BEGIN ATOMIC
    SELECT c.instance_id, c.service_name, s.state,
           s.state IN ('alive', 'lock_only', 'lock_lost', 'heartbeat_only'), c.locked, c.last_heartbeat_at
      FROM (SELECT i.instance_id, i.service_name, i.last_heartbeat_at, i.holds_alive_lock,
                   i.stale_threshold, i.definitive_dead_cutoff, i.lock_grace,
                   CASE WHEN NOT (SELECT pg_catalog.pg_is_in_recovery()) THEN k.classid IS NOT NULL END AS locked
              FROM instances i
              LEFT JOIN (SELECT DISTINCT l.classid, l.objid FROM bigint_advisory_locks l WHERE l.granted) k
                     ON k.classid = i.lock_classid AND k.objid = i.lock_objid
             WHERE p_instance_id IS NULL OR i.instance_id = p_instance_id) c
      LEFT JOIN current_alive_lock_absences() a
             ON c.holds_alive_lock AND NOT c.locked AND a.instance_id = c.instance_id
     CROSS JOIN LATERAL (SELECT instance_state_rule(coalesce(c.locked, false), c.holds_alive_lock AND c.locked IS NOT NULL,
                                                    pg_catalog.now() - c.last_heartbeat_at,
                                                    coalesce(c.stale_threshold, p_stale_threshold),
                                                    coalesce(c.definitive_dead_cutoff, p_definitive_dead_cutoff),
                                                    pg_catalog.now() - a.missing_since,
                                                    coalesce(c.lock_grace, interval '1 second')) AS state) s;
END;

-- Stamps absences for the verdict: an instance whose row says held while no session
-- holds its lock gets a stamp (once), and a stamp whose instance is no longer missing
-- its lock is cleared. Nothing is written when nothing changed, in a read-only
-- transaction or on a standby. SECURITY DEFINER so that observers with only SELECT (and
-- EXECUTE) can stamp. Returns how many instances are missing their lock.
CREATE FUNCTION stamp_alive_lock_absences(p_instance_id uuid DEFAULT NULL) RETURNS integer
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
    -- A generic plan cannot see that p_instance_id is NULL and, with pg_locks estimated at
    -- one row, may nest-loop every instance over every lock: 10 times slower at 1,000
    -- instances.
    SET plan_cache_mode = force_custom_plan
    SET jit = off
AS $$
DECLARE
    v_now     timestamptz := pg_catalog.now();
    v_started timestamptz := pg_catalog.pg_postmaster_start_time();
    v_missing integer;
BEGIN
    IF pg_catalog.pg_is_in_recovery() OR pg_catalog.current_setting('transaction_read_only') = 'on' THEN
        RETURN NULL;
    END IF;
    WITH missing AS MATERIALIZED (
        SELECT i.instance_id
          FROM instances i
          LEFT JOIN (SELECT DISTINCT l.classid, l.objid FROM bigint_advisory_locks l WHERE l.granted) k
                 ON k.classid = i.lock_classid AND k.objid = i.lock_objid
         WHERE i.holds_alive_lock AND k.classid IS NULL
           AND (p_instance_id IS NULL OR i.instance_id = p_instance_id)),
    stamped AS (
        INSERT INTO alive_lock_absences AS a (instance_id, missing_since, server_started_at)
        SELECT m.instance_id, v_now, v_started FROM missing m
         WHERE NOT EXISTS (SELECT 1 FROM alive_lock_absences k
                            WHERE k.instance_id = m.instance_id AND k.server_started_at = v_started)
        ON CONFLICT ON CONSTRAINT alive_lock_absences_pkey DO UPDATE
           SET missing_since = excluded.missing_since, server_started_at = excluded.server_started_at
        RETURNING 1),
    cleared AS (
        DELETE FROM alive_lock_absences a
         WHERE (p_instance_id IS NULL OR a.instance_id = p_instance_id)
           AND NOT EXISTS (SELECT 1 FROM missing m WHERE m.instance_id = a.instance_id)
        RETURNING 1)
    SELECT count(*) INTO v_missing FROM missing;
    RETURN v_missing;
END
$$;

-- Every instance's state by the one verdict (instance_state_verdicts), after stamping
-- absences (stamp_alive_lock_absences): what consumers read one instance or a whole
-- fleet with. SECURITY DEFINER, as before, so that a role with only EXECUTE can read it.
CREATE FUNCTION instance_states(
        p_stale_threshold        interval DEFAULT '90 seconds',
        p_definitive_dead_cutoff interval DEFAULT '5 minutes',
        p_instance_id            uuid     DEFAULT NULL)
    RETURNS TABLE (instance_id uuid, service_name text, state text, alive boolean,
                   lock_held boolean, last_heartbeat_at timestamptz)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
    -- A generic plan cannot see that p_instance_id is NULL, and would scan every instance
    -- to find one.
    SET plan_cache_mode = force_custom_plan
    -- The planner's cost estimate can pass jit_above_cost, and JIT compiling the plan
    -- takes far longer than running it.
    SET jit = off
    -- The result is a row per instance, kept in memory up to work_mem: about 80 bytes an
    -- instance, so the default 4 MB would spill 100,000 instances to a temporary file.
    SET work_mem = '32MB'
AS $$
BEGIN
    PERFORM stamp_alive_lock_absences(p_instance_id);
    RETURN QUERY SELECT * FROM instance_state_verdicts(p_stale_threshold, p_definitive_dead_cutoff, p_instance_id);
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
