-- compatible-from: 1
-- Older binaries keep working: this adds a column and replaces functions with the same
-- arguments and results.
--
-- A stamp counts only for the claim it was taken under.
--
-- A stamp (alive_lock_absences) says that the session that claimed an instance's alive
-- lock no longer holds it. After a server restart, or the end of its lock session, an
-- instance claims its lock again from a new session, and a stamp taken before that claim
-- is about the old session. So is one taken by a look that ran during the claim: pg_locks
-- shows the new lock the moment it is taken, while the claim's update of the row's
-- claimant (lock_pid) is not committed yet, so the look sees the key held by a stranger.
-- Such a stamp stays until the next look at the locks, and looks come with the watcher's
-- ticks, which come late on a server slowed down by a fleet reconnecting at once while
-- the watcher's record counts as fresh for five seconds (migration 0014). Until now the
-- stamp was the answer meanwhile: one lock grace after it, refused lease tries called the
-- instance dead and the watcher's ticks told its followers that its leases were free,
-- while it held its lock, counted itself alive and kept leading. Two processes were in
-- one lease's job at once, for up to 375 ms, a few times in two hours of faults.
--
-- Now a stamp records the claimant it found missing, and counts only while the row names
-- that claimant. A new claim (a new backend) makes the earlier stamps count for nothing:
-- the instance is judged by its lock as it is now, and a lock that vanishes again is
-- stamped anew. Stamps taken before this migration are given their row's claimant.

ALTER TABLE alive_lock_absences ADD COLUMN lock_pid integer;

UPDATE alive_lock_absences a SET lock_pid = i.lock_pid
  FROM instances i
 WHERE i.instance_id = a.instance_id;

-- The stamps of this server lifetime that count: those taken under the claim that the
-- instance's row names now.
CREATE OR REPLACE FUNCTION current_alive_lock_absences() RETURNS TABLE (instance_id uuid, missing_since timestamptz)
    LANGUAGE sql STABLE SECURITY DEFINER
    ROWS 10
    SET search_path FROM CURRENT
AS $$
    SELECT a.instance_id, a.missing_since
      FROM alive_lock_absences a
      JOIN instances i ON i.instance_id = a.instance_id AND i.lock_pid IS NOT DISTINCT FROM a.lock_pid
     WHERE a.server_started_at = pg_catalog.pg_postmaster_start_time()
$$;

-- As in migration 0010, counting only a stamp of the row's present claim.
CREATE OR REPLACE FUNCTION instance_watched_alive(p_instance_id uuid) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
    SELECT instance_state_rule(i.holds_alive_lock AND a.missing_since IS NULL, i.holds_alive_lock,
                               i.last_heartbeat_at, pg_catalog.now(),
                               coalesce(i.stale_threshold, interval '90 seconds'),
                               coalesce(i.definitive_dead_cutoff, interval '5 minutes'),
                               a.missing_since, coalesce(i.lock_grace, interval '1 second'))
           IN ('alive', 'lock_only', 'lock_lost', 'heartbeat_only')
      FROM instances i
      LEFT JOIN alive_lock_absences a
             ON a.instance_id = i.instance_id AND a.server_started_at = pg_catalog.pg_postmaster_start_time()
            AND a.lock_pid IS NOT DISTINCT FROM i.lock_pid
     WHERE i.instance_id = p_instance_id
$$;

-- As in migration 0012, and each stamp records the claimant found missing; a standing
-- stamp of another claimant is taken again, dated now.
CREATE OR REPLACE FUNCTION stamp_alive_lock_absences(p_instance_id uuid DEFAULT NULL) RETURNS integer
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
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
        SELECT i.instance_id, i.lock_pid
          FROM instances i
          LEFT JOIN (SELECT DISTINCT l.classid, l.objid, l.pid FROM bigint_advisory_locks l WHERE l.granted) k
                 ON k.classid = i.lock_classid AND k.objid = i.lock_objid
                AND (i.lock_pid IS NULL OR k.pid = i.lock_pid)
         WHERE i.holds_alive_lock AND k.classid IS NULL
           AND (p_instance_id IS NULL OR i.instance_id = p_instance_id)),
    stamped AS (
        INSERT INTO alive_lock_absences AS a (instance_id, missing_since, server_started_at, lock_pid)
        SELECT m.instance_id, v_now, v_started, m.lock_pid FROM missing m
         WHERE NOT EXISTS (SELECT 1 FROM alive_lock_absences k
                            WHERE k.instance_id = m.instance_id AND k.server_started_at = v_started
                              AND k.lock_pid IS NOT DISTINCT FROM m.lock_pid)
        ON CONFLICT ON CONSTRAINT alive_lock_absences_pkey DO UPDATE
           SET missing_since = excluded.missing_since, server_started_at = excluded.server_started_at,
               lock_pid = excluded.lock_pid
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
