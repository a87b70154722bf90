-- compatible-from: 17
-- Older binaries keep working: this adds a nullable column and replaces functions with
-- the same arguments and results.
--
-- Every vanished alive lock is stamped and its death notified, however briefly it was held.
--
--   * A watcher stamps absences only at a tick whose digest differs from the previous
--     tick's. The digest covered the locks held and the stamps, but not the locks the rows
--     expect. A lock claimed and lost between two ticks (an instance that crashed within
--     a tick of its claim, or of the beat that recorded its lock held) left the digest as
--     it was: no tick stamped it, and a fresh watch's verdict kept the instance alive until
--     its heartbeat went stale or its leases expired. The digest now also covers the locks
--     the rows expect, through a generation that every row change bumps when it makes the
--     row expect a lock it did not (a row inserted or updated to record its lock held, or
--     to name a new lock session): a claim, or a beat that records a lock held, changes
--     the digest. The generation is kept in 64 rows (alive_lock_expectations), bumped in
--     the changing transaction, so that a tick's snapshot sees a bump exactly when it sees
--     the row's change, and a fleet that claims at once does not queue on one row; the
--     tick reads 64 rows, not the fleet's.
--   * A full tick returns the digest as its own stamping left the stamps, not as it found
--     them: otherwise another watcher could clear a stamp before this one's next tick, and
--     the state come back to what the first digest described, the stamp missing.
--   * Which absence has been notified is now the schema's, per stamp (notified_at), not
--     each watcher's per instance. A watcher that had notified an instance dead skipped
--     the instance's later absences (a new claim, lost again) for as long as its
--     remembered stamp and the new one were never both out of sight. A new stamp starts
--     unnotified; watch_alive_locks returns only unnotified absences; notify_dead_instances
--     notifies each stamp once, whichever watcher asks first, and returns the ids it finds
--     already notified without notifying them again.

ALTER TABLE alive_lock_absences ADD COLUMN notified_at timestamptz;

CREATE TABLE alive_lock_expectations (
    shard integer PRIMARY KEY CHECK (shard >= 0 AND shard < 64),
    generation bigint NOT NULL DEFAULT 0
);
INSERT INTO alive_lock_expectations (shard) SELECT pg_catalog.generate_series(0, 63);
REVOKE ALL ON alive_lock_expectations FROM PUBLIC;

-- Bumps the generation of the row's shard: the row now expects a lock it did not.
CREATE FUNCTION note_alive_lock_expected() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO alive_lock_expectations AS e (shard, generation)
    VALUES (pg_catalog.uuid_hash(NEW.instance_id) & 63, 1)
    ON CONFLICT (shard) DO UPDATE SET generation = e.generation + 1;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION note_alive_lock_expected() FROM PUBLIC;

CREATE TRIGGER instances_expect_lock_insert AFTER INSERT ON instances
    FOR EACH ROW WHEN (NEW.holds_alive_lock) EXECUTE FUNCTION note_alive_lock_expected();
-- A beat names its columns in every update, so the condition is what keeps the steady
-- beats from calling the function.
CREATE TRIGGER instances_expect_lock_update AFTER UPDATE OF holds_alive_lock, lock_pid ON instances
    FOR EACH ROW WHEN (NEW.holds_alive_lock AND (NOT OLD.holds_alive_lock OR OLD.lock_pid IS DISTINCT FROM NEW.lock_pid))
    EXECUTE FUNCTION note_alive_lock_expected();

-- As in migration 0020, and a stamp replaced for a new lock session starts unnotified.
CREATE OR REPLACE FUNCTION stamp_alive_lock_absences(p_instance_id uuid DEFAULT NULL) RETURNS integer
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
    SET plan_cache_mode = force_custom_plan
    SET jit = off
AS $$
DECLARE
    v_started timestamptz := pg_catalog.pg_postmaster_start_time();
    v_now     timestamptz;
    v_ids     uuid[];
    v_pids    integer[];
    v_missing integer;
BEGIN
    IF pg_catalog.pg_is_in_recovery() OR pg_catalog.current_setting('transaction_read_only') = 'on'
       OR NOT caller_participates() THEN
        RETURN NULL;
    END IF;
    SELECT coalesce(pg_catalog.array_agg(i.instance_id), '{}'), coalesce(pg_catalog.array_agg(i.lock_pid), '{}')
      INTO v_ids, v_pids
      FROM instances i
      LEFT JOIN (SELECT DISTINCT l.classid, l.objid, l.pid FROM bigint_advisory_locks l WHERE l.granted) k
             ON k.classid = i.lock_classid AND k.objid = i.lock_objid
            AND (i.lock_pid IS NULL OR k.pid = i.lock_pid)
     WHERE i.holds_alive_lock AND k.classid IS NULL
       AND (p_instance_id IS NULL OR i.instance_id = p_instance_id);
    v_now := pg_catalog.clock_timestamp(); -- after the read: each lock stamped vanished before it
    WITH missing AS (
        SELECT m.instance_id, m.lock_pid FROM ROWS FROM (pg_catalog.unnest(v_ids), pg_catalog.unnest(v_pids)) AS m(instance_id, lock_pid)),
    stamped AS (
        INSERT INTO alive_lock_absences AS a (instance_id, missing_since, server_started_at, lock_pid)
        SELECT m.instance_id, v_now, v_started, m.lock_pid FROM missing m
         WHERE NOT EXISTS (SELECT 1 FROM alive_lock_absences k
                            WHERE k.instance_id = m.instance_id AND k.server_started_at = v_started
                              AND k.lock_pid IS NOT DISTINCT FROM m.lock_pid)
        -- A stamp of an earlier server or lock session is replaced, unnotified; one of this
        -- very lock, committed by a concurrent stamper after this one's read, is kept as it
        -- is: its earlier time stands, and the vanishing is recorded once.
        ON CONFLICT ON CONSTRAINT alive_lock_absences_pkey DO UPDATE
           SET missing_since = excluded.missing_since, server_started_at = excluded.server_started_at,
               lock_pid = excluded.lock_pid, notified_at = NULL
         WHERE a.server_started_at IS DISTINCT FROM excluded.server_started_at
            OR a.lock_pid IS DISTINCT FROM excluded.lock_pid
        RETURNING a.instance_id),
    stamped_noted AS (
        INSERT INTO history (at, kind, instance_id)
        SELECT v_now, 'lock_vanished', s.instance_id FROM stamped s
        RETURNING 1),
    cleared AS (
        DELETE FROM alive_lock_absences a
         WHERE (p_instance_id IS NULL OR a.instance_id = p_instance_id)
           AND NOT EXISTS (SELECT 1 FROM missing m WHERE m.instance_id = a.instance_id)
        RETURNING a.instance_id, a.missing_since, a.server_started_at),
    cleared_noted AS (
        INSERT INTO history (at, kind, instance_id, host, service, since)
        SELECT v_now, 'lock_back', c.instance_id, i.host_name, i.service_name, c.missing_since
          FROM cleared c JOIN instances i ON i.instance_id = c.instance_id AND i.holds_alive_lock
         WHERE c.server_started_at = v_started
        RETURNING 1)
    SELECT count(*) INTO v_missing FROM missing;
    RETURN v_missing;
END
$$;

-- The digest of the stamps, the last part of a tick's digest.
CREATE FUNCTION alive_lock_absences_digest() RETURNS text
    LANGUAGE sql STABLE
    SET search_path FROM CURRENT
AS $$
    SELECT count(*)::text || ':'
           || coalesce(bit_xor(pg_catalog.hashtextextended(a.instance_id::text || a.missing_since::text, 0)), 0)::text
      FROM alive_lock_absences a
$$;
REVOKE ALL ON FUNCTION alive_lock_absences_digest() FROM PUBLIC;

-- As in migration 0012, with the rows' expected locks in the digest, the stamps' part of
-- the digest returned as the tick's own stamping left it, and only the absences not
-- notified yet returned. Had a tick returned the stamps as they were before it stamped,
-- and another watcher cleared its stamp before its next tick, the state could come back
-- to what the first digest described (an instance that left, came back and lost its lock)
-- while the stamp was missing.
CREATE OR REPLACE FUNCTION watch_alive_locks(p_digest text)
    RETURNS TABLE (digest text, instance_id uuid, dead_in float8)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
DECLARE
    v_head    text;
    v_locks   integer;
    v_started timestamptz := pg_catalog.pg_postmaster_start_time();
    v_now     timestamptz := pg_catalog.clock_timestamp();
    v_since   timestamptz;
    v_expects text;
BEGIN
    -- The generation of the locks the rows expect, read before the locks held: a row
    -- names a lock session only once that session holds the lock (the claim records it;
    -- a beat reports it after the claim), so a lock expected by the next reading and not
    -- by this one was held before the next reading of the locks, and is either in it or
    -- missing from it: either way the next tick sees what to stamp.
    SELECT sum(e.generation)::text INTO v_expects FROM alive_lock_expectations e;
    SELECT count(*)::integer, count(*)::text || ':' || coalesce(bit_xor(k.key), 0)::text || ':' || coalesce(sum(k.key), 0)::text
           || '/' || v_expects
      INTO v_locks, v_head
      FROM (SELECT ((l.classid::bigint << 32) | l.objid::bigint) # (l.pid::bigint * 2654435761) AS key
              FROM bigint_advisory_locks l
             WHERE l.granted AND l.mode = 'ExclusiveLock') k;
    digest := v_head || '/' || alive_lock_absences_digest();
    IF pg_catalog.pg_is_in_recovery() THEN
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT w.watched_at INTO v_since FROM alive_lock_watch w;
    v_since := greatest(coalesce(v_since, v_now), v_now - interval '1 minute');
    PERFORM pg_catalog.pg_notify(events_channel(), 'free:' || l.name)
       FROM leases l
      WHERE l.expires_at <= v_now AND l.expires_at > v_since AND event_fits('free:' || l.name);
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
    IF digest IS NOT DISTINCT FROM p_digest THEN
        RETURN NEXT;
        RETURN;
    END IF;
    PERFORM stamp_alive_lock_absences(NULL::uuid);
    digest := v_head || '/' || alive_lock_absences_digest();
    RETURN NEXT;
    RETURN QUERY
        SELECT digest, a.instance_id,
               extract(epoch FROM a.missing_since + coalesce(i.lock_grace, interval '1 second') - pg_catalog.now())::float8
          FROM alive_lock_absences a
          JOIN instances i ON i.instance_id = a.instance_id AND i.lock_pid IS NOT DISTINCT FROM a.lock_pid
         WHERE a.server_started_at = v_started AND a.notified_at IS NULL AND i.holds_alive_lock;
END
$$;

-- As in migration 0020, and each stamp notified once: the instance's current stamp is
-- marked notified by whoever notifies it first; an id whose current stamp is marked
-- already is returned without a second notification. An instance dead with no current
-- stamp (by its heartbeat alone) is notified as before.
CREATE OR REPLACE FUNCTION notify_dead_instances(p_ids uuid[]) RETURNS SETOF uuid
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
DECLARE
    v_channel  text := events_channel();
    v_members  text := members_channel();
    v_started  timestamptz := pg_catalog.pg_postmaster_start_time();
    v_id       uuid;
    v_lease    text;
    v_notified timestamptz;
    v_stamped  boolean;
BEGIN
    FOR v_id IN SELECT DISTINCT u FROM pg_catalog.unnest(p_ids) u LOOP
        IF coalesce((SELECT s.alive FROM instance_state_verdicts(p_instance_id => v_id) s), false) THEN
            CONTINUE;
        END IF;
        -- The current stamp's row, locked: two watchers that ask at once notify it once.
        SELECT true, a.notified_at INTO v_stamped, v_notified
          FROM alive_lock_absences a
          JOIN instances i ON i.instance_id = a.instance_id AND i.lock_pid IS NOT DISTINCT FROM a.lock_pid
         WHERE a.instance_id = v_id AND a.server_started_at = v_started
           FOR UPDATE OF a;
        IF v_notified IS NOT NULL THEN
            RETURN NEXT v_id;
            CONTINUE;
        END IF;
        IF v_stamped THEN
            UPDATE alive_lock_absences a SET notified_at = pg_catalog.clock_timestamp() WHERE a.instance_id = v_id;
        END IF;
        PERFORM history_note_dead(v_id);
        PERFORM pg_catalog.pg_notify(v_members, 'dead:' || v_id::text);
        FOR v_lease IN SELECT l.name FROM leases l
                        WHERE l.holder_instance_id = v_id AND l.expires_at >= pg_catalog.now() AND event_fits('free:' || l.name) LOOP
            PERFORM pg_catalog.pg_notify(v_channel, 'free:' || v_lease);
        END LOOP;
        RETURN NEXT v_id;
    END LOOP;
END
$$;
