-- compatible-from: 17
-- Older binaries can no longer fence: fence takes the holder's token now, and their
-- three-argument call is gone. They keep observing and say why (SchemaIncompatible);
-- their leaders' gate was not safe anyway (see the liveness package's "What a leader
-- guarantees" in this release).
--
-- No role but a holder's can touch a lease's fate, and nothing inside a fenced
-- transaction moves its COMMIT check.
--
--   * A fence held the lease row FOR SHARE: every renewal waited behind it, and anyone
--     could call fence, so a role with nothing but the observer's grants could open a
--     transaction, fence a held lease (its name and epoch are readable) and let the
--     lease expire under its holder. Now fence acts only for the holder token's owner
--     (the table keeps its SHA-256; only the acquisition knows it), and it and
--     lease_is_held take FOR KEY SHARE, which a renewal (an UPDATE of expires_at) does
--     not wait for. A takeover changes the epoch, which a UNIQUE constraint makes a key,
--     so it still waits for every fenced transaction of the epoch before: a takeover, a
--     release and a delete wait, a renewal does not.
--   * Anyone could set pg_liveness.commit_deadline, the COMMIT's fresh deadline: it is
--     signed now with a key derived from the holder's token.
--   * SET CONSTRAINTS ALL IMMEDIATE (or naming the check) ran the COMMIT check at once,
--     and a COMMIT long past the deadline committed. The check now queues a probe row of
--     its own constraint as it runs: a constraint that fires at once means the check is
--     not running at COMMIT, and the transaction is refused (LVF04). A transaction
--     prepared for two-phase commit is refused too (LVF05): its COMMIT PREPARED would
--     never be checked.
--   * The fleet's watcher and its notifications (watch_alive_locks,
--     notify_dead_instances) are executable only by the participating roles, and the
--     stamps of vanished locks are written only when the session's role may write
--     instances: an observer's transaction never holds a lock the watcher, a reader's
--     verdict or a takeover waits for.
--   * A stamp is dated by the clock after the read of pg_locks that found the lock
--     missing, not by the transaction's start: the lock vanished before that read, and a
--     leader's deadline counts on its stamp being no earlier than its vanishing.

-- Epochs come from a sequence, so they are unique already; the constraint makes the epoch
-- a key, whose change waits for FOR KEY SHARE.
ALTER TABLE leases ADD CONSTRAINT leases_epoch_key UNIQUE (epoch);

-- The key that signs a COMMIT's fresh deadline (pg_liveness.commit_deadline): derived from
-- the holder's token, which only its acquisition knows, so that no statement of anyone
-- else's can move the deadline.
ALTER TABLE fence_checks ADD COLUMN commit_key text;

CREATE FUNCTION fence_commit_key(p_holder text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
AS $$ SELECT pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to('pg_liveness.commit:' || p_holder, 'UTF8')), 'hex') $$;
REVOKE ALL ON FUNCTION fence_commit_key(text) FROM PUBLIC;

-- Whether the session's role takes part (may write instances, as an agent's role does):
-- only such a role writes stamps. session_user: inside SECURITY DEFINER functions
-- current_user is their owner.
CREATE FUNCTION caller_participates() RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path FROM CURRENT
AS $$ SELECT pg_catalog.has_table_privilege(session_user, 'instances', 'UPDATE') $$;

CREATE OR REPLACE FUNCTION lease_is_held(p_name text, p_epoch bigint) RETURNS boolean
    LANGUAGE sql VOLATILE STRICT
    SET search_path FROM CURRENT
AS $$
    SELECT coalesce((SELECT true FROM leases l
                      WHERE l.name = p_name AND l.epoch = p_epoch AND l.expires_at >= pg_catalog.clock_timestamp()
                        FOR KEY SHARE), false)
$$;

DROP FUNCTION fence(text, bigint, timestamptz, boolean);

-- The fence of the holder whose token is p_holder: whether it holds p_name under p_epoch
-- (its row locked FOR KEY SHARE until the transaction ends), whether the server's clock
-- is still before p_deadline, and the check at COMMIT queued (fence_check_at_commit).
-- With p_raise a refusal is an error: LVF01 not held, LVF02 past the deadline.
CREATE FUNCTION fence(p_name text, p_holder text, p_epoch bigint, p_deadline timestamptz, p_raise boolean DEFAULT false)
    RETURNS TABLE (held boolean, in_time boolean)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
DECLARE
    v_row tid;
BEGIN
    PERFORM 1 FROM leases l
      WHERE l.name = p_name AND l.holder = lease_token(p_holder) AND l.epoch = p_epoch
        AND l.expires_at >= pg_catalog.clock_timestamp()
        FOR KEY SHARE;
    held := FOUND;
    in_time := pg_catalog.clock_timestamp() < p_deadline;
    IF p_raise AND NOT held THEN
        RAISE EXCEPTION 'liveness: lease % is not held under epoch %', p_name, p_epoch USING ERRCODE = 'LVF01';
    END IF;
    IF p_raise AND NOT coalesce(in_time, false) THEN
        RAISE EXCEPTION 'liveness: fence of lease % (epoch %) came past its deadline %', p_name, p_epoch, p_deadline
              USING ERRCODE = 'LVF02';
    END IF;
    INSERT INTO fence_checks (lease_name, epoch, deadline, commit_key)
         VALUES (p_name, p_epoch, CASE WHEN held THEN coalesce(p_deadline, '-infinity') ELSE '-infinity' END,
                 fence_commit_key(p_holder))
      RETURNING ctid INTO v_row;
    -- The check stays queued; the row has done its part.
    DELETE FROM fence_checks f WHERE f.ctid = v_row;
    RETURN NEXT;
END
$$;

-- The check at COMMIT (migration 0009), which must run at COMMIT. A row of epoch -1 is its
-- probe: the check inserts one as it runs, whose own check (this function) fires at once
-- only if the constraint is IMMEDIATE, that is when SET CONSTRAINTS made it so and the
-- check is running now rather than at COMMIT. Then the transaction is refused: a COMMIT
-- sent later would not be checked. The deadline is the row's, unless the transaction set
-- pg_liveness.commit_deadline to '<epoch>:<deadline in Unix microseconds>:<signature>' just
-- before its COMMIT (the liveness package does, with the deadline as of then), signed with
-- the fence's commit key: sha256 of '<key>:<epoch>:<microseconds>' in hex. A value that
-- does not verify is ignored. With its owner's rights, as fence's: the committer needs no
-- grant on fence_checks.
CREATE OR REPLACE FUNCTION fence_check_at_commit() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
DECLARE
    v_set      text;
    v_deadline timestamptz := NEW.deadline;
    v_row      tid;
BEGIN
    IF NEW.epoch = -1 THEN
        PERFORM pg_catalog.set_config('pg_liveness.fence_probe', 'fired', true);
        RETURN NULL;
    END IF;
    PERFORM pg_catalog.set_config('pg_liveness.fence_probe', '', true);
    INSERT INTO fence_checks (lease_name, epoch, deadline) VALUES (NEW.lease_name, -1, '-infinity')
      RETURNING ctid INTO v_row;
    DELETE FROM fence_checks f WHERE f.ctid = v_row;
    IF pg_catalog.current_setting('pg_liveness.fence_probe') = 'fired' THEN
        RAISE EXCEPTION 'liveness: fenced transaction of lease % (epoch %) refused: its check at COMMIT was made to run early '
                        '(SET CONSTRAINTS ... IMMEDIATE); name your own constraints in SET CONSTRAINTS instead of ALL',
                        NEW.lease_name, NEW.epoch
              USING ERRCODE = 'LVF04';
    END IF;
    IF pg_catalog.current_query() ~* '\mprepare\s+transaction\M' THEN
        RAISE EXCEPTION 'liveness: fenced transaction of lease % (epoch %) refused: it cannot be prepared for two-phase '
                        'commit, whose COMMIT PREPARED would not be checked', NEW.lease_name, NEW.epoch
              USING ERRCODE = 'LVF05';
    END IF;
    v_set := pg_catalog.current_setting('pg_liveness.commit_deadline', true);
    IF v_set IS NOT NULL AND pg_catalog.split_part(v_set, ':', 1) = NEW.epoch::text
       AND pg_catalog.split_part(v_set, ':', 3) = pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
               NEW.commit_key || ':' || NEW.epoch::text || ':' || pg_catalog.split_part(v_set, ':', 2), 'UTF8')), 'hex') THEN
        v_deadline := timestamptz 'epoch' + pg_catalog.split_part(v_set, ':', 2)::bigint * interval '1 microsecond';
    END IF;
    IF pg_catalog.clock_timestamp() >= v_deadline THEN
        RAISE EXCEPTION 'liveness: fenced transaction of lease % (epoch %) refused at commit: past its fence deadline %',
                        NEW.lease_name, NEW.epoch, v_deadline
              USING ERRCODE = 'LVF03';
    END IF;
    RETURN NULL;
END
$$;

-- As in migration 0016, but dated after the read of the locks, and only for a
-- participating role.
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

REVOKE ALL ON FUNCTION watch_alive_locks(text), notify_dead_instances(uuid[]) FROM PUBLIC;

-- Every role that may write instances today (an agent's) may run the watcher: upgrading
-- changes no one's access but the observers'.
DO $$
DECLARE
    v_role name;
BEGIN
    FOR v_role IN SELECT DISTINCT r.rolname
                    FROM pg_catalog.pg_roles r
                   WHERE pg_catalog.has_table_privilege(r.oid, 'instances', 'UPDATE')
                     AND NOT r.rolsuper LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION watch_alive_locks(text), notify_dead_instances(uuid[]) TO %I',
                                  v_role);
    END LOOP;
END
$$;
