-- compatible-from: 1
-- Older binaries keep working: this adds a table, functions and triggers, and replaces
-- functions with the same arguments and results. Their refused lease tries get cheaper
-- too. What they no longer get is membership on the events channel (joined:, left:,
-- dead:, now on <schema>_members): their watchers and Agent.WatchAlive fall back to
-- their polls for those, which delays and never misleads.
--
-- A fleet's agents pay O(1) each for liveness, whatever the fleet's size. Until now every
-- refused lease try, and every follower's look at who leads, judged the holder (and the
-- acquirer) by is_instance_alive, a read of pg_locks: a copy of the server's whole lock
-- table taken under every lock-manager partition, O(backends + locks), which also stalls
-- everyone else's lock acquisitions. With N agents trying every second that is O(N²).
--
-- Only the fleet's watcher reads pg_locks now (watch_alive_locks, a few times a second per
-- fleet), and it records that it does. While its record is fresh, is_instance_alive
-- answers from index lookups: the instance's row and its absence stamp, which the watcher
-- writes within a tick of a lock vanishing. A lock that vanished since the last tick is not
-- stamped yet, and counts as held: the full verdict would count it as just seen missing,
-- which is alive too (lock_lost, for the lock grace), so both agree but for the stamp's
-- moment, up to one tick plus the freshness below later. When no watcher ticks (none is
-- elected, or it is stuck), the full verdict answers, as before.
--
-- The watcher's digest covers the stamps as well as the locks: a stamp written by someone
-- else (a scrape's or a fallback verdict's) while the locks look the same is reconciled
-- on the next tick, so no stamp outlives its absence by more than a tick.
--
-- Membership has a channel of its own, <schema>_members (joined:, left:, dead:), which
-- only the agents that need it listen to (the watchers, Agent.WatchAlive): PostgreSQL
-- signals every listening backend of the database for each notification, so a fleet
-- whose every agent listened to every join paid O(N) per join, O(N²) for a fleet that
-- starts. The events channel keeps what followers wait for: free: and taken:.
--
-- Followers need no clock either: a lease that expires is notified free by the watcher's
-- next tick, as a release or a dead holder already is. And a lease taken is notified
-- (taken:<name>), so that followers woken by free:<name>
-- and waiting their turn go back to waiting instead of all trying at once.

-- When a watcher last read the locks, in this server lifetime. One row: whichever watcher
-- ticked last.
CREATE TABLE alive_lock_watch (
    singleton         boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    watched_at        timestamptz NOT NULL,
    server_started_at timestamptz NOT NULL
);

-- Whether a watcher has read the locks within the last second, in this server lifetime.
-- The watcher ticks every 250 ms; a second leaves room for a slow tick, and bounds how
-- much later than the full verdict a vanished lock is counted.
CREATE FUNCTION alive_lock_watch_is_fresh() RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
    SELECT EXISTS (SELECT 1 FROM alive_lock_watch w
                    WHERE w.server_started_at = pg_catalog.pg_postmaster_start_time()
                      AND w.watched_at > pg_catalog.clock_timestamp() - interval '1 second')
$$;

-- One instance's verdict from its row and its stamp only, by the rule of the one verdict
-- (instance_state_rule): a row that says "held" and has no stamp counts as locked (the
-- watcher stamps a vanished lock within a tick), one with a stamp as missing its lock
-- since the stamp. A row that does not say "held" is judged by its heartbeat alone. NULL
-- for an unknown id. Two index lookups; reads nothing of pg_locks.
CREATE FUNCTION instance_watched_alive(p_instance_id uuid) RETURNS boolean
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
     WHERE i.instance_id = p_instance_id
$$;

-- Alive by the one verdict: from the row and its stamp while a watcher ticks (see above),
-- the full verdict otherwise. False for an unknown id.
CREATE OR REPLACE FUNCTION is_instance_alive(p_instance_id uuid) RETURNS boolean
    LANGUAGE sql VOLATILE STRICT
    SET search_path FROM CURRENT
AS $$
    SELECT coalesce(CASE WHEN alive_lock_watch_is_fresh() THEN instance_watched_alive(p_instance_id)
                         ELSE (SELECT s.alive FROM instance_states(p_instance_id => p_instance_id) s) END,
                    false)
$$;

-- The watcher's tick, as in migration 0007, and three more things: it records that it read
-- the locks (alive_lock_watch); its digest covers the stamps (count and bit_xor of a hash
-- of each), so that a stamp another session wrote or cleared is reconciled with the locks
-- on the next tick even when the locks did not change; and it notifies free:<name> for
-- each lease that expired since the previous tick, and for each whose holder is dead by
-- its row and stamp (a hung holder, a zombie, is not a vanished lock).
CREATE OR REPLACE FUNCTION watch_alive_locks(p_digest text)
    RETURNS TABLE (digest text, instance_id uuid, dead_in float8)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
DECLARE
    v_digest  text;
    v_started timestamptz := pg_catalog.pg_postmaster_start_time();
    v_now     timestamptz := pg_catalog.clock_timestamp();
    v_since   timestamptz;
BEGIN
    SELECT count(*)::text || ':' || coalesce(bit_xor(k.key), 0)::text || ':' || coalesce(sum(k.key), 0)::text
      INTO v_digest
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
    -- And so are the unexpired leases whose holder is dead by its row and stamp: a holder
    -- whose heartbeat aged past its limits with its lock still held (a hung process: a
    -- zombie), or whose row is gone, is not told by notify_dead_instances, which follows
    -- vanished locks. Told on every tick until someone takes the lease, which the first
    -- woken follower does.
    PERFORM pg_catalog.pg_notify(events_channel(), 'free:' || l.name)
       FROM leases l
      WHERE l.expires_at > v_now AND l.holder_instance_id IS NOT NULL AND event_fits('free:' || l.name)
        AND NOT coalesce(instance_watched_alive(l.holder_instance_id), false);
    UPDATE alive_lock_watch w SET watched_at = greatest(w.watched_at, v_now), server_started_at = v_started;
    IF NOT FOUND THEN
        INSERT INTO alive_lock_watch AS w (singleton, watched_at, server_started_at)
        VALUES (true, v_now, v_started)
        ON CONFLICT (singleton) DO UPDATE
           SET watched_at = greatest(w.watched_at, excluded.watched_at), server_started_at = excluded.server_started_at;
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

-- Whether a payload fits a notification (under 8000 bytes): a lease whose name does not
-- is not notified, and its followers find it by their polls (a cut name would wake the
-- followers of another lease, or none).
CREATE FUNCTION event_fits(p_payload text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT pg_catalog.octet_length(p_payload) < 8000 $$;

-- taken:<name> when a lease gets a new epoch (taken, or taken over); renewals change no
-- epoch and notify nothing. Sent on commit, as the other events.
CREATE FUNCTION notify_lease_taken() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path FROM CURRENT
AS $$
BEGIN
    IF event_fits('taken:' || NEW.name) THEN
        PERFORM pg_catalog.pg_notify(left(TG_TABLE_SCHEMA, 50) || '_events', 'taken:' || NEW.name);
    END IF;
    RETURN NULL;
END
$$;

-- As in migration 0007, but for a name too long to notify (see event_fits), whose
-- deletion failed.
CREATE OR REPLACE FUNCTION notify_lease_free() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path FROM CURRENT
AS $$
BEGIN
    IF event_fits('free:' || OLD.name) THEN
        PERFORM pg_catalog.pg_notify(left(TG_TABLE_SCHEMA, 50) || '_events', 'free:' || OLD.name);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER leases_notify_taken_insert AFTER INSERT ON leases
    FOR EACH ROW EXECUTE FUNCTION notify_lease_taken();
CREATE TRIGGER leases_notify_taken_update AFTER UPDATE OF epoch ON leases
    FOR EACH ROW WHEN (OLD.epoch IS DISTINCT FROM NEW.epoch) EXECUTE FUNCTION notify_lease_taken();

-- The channel of membership events: <schema>_members (the schema's name cut to 50
-- characters). Payloads "<kind>:<id>": joined:, left:, dead:<instance id>.
CREATE FUNCTION members_channel() RETURNS text
    LANGUAGE sql STABLE
    SET search_path FROM CURRENT
AS $$ SELECT left(pg_catalog.current_schema(), 50) || '_members' $$;

-- LISTEN on the members channel, and UNLISTEN, for the session that calls it.
CREATE FUNCTION members_listen() RETURNS text
    LANGUAGE plpgsql VOLATILE
    SET search_path FROM CURRENT
AS $$
DECLARE
    v_channel text := members_channel();
BEGIN
    EXECUTE pg_catalog.format('LISTEN %I', v_channel);
    RETURN v_channel;
END
$$;

CREATE FUNCTION members_unlisten() RETURNS text
    LANGUAGE plpgsql VOLATILE
    SET search_path FROM CURRENT
AS $$
DECLARE
    v_channel text := members_channel();
BEGIN
    EXECUTE pg_catalog.format('UNLISTEN %I', v_channel);
    RETURN v_channel;
END
$$;

-- joined: and left: go to the members channel.
CREATE OR REPLACE FUNCTION notify_instance_event() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_catalog.pg_notify(left(TG_TABLE_SCHEMA, 50) || '_members', 'left:' || OLD.instance_id::text);
    ELSE
        PERFORM pg_catalog.pg_notify(left(TG_TABLE_SCHEMA, 50) || '_members', 'joined:' || NEW.instance_id::text);
    END IF;
    RETURN NULL;
END
$$;

-- As in migration 0007, with dead:<id> on the members channel and free:<name> on the
-- events channel.
CREATE OR REPLACE FUNCTION notify_dead_instances(p_ids uuid[]) RETURNS SETOF uuid
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
DECLARE
    v_channel text := events_channel();
    v_members text := members_channel();
    v_id      uuid;
    v_lease   text;
BEGIN
    FOR v_id IN SELECT DISTINCT u FROM pg_catalog.unnest(p_ids) u LOOP
        IF coalesce((SELECT s.alive FROM instance_state_verdicts(p_instance_id => v_id) s), false) THEN
            CONTINUE;
        END IF;
        PERFORM pg_catalog.pg_notify(v_members, 'dead:' || v_id::text);
        FOR v_lease IN SELECT l.name FROM leases l
                        WHERE l.holder_instance_id = v_id AND l.expires_at >= pg_catalog.now() AND event_fits('free:' || l.name) LOOP
            PERFORM pg_catalog.pg_notify(v_channel, 'free:' || v_lease);
        END LOOP;
        RETURN NEXT v_id;
    END LOOP;
END
$$;
