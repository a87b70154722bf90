-- compatible-from: 1
-- Older binaries keep working: this only adds a function.
--
-- The verdict of locks read elsewhere. pg_locks is cluster-wide: every read copies the
-- server's whole lock table, whichever database holds the locks. An observer of many
-- databases on one server reads it once per look for all of them and hands each
-- database its granted exclusive bigint advisory locks; this judges the instances by
-- those, by the same rule as instance_state_verdicts (instance_state_rule, the absence
-- looked up only for a row that says "held" while its lock is missing, no lock state on
-- a standby), and reads nothing of pg_locks itself.

-- instance_state_verdicts's rows, the locks being p_lock_classid[i], p_lock_objid[i]:
-- the key halves of the advisory locks granted in ExclusiveLock mode on bigint keys
-- (objsubid 1) in this database, as pg_locks showed them. NULL arrays are no locks. No
-- two sessions hold one key exclusively, so the pairs are distinct as pg_locks gives
-- them, and no DISTINCT (a sort) is needed.
CREATE FUNCTION instance_state_verdicts_of_locks(
        p_stale_threshold        interval,
        p_definitive_dead_cutoff interval,
        p_lock_classid           oid[],
        p_lock_objid             oid[])
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
              LEFT JOIN ROWS FROM (pg_catalog.unnest(p_lock_classid), pg_catalog.unnest(p_lock_objid)) AS k(classid, objid)
                     ON k.classid = i.lock_classid AND k.objid = i.lock_objid) c
     CROSS JOIN LATERAL (SELECT instance_state_rule(coalesce(c.locked, false), c.holds_alive_lock AND c.locked IS NOT NULL,
                                                    c.last_heartbeat_at, pg_catalog.now(),
                                                    coalesce(c.stale_threshold, p_stale_threshold),
                                                    coalesce(c.definitive_dead_cutoff, p_definitive_dead_cutoff),
                                                    CASE WHEN c.holds_alive_lock AND NOT c.locked THEN
                                                        (SELECT a.missing_since FROM current_alive_lock_absences() a
                                                          WHERE a.instance_id = c.instance_id) END,
                                                    coalesce(c.lock_grace, interval '1 second')) AS state) s;
END;
