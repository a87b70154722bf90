-- compatible-from: 1
-- Older binaries keep working: this only adds functions and triggers. The triggers send
-- notifications, which nobody has to listen to.
--
-- The vanishing of an alive lock is recorded when it happens, not when someone asks: a
-- watcher (an agent elected for it, see the liveness package) calls watch_alive_locks a
-- few times a second, which reads a digest of the exclusive advisory locks and stamps
-- absences only when the digest changed. And waiters are woken: what frees a lease, ends
-- an instance or adds one is notified on the schema's events channel.

-- The channel of the schema's events: <schema>_events (the schema's name cut to 50
-- characters, so that the channel fits PostgreSQL's 63-byte names). Payloads are
-- "<kind>:<id>": dead:<instance id> (dead by the verdict after its lock vanished),
-- left:<instance id> (its row was deleted: a graceful stop or the reaper), joined:<instance
-- id> (its row was inserted), free:<lease name> (released, or its holder dead).
CREATE FUNCTION events_channel() RETURNS text
    LANGUAGE sql STABLE
    SET search_path FROM CURRENT
AS $$ SELECT left(pg_catalog.current_schema(), 50) || '_events' $$;

-- LISTEN on the events channel, for the session that calls it (from its commit on).
CREATE FUNCTION events_listen() RETURNS text
    LANGUAGE plpgsql VOLATILE
    SET search_path FROM CURRENT
AS $$
DECLARE
    v_channel text := events_channel();
BEGIN
    EXECUTE pg_catalog.format('LISTEN %I', v_channel);
    RETURN v_channel;
END
$$;

-- The notifications of writes, from every writer (a trigger sees them all). Sent on
-- commit, so a waiter woken by one reads the committed state.
CREATE FUNCTION notify_instance_event() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_catalog.pg_notify(left(TG_TABLE_SCHEMA, 50) || '_events', 'left:' || OLD.instance_id::text);
    ELSE
        PERFORM pg_catalog.pg_notify(left(TG_TABLE_SCHEMA, 50) || '_events', 'joined:' || NEW.instance_id::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER instances_notify_joined AFTER INSERT ON instances
    FOR EACH ROW EXECUTE FUNCTION notify_instance_event();
CREATE TRIGGER instances_notify_left AFTER DELETE ON instances
    FOR EACH ROW EXECUTE FUNCTION notify_instance_event();

CREATE FUNCTION notify_lease_free() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_catalog.pg_notify(left(TG_TABLE_SCHEMA, 50) || '_events', 'free:' || OLD.name);
    RETURN NULL;
END
$$;

CREATE TRIGGER leases_notify_free AFTER DELETE ON leases
    FOR EACH ROW EXECUTE FUNCTION notify_lease_free();

-- The watcher's tick. The digest is the count, bit_xor and sum of the granted exclusive
-- advisory locks' keys in this database (classid << 32 | objid), read from pg_locks: it
-- changes whenever such a lock appears or vanishes. When it equals p_digest (the
-- previous tick's) nothing is stamped, read or written; otherwise absences are stamped
-- as stamp_alive_lock_absences does (an absence is stamped when first missed, never
-- moved) and the standing ones are returned with how long until their grace ends.
-- Returns one row with the digest and no instance, then one per standing absence.
CREATE FUNCTION watch_alive_locks(p_digest text)
    RETURNS TABLE (digest text, instance_id uuid, dead_in float8)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
DECLARE
    v_digest text;
BEGIN
    SELECT count(*)::text || ':' || coalesce(bit_xor(k.key), 0)::text || ':' || coalesce(sum(k.key), 0)::text
      INTO v_digest
      FROM (SELECT (l.classid::bigint << 32) | l.objid::bigint AS key
              FROM bigint_advisory_locks l
             WHERE l.granted AND l.mode = 'ExclusiveLock') k;
    digest := v_digest;
    RETURN NEXT;
    IF v_digest IS NOT DISTINCT FROM p_digest OR pg_catalog.pg_is_in_recovery() THEN
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

-- Notifies dead:<id> for each of p_ids that is dead by the one verdict, and free:<name>
-- for each unexpired lease it holds, so that followers take it at once. Returns the ids
-- notified. Reads the verdict of those instances only; writes nothing.
CREATE FUNCTION notify_dead_instances(p_ids uuid[]) RETURNS SETOF uuid
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
DECLARE
    v_channel text := events_channel();
    v_id      uuid;
    v_lease   text;
BEGIN
    FOR v_id IN SELECT DISTINCT u FROM pg_catalog.unnest(p_ids) u LOOP
        IF coalesce((SELECT s.alive FROM instance_state_verdicts(p_instance_id => v_id) s), false) THEN
            CONTINUE;
        END IF;
        PERFORM pg_catalog.pg_notify(v_channel, 'dead:' || v_id::text);
        FOR v_lease IN SELECT l.name FROM leases l WHERE l.holder_instance_id = v_id AND l.expires_at >= pg_catalog.now() LOOP
            PERFORM pg_catalog.pg_notify(v_channel, 'free:' || v_lease);
        END LOOP;
        RETURN NEXT v_id;
    END LOOP;
END
$$;
