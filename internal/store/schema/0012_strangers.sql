-- compatible-from: 1
-- Older binaries keep working: this adds a column, a table and functions, and replaces
-- functions with the same arguments and results. Two things change for them: their rows
-- record no claiming session (lock_pid stays NULL), so their locks count whoever holds
-- the key, as before; and the events and members channels get private names, which they
-- do not listen to, so their followers and WatchAlive find what changed by their polls
-- (it delays, never misleads) until they are upgraded.
--
-- A stranger's session can neither fake nor silence an instance.
--
-- pg_try_advisory_lock needs no privilege, and an instance's alive-lock key is derived
-- from its id: a role with nothing but CONNECT could take the key of an instance whose
-- session had just ended (a leader killed with -9) and keep it alive by the verdict until
-- its lease's ttl, or take it before the instance's own claim. Now the claim records the
-- backend that took the lock (instances.lock_pid), and the verdict counts a lock only
-- when that backend holds it. A key held by anyone else counts for nobody: the instance
-- is judged as if its lock were gone (dead after its grace unless it proves life by its
-- heartbeat), and its agent, whose claim fails, is told that a stranger holds the key
-- (alive_lock_holder) rather than that a duplicate of itself runs.
--
-- NOTIFY needs no privilege either, and the channels' names were derived from the
-- schema's: a stranger could wake every follower with free:<lease> payloads, or flood the
-- sessions that prove the agents' locks with large ones. The channels now have names
-- drawn at random when this migration runs, kept in a table that only the functions
-- below read: a role without USAGE on the schema cannot learn them.

-- The backend pid of the session that claimed the instance's alive lock (0: none, and
-- no lock counts; NULL: a row of an older binary, whose lock counts whoever holds it).
ALTER TABLE instances ADD COLUMN lock_pid integer;

-- Claims the lock, and records this session's backend on the instance's row when it has
-- one (the first heartbeat records it otherwise). True when the lock is this session's.
CREATE OR REPLACE FUNCTION claim_instance_alive_lock(p_instance_id uuid) RETURNS boolean
    LANGUAGE plpgsql VOLATILE STRICT
    SET search_path FROM CURRENT
AS $$
BEGIN
    IF NOT pg_catalog.pg_try_advisory_lock(instance_lock_key(p_instance_id)) THEN
        RETURN false;
    END IF;
    UPDATE instances i SET lock_pid = pg_catalog.pg_backend_pid()
     WHERE i.instance_id = p_instance_id AND i.lock_pid IS DISTINCT FROM pg_catalog.pg_backend_pid();
    RETURN true;
END
$$;

-- Who holds an instance's key, after a claim that failed: the holder's backend pid, and
-- whether it is the backend the instance's row records (a second process with the same
-- instance id, or this instance's previous session not yet ended) or not (a stranger's
-- session, or an older binary's). Without a row, or a row that records no claimant, it
-- cannot tell, and says claimed: a duplicate, as before this migration. No row when
-- nobody holds the key. Reads pg_locks: sent only after a refused claim, rarely.
CREATE FUNCTION alive_lock_holder(p_instance_id uuid) RETURNS TABLE (holder_pid integer, claimed boolean)
    LANGUAGE sql STABLE STRICT
    SET search_path FROM CURRENT
AS $$
    SELECT l.pid, coalesce(l.pid = (SELECT i.lock_pid FROM instances i WHERE i.instance_id = p_instance_id), true)
      FROM bigint_advisory_locks l
     WHERE l.granted AND l.mode = 'ExclusiveLock'
       AND l.classid = lock_key_classid(instance_lock_key(p_instance_id))
       AND l.objid = lock_key_objid(instance_lock_key(p_instance_id))
$$;

-- Whether the lock is held by the session that claimed it.
CREATE OR REPLACE FUNCTION alive_lock_held(p_instance_id uuid) RETURNS boolean
    LANGUAGE sql STABLE STRICT
    SET search_path FROM CURRENT
AS $$
    SELECT EXISTS (
        SELECT 1 FROM bigint_advisory_locks l
         WHERE l.granted
           AND l.classid = lock_key_classid(instance_lock_key(p_instance_id))
           AND l.objid = lock_key_objid(instance_lock_key(p_instance_id))
           AND coalesce(l.pid = (SELECT i.lock_pid FROM instances i WHERE i.instance_id = p_instance_id), true))
$$;

-- The granted alive locks, each joined to its instance when the session that claimed it
-- holds it.
CREATE OR REPLACE VIEW instance_alive_locks AS
    SELECT i.instance_id, l.pid
      FROM instances i
      JOIN bigint_advisory_locks l
        ON l.granted AND l.classid = i.lock_classid AND l.objid = i.lock_objid
       AND (i.lock_pid IS NULL OR l.pid = i.lock_pid);

-- The one verdict, as in migration 0006, a lock counting only when held by its claimant.
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
              LEFT JOIN (SELECT l.classid, l.objid, l.pid FROM bigint_advisory_locks l
                          WHERE l.granted AND l.mode = 'ExclusiveLock') k
                     ON k.classid = i.lock_classid AND k.objid = i.lock_objid
                    AND (i.lock_pid IS NULL OR k.pid = i.lock_pid)
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

-- The verdict of given locks (migration 0008) with their holders' pids: p_lock_pid[i]
-- holds p_lock_classid[i], p_lock_objid[i]. The four-argument form stays for older
-- binaries; it cannot tell a stranger's lock from the claimant's.
CREATE FUNCTION instance_state_verdicts_of_locks(
        p_stale_threshold        interval,
        p_definitive_dead_cutoff interval,
        p_lock_classid           oid[],
        p_lock_objid             oid[],
        p_lock_pid               integer[])
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
              LEFT JOIN ROWS FROM (pg_catalog.unnest(p_lock_classid), pg_catalog.unnest(p_lock_objid),
                                   pg_catalog.unnest(p_lock_pid)) AS k(classid, objid, pid)
                     ON k.classid = i.lock_classid AND k.objid = i.lock_objid
                    AND (i.lock_pid IS NULL OR k.pid = i.lock_pid)) c
     CROSS JOIN LATERAL (SELECT instance_state_rule(coalesce(c.locked, false), c.holds_alive_lock AND c.locked IS NOT NULL,
                                                    c.last_heartbeat_at, pg_catalog.now(),
                                                    coalesce(c.stale_threshold, p_stale_threshold),
                                                    coalesce(c.definitive_dead_cutoff, p_definitive_dead_cutoff),
                                                    CASE WHEN c.holds_alive_lock AND NOT c.locked THEN
                                                        (SELECT a.missing_since FROM current_alive_lock_absences() a
                                                          WHERE a.instance_id = c.instance_id) END,
                                                    coalesce(c.lock_grace, interval '1 second')) AS state) s;
END;

-- The stamps, as in migration 0004, a lock counting only when held by its claimant.
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
        SELECT i.instance_id
          FROM instances i
          LEFT JOIN (SELECT DISTINCT l.classid, l.objid, l.pid FROM bigint_advisory_locks l WHERE l.granted) k
                 ON k.classid = i.lock_classid AND k.objid = i.lock_objid
                AND (i.lock_pid IS NULL OR k.pid = i.lock_pid)
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

-- The private channel names. One row.
CREATE TABLE event_channels (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    events    text NOT NULL,
    members   text NOT NULL
);
REVOKE ALL ON event_channels FROM PUBLIC;

-- <schema>_events_<token> and <schema>_members_<token>: the schema's name cut to 20
-- characters (a channel name has at most 63), and 96 bits from the server's strong random
-- source.
INSERT INTO event_channels (events, members)
SELECT left(pg_catalog.current_schema(), 20) || '_events_' || r.token,
       left(pg_catalog.current_schema(), 20) || '_members_' || r.token
  FROM (SELECT left(pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
                     pg_catalog.gen_random_uuid()::text || pg_catalog.gen_random_uuid()::text, 'UTF8')), 'hex'), 24) AS token) r;

-- The channels, for the functions of this schema only (their owner's rights).
CREATE OR REPLACE FUNCTION events_channel() RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$ SELECT c.events FROM event_channels c $$;

CREATE OR REPLACE FUNCTION members_channel() RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$ SELECT c.members FROM event_channels c $$;

REVOKE EXECUTE ON FUNCTION events_channel(), members_channel() FROM PUBLIC;

-- LISTEN and UNLISTEN for the calling session. They return the channel's public name
-- (<schema>_events, <schema>_members), never the private one.
CREATE OR REPLACE FUNCTION events_listen() RETURNS text
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
BEGIN
    EXECUTE pg_catalog.format('LISTEN %I', events_channel());
    RETURN left(pg_catalog.current_schema(), 50) || '_events';
END
$$;

CREATE OR REPLACE FUNCTION members_listen() RETURNS text
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
BEGIN
    EXECUTE pg_catalog.format('LISTEN %I', members_channel());
    RETURN left(pg_catalog.current_schema(), 50) || '_members';
END
$$;

CREATE OR REPLACE FUNCTION members_unlisten() RETURNS text
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
BEGIN
    EXECUTE pg_catalog.format('UNLISTEN %I', members_channel());
    RETURN left(pg_catalog.current_schema(), 50) || '_members';
END
$$;

-- The triggers' notifications, on the private channels (their owner's rights, to read
-- them; a pinned search_path, since a trigger runs with the writer's).
CREATE OR REPLACE FUNCTION notify_lease_free() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
BEGIN
    IF event_fits('free:' || OLD.name) THEN
        PERFORM pg_catalog.pg_notify(events_channel(), 'free:' || OLD.name);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION notify_lease_taken() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
BEGIN
    IF event_fits('taken:' || NEW.name) THEN
        PERFORM pg_catalog.pg_notify(events_channel(), 'taken:' || NEW.name);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION notify_instance_event() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_catalog.pg_notify(members_channel(), 'left:' || OLD.instance_id::text);
    ELSE
        PERFORM pg_catalog.pg_notify(members_channel(), 'joined:' || NEW.instance_id::text);
    END IF;
    RETURN NULL;
END
$$;

-- The watcher's tick, as in migration 0011; its digest tells holders apart too, so that
-- a key taken over by another session (a stranger's, once the claimant's ended) between
-- two ticks is seen as a change, and stamped.
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
      FROM (SELECT ((l.classid::bigint << 32) | l.objid::bigint) # (l.pid::bigint * 2654435761) AS key
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
