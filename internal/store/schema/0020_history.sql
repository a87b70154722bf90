-- compatible-from: 17
-- Older binaries keep working: this adds a table and functions, and replaces triggers and
-- functions with ones of the same arguments and results that also write the history.
--
-- What happened at 03:12: a durable, bounded history of leaderships and deaths, written by
-- the statements that already change that state (a lease taken or let go, an instance
-- joining, its lock stamped vanished, its death, its removal), never by a heartbeat or a
-- renewal. Every time in it is the database's clock, so that every observer computes the
-- same failover times from it; an event's own time is the clock when its row was written
-- (clock_timestamp, not the transaction's start: an acquisition that waited for a
-- release's row lock is recorded after that release, as it happened):
--   - acquired: a lease taken (how: free, never held within the history; released, after a
--     holder let it go; expired, taken over from a row past its expiry; holder_dead, taken
--     over from a holder dead by the verdict). since is when it was last held (the end of
--     the previous leadership): at - since is the time it was leaderless. dead_at is when
--     a dead holder became dead by the rule: at - dead_at is the takeover's own time.
--   - ended: a leadership's end (how: released; stepped_down, let go after its holder lost
--     it, reason one of liveness.LostReason; expired; holder_dead, at the holder's last
--     sign of life, or at its acquisition when it took the lease after that). since is when
--     it began. An expiry or a death is written when the next holder takes the lease: until
--     then the lease's row says it.
--   - joined, left (a graceful removal), reaped (a dead instance's row removed).
--   - lock_vanished (the watcher's stamp), lock_back (its lock held again before the
--     instance's row went; since: when it had vanished).
--   - dead: an instance dead by the verdict; at is when the rule made it dead (its lock's
--     grace or its heartbeat's threshold ran out), since its last sign of life (the lock's
--     vanishing as stamped, or its last heartbeat): at - since is the detection time.
--     Written once per death, by whoever sees it first: the watcher notifying it, a
--     takeover of its lease, or the removal of its row.
-- Pruned by the reaper (history_prune), a bounded batch per round.

-- No CHECK constraint: each would be prepared again for every row a trigger inserts (an
-- insert of its own), about 10 us a row; the readers skip what the schema never writes (an
-- unknown kind, an infinite time).
CREATE TABLE history (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL,
    kind        text NOT NULL,
    lease_name  text,
    epoch       bigint,
    instance_id uuid,
    host        text,
    service     text,
    how         text,
    reason      text,
    since       timestamptz,
    dead_at     timestamptz
);
-- The status page reads a window's newest rows, whatever the history holds before it.
CREATE INDEX history_at_idx ON history (at);
CREATE INDEX history_lease_idx ON history (lease_name, at) WHERE lease_name IS NOT NULL;
CREATE INDEX history_instance_idx ON history (instance_id, at) WHERE instance_id IS NOT NULL;
-- One death per vanishing: the watcher, a takeover and the reaper may each see it.
CREATE UNIQUE INDEX history_one_death_idx ON history (instance_id, since) WHERE kind = 'dead';

-- When an instance last showed life and when the verdict's rule (instance_state_rule) made
-- it dead, from its row's timing (instance_state_verdicts' defaults where it records
-- none): a lock stamped vanished is dead a grace later, or at its heartbeat's threshold if
-- that came first; a lock held with a heartbeat past the definitive-dead cutoff is a
-- zombie; otherwise the heartbeat's threshold. how names which. Meaningful only for an
-- instance the verdict calls dead. p_locked: whether its lock is held now.
CREATE FUNCTION history_death_times(p_holds_alive_lock boolean, p_locked boolean, p_last_heartbeat_at timestamptz,
                                    p_missing_since timestamptz, p_grace interval, p_stale interval, p_dead interval)
    RETURNS TABLE (last_alive_at timestamptz, dead_at timestamptz, how text)
    LANGUAGE sql IMMUTABLE
    SET search_path FROM CURRENT
AS $$
    SELECT CASE WHEN k.by_lock THEN p_missing_since ELSE p_last_heartbeat_at END,
           CASE WHEN k.by_lock THEN k.lock_dead
                WHEN k.zombie THEN p_last_heartbeat_at + coalesce(p_dead, interval '5 minutes')
                ELSE k.stale_dead END,
           CASE WHEN k.by_lock THEN 'lock_lost' WHEN k.zombie THEN 'zombie' ELSE 'heartbeat_stale' END
      FROM (SELECT d.lock_dead, d.stale_dead, coalesce(d.lock_dead <= d.stale_dead, false) AS by_lock,
                   d.lock_dead IS NULL AND p_holds_alive_lock AND p_locked AS zombie
              FROM (SELECT CASE WHEN p_holds_alive_lock THEN p_missing_since + coalesce(p_grace, interval '1 second') END
                               AS lock_dead,
                           p_last_heartbeat_at + coalesce(p_stale, interval '90 seconds') AS stale_dead) d) k
$$;

-- history_death_times of an instance's row; no row when it has none.
CREATE FUNCTION history_death_of(p_instance_id uuid)
    RETURNS TABLE (last_alive_at timestamptz, dead_at timestamptz, how text, host text, service text)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
    SELECT d.last_alive_at, d.dead_at, d.how, i.host_name, i.service_name
      FROM instances i
      LEFT JOIN alive_lock_absences a
             ON a.instance_id = i.instance_id AND a.server_started_at = pg_catalog.pg_postmaster_start_time()
            AND a.lock_pid IS NOT DISTINCT FROM i.lock_pid
     CROSS JOIN LATERAL history_death_times(i.holds_alive_lock,
                            EXISTS (SELECT 1 FROM instance_alive_locks k WHERE k.instance_id = i.instance_id),
                            i.last_heartbeat_at, a.missing_since, i.lock_grace, i.stale_threshold,
                            i.definitive_dead_cutoff) d
     WHERE i.instance_id = p_instance_id
$$;

-- Records an instance's death, once: called for an instance the verdict calls dead.
-- Returns whether this call wrote it.
CREATE FUNCTION history_note_dead(p_instance_id uuid) RETURNS boolean
    LANGUAGE sql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
    WITH noted AS (
        INSERT INTO history (at, kind, instance_id, host, service, how, since, dead_at)
        SELECT least(d.dead_at, pg_catalog.clock_timestamp()), 'dead', p_instance_id, d.host, d.service, d.how, d.last_alive_at,
               least(d.dead_at, pg_catalog.clock_timestamp())
          FROM history_death_of(p_instance_id) d
        ON CONFLICT (instance_id, since) WHERE kind = 'dead' DO NOTHING
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM noted)
$$;

-- Who held lease p_name at p_at, by the history: the acquisition in force then, and its
-- end when the history has it (NULL: none recorded yet; the current holder, or one whose
-- expiry or death is recorded when the next holder takes the lease). No row: nobody held
-- it then, or the history no longer reaches that far back.
CREATE FUNCTION lease_holder_at(p_name text, p_at timestamptz)
    RETURNS TABLE (epoch bigint, holder_instance_id uuid, holder_host text, acquired_at timestamptz, how text,
                   ended_at timestamptz, ended_how text)
    LANGUAGE sql STABLE
    SET search_path FROM CURRENT
AS $$
    SELECT a.epoch, a.instance_id, a.host, a.at, a.how, e.at, e.how
      FROM (SELECT h.epoch, h.instance_id, h.host, h.at, h.how FROM history h
             WHERE h.lease_name = p_name AND h.kind = 'acquired' AND h.at <= p_at
             ORDER BY h.at DESC, h.id DESC LIMIT 1) a
      LEFT JOIN LATERAL (SELECT h.at, h.how FROM history h
                          WHERE h.lease_name = p_name AND h.kind = 'ended' AND h.epoch = a.epoch
                          ORDER BY h.id LIMIT 1) e ON true
     WHERE e.at IS NULL OR e.at > p_at
$$;

-- Deletes history older than p_keep, at most p_batch rows, oldest ids first (so each round
-- is bounded whatever the table holds), and rows dated more than a day ahead of the
-- server's clock (a clock that jumped, or rows written by hand): they would otherwise
-- outlive the retention. A round with nothing to delete reads one row, the oldest: ids
-- follow time, so while the oldest is within the retention so are the others (a row
-- dated ahead by less than a day holds the pruning back by as much, at most). Returns the
-- rows deleted, and how many of them were dated ahead.
CREATE FUNCTION history_prune(p_keep interval, p_batch integer)
    RETURNS TABLE (pruned bigint, ahead bigint)
    LANGUAGE sql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
    WITH first AS (SELECT h.at FROM history h ORDER BY h.id LIMIT 1),
    oldest AS (SELECT h.id FROM history h
                WHERE EXISTS (SELECT 1 FROM first f
                               WHERE f.at < pg_catalog.now() - p_keep OR f.at > pg_catalog.now() + interval '1 day')
                ORDER BY h.id LIMIT greatest(p_batch, 1)),
    gone AS (DELETE FROM history h USING oldest o
              WHERE h.id = o.id
                AND (h.at < pg_catalog.now() - p_keep OR h.at > pg_catalog.now() + interval '1 day')
             RETURNING h.at > pg_catalog.now() AS ahead)
    SELECT count(*), count(*) FILTER (WHERE g.ahead) FROM gone g
$$;

DO $migration$
DECLARE
    v_schema text := pg_catalog.quote_ident(pg_catalog.current_schema());
BEGIN
    EXECUTE pg_catalog.format($ddl$
-- As in migration 0019, and the acquisition recorded, with the end of the leadership it
-- took over. No SET clause (it runs for every lease taken, 10,000 at a shard set's
-- join): every name carries its schema. Only a takeover from a dead holder calls out.
CREATE OR REPLACE FUNCTION %1$s.notify_lease_taken() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    v_payload pg_catalog.text := 'taken:' OPERATOR(pg_catalog.||) NEW.name;
    v_how     pg_catalog.text;
    v_since   pg_catalog.timestamptz;
    v_dead    pg_catalog.timestamptz;
    v_began   pg_catalog.timestamptz;
    v_epoch   pg_catalog.int8;
BEGIN
    IF pg_catalog.octet_length(v_payload) OPERATOR(pg_catalog.<) 8000 THEN
        PERFORM pg_catalog.pg_notify((SELECT c.events FROM %1$s.event_channels c), v_payload);
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
        IF OLD.expires_at OPERATOR(pg_catalog.<) NEW.taken_at OR OLD.holder_instance_id IS NULL THEN
            v_how := 'expired';
            v_since := OLD.expires_at;
        ELSE
            v_how := 'holder_dead';
            PERFORM %1$s.history_note_dead(OLD.holder_instance_id);
            SELECT h.since, h.dead_at INTO v_since, v_dead FROM %1$s.history h
             WHERE h.instance_id OPERATOR(pg_catalog.=) OLD.holder_instance_id AND h.kind OPERATOR(pg_catalog.=) 'dead'
             ORDER BY h.id DESC LIMIT 1;
        END IF;
        -- A leadership ends no earlier than it began: a holder may take a lease after its
        -- last sign of life by the rule (its lock stamped vanished, within the grace) and
        -- then be called dead. Its acquisition is the latest of the lease's (this one's
        -- is written below): one row, read backwards on the lease's index.
        SELECT h.at, h.epoch INTO v_began, v_epoch FROM %1$s.history h
         WHERE h.lease_name OPERATOR(pg_catalog.=) OLD.name AND h.kind OPERATOR(pg_catalog.=) 'acquired'
         ORDER BY h.at DESC LIMIT 1;
        IF v_epoch IS NULL OR v_epoch OPERATOR(pg_catalog.<>) OLD.epoch THEN
            v_began := OLD.taken_at;
        END IF;
        v_since := greatest(least(coalesce(v_since, NEW.taken_at), NEW.taken_at), v_began);
        INSERT INTO %1$s.history (at, kind, lease_name, epoch, instance_id, host, how, since, dead_at)
        VALUES (v_since, 'ended', OLD.name, OLD.epoch,
                OLD.holder_instance_id, OLD.holder_host, v_how, OLD.taken_at, v_dead);
    ELSE
        SELECT h.at INTO v_since FROM %1$s.history h
         WHERE h.lease_name OPERATOR(pg_catalog.=) NEW.name AND h.kind OPERATOR(pg_catalog.=) 'ended'
         ORDER BY h.at DESC LIMIT 1;
        v_how := CASE WHEN v_since IS NULL THEN 'free' ELSE 'released' END;
    END IF;
    INSERT INTO %1$s.history (at, kind, lease_name, epoch, instance_id, host, how, since, dead_at)
    VALUES (pg_catalog.clock_timestamp(), 'acquired', NEW.name, NEW.epoch, NEW.holder_instance_id, NEW.holder_host, v_how, v_since, v_dead);
    RETURN NULL;
END
$$;

-- As in migration 0019, and the end recorded: released, or stepped_down when the release
-- says why (the setting pg_liveness.end_reason, local to the releasing transaction: a
-- liveness.LostReason).
CREATE OR REPLACE FUNCTION %1$s.notify_lease_free() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    v_payload pg_catalog.text := 'free:' OPERATOR(pg_catalog.||) OLD.name;
    v_reason  pg_catalog.text := pg_catalog.current_setting('pg_liveness.end_reason', true);
BEGIN
    IF pg_catalog.octet_length(v_payload) OPERATOR(pg_catalog.<) 8000 THEN
        PERFORM pg_catalog.pg_notify((SELECT c.events FROM %1$s.event_channels c), v_payload);
    END IF;
    IF v_reason OPERATOR(pg_catalog.=) '' THEN
        v_reason := NULL;
    END IF;
    INSERT INTO %1$s.history (at, kind, lease_name, epoch, instance_id, host, how, reason, since)
    VALUES (pg_catalog.clock_timestamp(), 'ended', OLD.name, OLD.epoch, OLD.holder_instance_id, OLD.holder_host,
            CASE WHEN v_reason IS NULL THEN 'released' ELSE 'stepped_down' END, pg_catalog.left(v_reason, 64), OLD.taken_at);
    RETURN NULL;
END
$$;
$ddl$, v_schema);
END
$migration$;

-- As in migration 0012, and the instance's arrival and removal recorded: a row removed
-- while its instance is dead by the rule is a reap (its death recorded first, if no one
-- had), otherwise the process left.
CREATE OR REPLACE FUNCTION notify_instance_event() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
DECLARE
    v_missing timestamptz;
    v_dead    timestamptz;
    v_last    timestamptz;
    v_how     text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_catalog.pg_notify(members_channel(), 'left:' || OLD.instance_id::text);
        SELECT a.missing_since INTO v_missing FROM alive_lock_absences a
         WHERE a.instance_id = OLD.instance_id AND a.server_started_at = pg_catalog.pg_postmaster_start_time()
           AND a.lock_pid IS NOT DISTINCT FROM OLD.lock_pid;
        SELECT d.last_alive_at, d.dead_at, d.how INTO v_last, v_dead, v_how
          FROM history_death_times(OLD.holds_alive_lock,
                   EXISTS (SELECT 1 FROM bigint_advisory_locks l
                            WHERE l.granted AND l.classid = OLD.lock_classid AND l.objid = OLD.lock_objid
                              AND (OLD.lock_pid IS NULL OR l.pid = OLD.lock_pid)),
                   OLD.last_heartbeat_at, v_missing, OLD.lock_grace, OLD.stale_threshold, OLD.definitive_dead_cutoff) d;
        IF v_dead <= pg_catalog.now() THEN
            INSERT INTO history (at, kind, instance_id, host, service, how, since, dead_at)
            VALUES (v_dead, 'dead', OLD.instance_id, OLD.host_name, OLD.service_name, v_how, v_last, v_dead)
            ON CONFLICT (instance_id, since) WHERE kind = 'dead' DO NOTHING;
            INSERT INTO history (at, kind, instance_id, host, service, since)
            VALUES (pg_catalog.clock_timestamp(), 'reaped', OLD.instance_id, OLD.host_name, OLD.service_name, v_last);
        ELSE
            INSERT INTO history (at, kind, instance_id, host, service, since)
            VALUES (pg_catalog.clock_timestamp(), 'left', OLD.instance_id, OLD.host_name, OLD.service_name, OLD.started_at);
        END IF;
    ELSE
        PERFORM pg_catalog.pg_notify(members_channel(), 'joined:' || NEW.instance_id::text);
        INSERT INTO history (at, kind, instance_id, host, service)
        VALUES (pg_catalog.clock_timestamp(), 'joined', NEW.instance_id, NEW.host_name, NEW.service_name);
    END IF;
    RETURN NULL;
END
$$;

-- As in migration 0017, and the death recorded for each instance notified dead.
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

-- As in migration 0017, and each stamp recorded (lock_vanished), and each lock held again
-- while its instance's row stands (lock_back). Unlike 0017, a stamp that a concurrent
-- stamper wrote for the same lock is no longer moved later by this one.
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
        -- A stamp of an earlier server or lock session is replaced; one of this very lock,
        -- committed by a concurrent stamper after this one's read, is kept as it is: its
        -- earlier time stands, and the vanishing is recorded once.
        ON CONFLICT ON CONSTRAINT alive_lock_absences_pkey DO UPDATE
           SET missing_since = excluded.missing_since, server_started_at = excluded.server_started_at,
               lock_pid = excluded.lock_pid
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

REVOKE ALL ON FUNCTION history_prune(interval, integer), history_note_dead(uuid) FROM PUBLIC;
REVOKE ALL ON TABLE history FROM PUBLIC;

-- Readers of the leases may read the history; every role that may write instances (an
-- agent's, whose reaper prunes) may prune it: upgrading takes no one's access away.
DO $$
DECLARE
    v_role name;
BEGIN
    FOR v_role IN SELECT DISTINCT r.rolname
                    FROM pg_catalog.pg_roles r
                   WHERE pg_catalog.has_table_privilege(r.oid, 'leases', 'SELECT')
                     AND NOT r.rolsuper LOOP
        EXECUTE pg_catalog.format('GRANT SELECT ON history TO %I', v_role);
    END LOOP;
    FOR v_role IN SELECT DISTINCT r.rolname
                    FROM pg_catalog.pg_roles r
                   WHERE pg_catalog.has_table_privilege(r.oid, 'instances', 'UPDATE')
                     AND NOT r.rolsuper LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION history_prune(interval, integer) TO %I', v_role);
    END LOOP;
END
$$;
