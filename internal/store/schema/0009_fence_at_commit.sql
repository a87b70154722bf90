-- compatible-from: 1
-- Older binaries keep working: this only adds a table, a trigger and functions; their
-- fence (lease_is_held and the deadline in one statement) is unchanged.
--
-- A fenced transaction is refused at its COMMIT when the COMMIT reaches the server past
-- the writer's fence deadline, not only when its fence did: a COMMIT held back by the
-- network (a partition that heals) must not land after its writer was told it lost the
-- lease. PostgreSQL has no commit hook in SQL; a deferred constraint trigger is the one
-- thing that runs at COMMIT, inside the committing transaction, and whose error turns
-- the COMMIT into a rollback. It fires for every row inserted into fence_checks, even one
-- deleted again by the same transaction, which is what fence does: the row is there only
-- to queue the check.

-- One row per fence, inserted and deleted at once by fence. UNLOGGED: nothing in it ever
-- survives its transaction, so it writes no WAL. No index: nothing reads it.
CREATE UNLOGGED TABLE fence_checks (
    lease_name text        NOT NULL,
    epoch      bigint      NOT NULL,
    deadline   timestamptz NOT NULL
);

-- The check at COMMIT. The deadline is the row's, unless the transaction set
-- pg_liveness.commit_deadline to '<epoch>:<deadline in Unix microseconds>' for the row's epoch
-- just before its COMMIT (the liveness package does, with the deadline it reads then,
-- so that the time the transaction's own statements took, waiting for row locks say,
-- does not count against it). The lease row needs no second look: the fence's
-- lease_is_held holds it FOR SHARE until the transaction ends, so no takeover commits in
-- between. SQLSTATE LVF03. Everything is qualified: it runs with the committer's
-- search_path, and a SET clause would cost every commit.
CREATE FUNCTION fence_check_at_commit() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    v_set      text := pg_catalog.current_setting('pg_liveness.commit_deadline', true);
    v_deadline timestamptz := NEW.deadline;
BEGIN
    IF v_set IS NOT NULL AND pg_catalog.split_part(v_set, ':', 1) = NEW.epoch::text THEN
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

CREATE CONSTRAINT TRIGGER fence_checks_at_commit AFTER INSERT ON fence_checks
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION fence_check_at_commit();

-- A leader's fence, in the transaction of the writes it guards: whether the lease is held
-- under p_epoch (lease_is_held, whose FOR SHARE lock on the lease row keeps any takeover
-- from committing until the transaction ends) and whether the server's clock is still
-- before p_deadline; and, whatever the answer, the check of the transaction's COMMIT
-- against p_deadline (against -infinity when the lease is not held, so that a fence
-- whose failure is ignored still refuses its COMMIT). With p_raise, a refusal is an
-- error instead: LVF01 the lease is not held, LVF02 the fence itself came past its
-- deadline. SECURITY DEFINER: a writer needs no grant on fence_checks.
CREATE FUNCTION fence(p_name text, p_epoch bigint, p_deadline timestamptz, p_raise boolean DEFAULT false)
    RETURNS TABLE (held boolean, in_time boolean)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
DECLARE
    v_row tid;
BEGIN
    held := coalesce(lease_is_held(p_name, p_epoch), false);
    in_time := pg_catalog.clock_timestamp() < p_deadline;
    IF p_raise AND NOT held THEN
        RAISE EXCEPTION 'liveness: lease % is not held under epoch %', p_name, p_epoch USING ERRCODE = 'LVF01';
    END IF;
    IF p_raise AND NOT coalesce(in_time, false) THEN
        RAISE EXCEPTION 'liveness: fence of lease % (epoch %) came past its deadline %', p_name, p_epoch, p_deadline
              USING ERRCODE = 'LVF02';
    END IF;
    INSERT INTO fence_checks (lease_name, epoch, deadline)
         VALUES (p_name, p_epoch, CASE WHEN held THEN coalesce(p_deadline, '-infinity') ELSE '-infinity' END)
      RETURNING ctid INTO v_row;
    -- The check stays queued; the row has done its part. By ctid: a tid scan, however
    -- many dead rows other fences left for vacuum.
    DELETE FROM fence_checks f WHERE f.ctid = v_row;
    RETURN NEXT;
END
$$;
