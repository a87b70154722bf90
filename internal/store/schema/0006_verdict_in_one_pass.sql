-- compatible-from: 1
-- Older binaries keep working: instance_state_verdicts keeps its signature and its
-- states, and the rest only adds a function.
--
-- The verdict in one pass: an observer that reads the whole fleet reads pg_locks and the
-- instances once per look, and no more than the statement that counted states before the
-- verdict existed.

-- The rules of instance_state_verdicts, for one instance, on points in time: comparing a
-- timestamp with now() less a threshold costs less per row than comparing intervals.
-- p_missing_since is when the lock was first seen missing (NULL: not stamped yet, which
-- counts as just seen). STABLE, not IMMUTABLE: timestamptz less an interval depends on
-- the time zone, and an immutable function with a stable body is not inlined (it would be
-- called once per instance, five times slower).
CREATE FUNCTION instance_state_rule(p_locked boolean, p_holds_alive_lock boolean, p_last_heartbeat_at timestamptz,
                                    p_now timestamptz, p_stale interval, p_dead interval,
                                    p_missing_since timestamptz, p_grace interval)
    RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN p_locked AND p_last_heartbeat_at <= p_now - p_dead THEN 'zombie'
        WHEN p_locked AND p_last_heartbeat_at > p_now - p_stale THEN 'alive'
        WHEN p_locked THEN 'lock_only'
        WHEN p_last_heartbeat_at <= p_now - p_stale THEN 'stale'
        WHEN p_holds_alive_lock AND coalesce(p_missing_since > p_now - p_grace, true) THEN 'lock_lost'
        WHEN p_holds_alive_lock THEN 'stale'
        ELSE 'heartbeat_only'
    END
$$;

-- The one verdict, as before (see its table in migration 0004), matched and timed more
-- cheaply:
-- - Only an exclusive lock on the key is an alive lock (claim_instance_alive_lock takes it
--   so). No two sessions hold one at once, so the granted locks need no DISTINCT (a sort
--   of every advisory lock) before the hash join.
-- - A stamp is looked up only for a row that says "held" while its lock is missing,
--   rather than joined to every row; such rows are few, except after a restart.
CREATE OR REPLACE FUNCTION instance_state_verdicts(
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
              LEFT JOIN (SELECT l.classid, l.objid FROM bigint_advisory_locks l
                          WHERE l.granted AND l.mode = 'ExclusiveLock') k
                     ON k.classid = i.lock_classid AND k.objid = i.lock_objid
             WHERE p_instance_id IS NULL OR i.instance_id = p_instance_id) c
     CROSS JOIN LATERAL (SELECT instance_state_rule(coalesce(c.locked, false), c.holds_alive_lock AND c.locked IS NOT NULL,
                                                    c.last_heartbeat_at, pg_catalog.now(),
                                                    coalesce(c.stale_threshold, p_stale_threshold),
                                                    coalesce(c.definitive_dead_cutoff, p_definitive_dead_cutoff),
                                                    CASE WHEN c.holds_alive_lock AND NOT c.locked THEN
                                                        (SELECT a.missing_since FROM current_alive_lock_absences() a
                                                          WHERE a.instance_id = c.instance_id) END,
                                                    coalesce(c.lock_grace, interval '1 second')) AS state) s;
END;

-- The interval form of the rule, which the verdict above no longer uses.
DROP FUNCTION instance_state_rule(boolean, boolean, interval, interval, interval, interval, interval);

-- Stamps absences after a verdict: p_seen_lost holds the instances the caller's verdict
-- called lock_lost (an unstamped absence counts as just seen, so stamping after the
-- verdict gives the states of stamping before it). When it is empty and no stamp stands
-- (a fleet where no lock vanished: the usual case) this reads nothing else and writes
-- nothing. Otherwise it stamps and clears exactly as stamp_alive_lock_absences() does,
-- from pg_locks itself: the ids passed in only decide whether to look, never what is
-- written.
CREATE FUNCTION stamp_alive_lock_absences_seen(p_seen_lost uuid[]) RETURNS integer
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
BEGIN
    IF coalesce(cardinality(p_seen_lost), 0) = 0 AND NOT EXISTS (SELECT 1 FROM alive_lock_absences) THEN
        RETURN 0;
    END IF;
    RETURN stamp_alive_lock_absences(NULL::uuid);
END
$$;
