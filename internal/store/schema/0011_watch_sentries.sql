-- compatible-from: 1
-- Older binaries keep working: this adds a column and a function, and replaces the
-- watcher's tick with one that also records the lock count.
--
-- Nobody has to look, even when every process that looks dies at once. The fleet's two
-- watchers stamp a vanished lock within a tick, and each notices the other's crash; the
-- reaper's leader stands in when neither ticks. When all three die together (a node that
-- ran them goes down), nothing was left to notice: the followers' rare polls found the
-- victims a minute later. So every agent is a sentry: it asks now and then how long ago a
-- watcher ticked, and stands in when none did lately. The fleet's sentries share one
-- pace, whatever the fleet's size: each asks about once per its count of peers times a
-- spacing, so the fleet asks about ten times a second in all and an agent once in up to a
-- minute. The count is the number of exclusive advisory locks the watcher saw at its
-- last tick, recorded here: a read of one row, where counting the instances
-- would cost every sentry O(fleet).

ALTER TABLE alive_lock_watch ADD COLUMN lock_count integer;

-- How long ago a watcher last read the locks, in seconds, and how many exclusive
-- advisory locks it saw then (the fleet's size, or more: other applications' locks
-- count too). No row when no watcher has ticked in this server lifetime.
CREATE FUNCTION alive_lock_watch_state() RETURNS TABLE (age float8, lock_count integer)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
    SELECT extract(epoch FROM pg_catalog.clock_timestamp() - w.watched_at)::float8, w.lock_count
      FROM alive_lock_watch w
     WHERE w.server_started_at = pg_catalog.pg_postmaster_start_time()
$$;

-- The watcher's tick, as in migration 0010, recording the lock count with the tick.
CREATE OR REPLACE FUNCTION watch_alive_locks(p_digest text)
    RETURNS TABLE (digest text, instance_id uuid, dead_in float8)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
DECLARE
    v_digest  text;
    v_locks   integer;
    v_started timestamptz := pg_catalog.pg_postmaster_start_time();
    v_now     timestamptz := pg_catalog.clock_timestamp();
    v_since   timestamptz;
BEGIN
    SELECT count(*)::integer, count(*)::text || ':' || coalesce(bit_xor(k.key), 0)::text || ':' || coalesce(sum(k.key), 0)::text
      INTO v_locks, v_digest
      FROM (SELECT (l.classid::bigint << 32) | l.objid::bigint AS key
              FROM bigint_advisory_locks l
             WHERE l.granted AND l.mode = 'ExclusiveLock') k;
    SELECT v_digest || '/' || count(*)::text || ':'
           || coalesce(bit_xor(pg_catalog.hashtextextended(a.instance_id::text || a.missing_since::text, 0)), 0)::text
      INTO v_digest
      FROM alive_lock_absences a;
    digest := v_digest;
    RETURN NEXT;
    IF pg_catalog.pg_is_in_recovery() THEN
        RETURN;
    END IF;
    -- The leases that expired since the previous tick (by either watcher; at most a
    -- minute back) are free: notified, so that followers need not poll for an expiry.
    SELECT w.watched_at INTO v_since FROM alive_lock_watch w;
    v_since := greatest(coalesce(v_since, v_now), v_now - interval '1 minute');
    PERFORM pg_catalog.pg_notify(events_channel(), 'free:' || l.name)
       FROM leases l
      WHERE l.expires_at <= v_now AND l.expires_at > v_since AND event_fits('free:' || l.name);
    -- And so are the unexpired leases whose holder is dead by its row and stamp (see
    -- migration 0010).
    PERFORM pg_catalog.pg_notify(events_channel(), 'free:' || l.name)
       FROM leases l
      WHERE l.expires_at > v_now AND l.holder_instance_id IS NOT NULL AND event_fits('free:' || l.name)
        AND NOT coalesce(instance_watched_alive(l.holder_instance_id), false);
    UPDATE alive_lock_watch w
       SET watched_at = greatest(w.watched_at, v_now), server_started_at = v_started, lock_count = v_locks;
    IF NOT FOUND THEN
        INSERT INTO alive_lock_watch AS w (singleton, watched_at, server_started_at, lock_count)
        VALUES (true, v_now, v_started, v_locks)
        ON CONFLICT (singleton) DO UPDATE
           SET watched_at = greatest(w.watched_at, excluded.watched_at), server_started_at = excluded.server_started_at,
               lock_count = excluded.lock_count;
    END IF;
    IF v_digest IS NOT DISTINCT FROM p_digest THEN
        RETURN;
    END IF;
    PERFORM stamp_alive_lock_absences(NULL::uuid);
    RETURN QUERY
        SELECT v_digest, a.instance_id,
               extract(epoch FROM a.missing_since + coalesce(i.lock_grace, interval '1 second') - pg_catalog.now())::float8
          FROM current_alive_lock_absences() a
          JOIN instances i ON i.instance_id = a.instance_id
         WHERE i.holds_alive_lock;
END
$$;
