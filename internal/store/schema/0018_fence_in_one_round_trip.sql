-- compatible-from: 17
-- Older binaries keep working: fence and the check at commit keep their arguments,
-- results and behaviour; this adds fence_exec and makes the three cheaper.
--
-- A fence cost more than the write it guards (a small insert: about 5x its server time).
--
--   * A SET clause on a function (SET search_path FROM CURRENT) changes and restores the
--     search path at every call, and each change re-validates the caller's cached plans:
--     on PostgreSQL 15 that alone cost a fence more than the insert it guarded. fence,
--     fence_exec and fence_check_at_commit now have no SET clause; instead every name in
--     their bodies is written with its schema (this migration runs with search_path set
--     to the schema, and writes its name in), operators as OPERATOR(pg_catalog.=), types as
--     pg_catalog.text: a caller's search_path reaches nothing inside them, as the SET
--     clause made sure before. They remain SECURITY DEFINER.
--   * lease_token and fence_commit_key were IMMUTABLE SQL functions whose body calls
--     convert_to, which is only STABLE, so PostgreSQL never inlined a call of them: each
--     cost a SQL function's whole call (30-40 us), in every fence, renewal, take and
--     release (once per lease of a shard set's statements). Declared STABLE, which is what
--     their body is, they are inlined. Nothing indexes them. Their bodies name only
--     pg_catalog's functions and operators: a SQL function without a SET clause is parsed
--     with its caller's search_path, and the fences now have none.
--   * fence_exec is the fence of Lease.Exec, which now sends the fence and the write in one
--     pipeline, one implicit transaction that commits at its Sync: one round trip, no
--     BEGIN or COMMIT statements, and no signed fresh deadline (the COMMIT leaves with the
--     fence, so the fence's deadline is the COMMIT's). It does what fence(..., true) does
--     but returns nothing, does not hash the holder a second time for a commit key, and
--     sets no idle limit: nothing idles between the fence and the COMMIT of a pipeline
--     (the server reads the rest of it, already sent).
-- The check at commit is unchanged in what it does: its probe against SET CONSTRAINTS, its
-- refusal of PREPARE TRANSACTION, its signed fresh deadline.

ALTER FUNCTION lease_token(text) STABLE;

-- A SQL function's body is parsed with the caller's search_path when it has no SET clause
-- of its own, inlined or not: fence_commit_key's || now runs inside functions without the
-- clause, so it is written with its schema too.
CREATE OR REPLACE FUNCTION fence_commit_key(p_holder text) RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE STRICT
AS $$ SELECT pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to('pg_liveness.commit:' OPERATOR(pg_catalog.||) p_holder,
                                                                        'UTF8')), 'hex') $$;

DO $migration$
DECLARE
    v_schema text := pg_catalog.quote_ident(pg_catalog.current_schema());
BEGIN
    EXECUTE pg_catalog.format($ddl$
-- Lease.Exec's fence (see the header): the lease row locked FOR KEY SHARE while this
-- holder holds it under p_epoch, unexpired; refused with LVF01 (not held) or LVF02 (past
-- p_deadline); and the check of the COMMIT against p_deadline queued.
CREATE FUNCTION %1$s.fence_exec(p_name text, p_holder text, p_epoch bigint, p_deadline timestamptz) RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_row pg_catalog.tid;
BEGIN
    PERFORM 1 FROM %1$s.leases l
      WHERE l.name OPERATOR(pg_catalog.=) p_name
        AND l.holder OPERATOR(pg_catalog.=) %1$s.lease_token(p_holder)
        AND l.epoch OPERATOR(pg_catalog.=) p_epoch
        AND l.expires_at OPERATOR(pg_catalog.>=) pg_catalog.clock_timestamp()
        FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'liveness: lease %% is not held under epoch %%', p_name, p_epoch USING ERRCODE = 'LVF01';
    END IF;
    IF NOT coalesce(pg_catalog.clock_timestamp() OPERATOR(pg_catalog.<) p_deadline, false) THEN
        RAISE EXCEPTION 'liveness: fence of lease %% (epoch %%) came past its deadline %%', p_name, p_epoch, p_deadline
              USING ERRCODE = 'LVF02';
    END IF;
    INSERT INTO %1$s.fence_checks (lease_name, epoch, deadline) VALUES (p_name, p_epoch, p_deadline)
      RETURNING ctid INTO v_row;
    -- The check stays queued; the row has done its part.
    DELETE FROM %1$s.fence_checks f WHERE f.ctid OPERATOR(pg_catalog.=) v_row;
END
$$;

-- As in migration 0017, without the SET clause.
CREATE OR REPLACE FUNCTION %1$s.fence(p_name text, p_holder text, p_epoch bigint, p_deadline timestamptz,
                                      p_raise boolean DEFAULT false)
    RETURNS TABLE (held boolean, in_time boolean)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_row pg_catalog.tid;
BEGIN
    PERFORM 1 FROM %1$s.leases l
      WHERE l.name OPERATOR(pg_catalog.=) p_name
        AND l.holder OPERATOR(pg_catalog.=) %1$s.lease_token(p_holder)
        AND l.epoch OPERATOR(pg_catalog.=) p_epoch
        AND l.expires_at OPERATOR(pg_catalog.>=) pg_catalog.clock_timestamp()
        FOR KEY SHARE;
    held := FOUND;
    in_time := pg_catalog.clock_timestamp() OPERATOR(pg_catalog.<) p_deadline;
    IF p_raise AND NOT held THEN
        RAISE EXCEPTION 'liveness: lease %% is not held under epoch %%', p_name, p_epoch USING ERRCODE = 'LVF01';
    END IF;
    IF p_raise AND NOT coalesce(in_time, false) THEN
        RAISE EXCEPTION 'liveness: fence of lease %% (epoch %%) came past its deadline %%', p_name, p_epoch, p_deadline
              USING ERRCODE = 'LVF02';
    END IF;
    INSERT INTO %1$s.fence_checks (lease_name, epoch, deadline, commit_key)
         VALUES (p_name, p_epoch, CASE WHEN held THEN coalesce(p_deadline, '-infinity') ELSE '-infinity' END,
                 %1$s.fence_commit_key(p_holder))
      RETURNING ctid INTO v_row;
    DELETE FROM %1$s.fence_checks f WHERE f.ctid OPERATOR(pg_catalog.=) v_row;
    RETURN NEXT;
END
$$;

-- As in migration 0017, without the SET clause.
CREATE OR REPLACE FUNCTION %1$s.fence_check_at_commit() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    v_set      pg_catalog.text;
    v_deadline pg_catalog.timestamptz := NEW.deadline;
    v_row      pg_catalog.tid;
BEGIN
    IF NEW.epoch OPERATOR(pg_catalog.=) (-1) THEN
        PERFORM pg_catalog.set_config('pg_liveness.fence_probe', 'fired', true);
        RETURN NULL;
    END IF;
    PERFORM pg_catalog.set_config('pg_liveness.fence_probe', '', true);
    INSERT INTO %1$s.fence_checks (lease_name, epoch, deadline) VALUES (NEW.lease_name, -1, '-infinity')
      RETURNING ctid INTO v_row;
    DELETE FROM %1$s.fence_checks f WHERE f.ctid OPERATOR(pg_catalog.=) v_row;
    IF pg_catalog.current_setting('pg_liveness.fence_probe') OPERATOR(pg_catalog.=) 'fired' THEN
        RAISE EXCEPTION 'liveness: fenced transaction of lease %% (epoch %%) refused: its check at COMMIT was made to run early '
                        '(SET CONSTRAINTS ... IMMEDIATE); name your own constraints in SET CONSTRAINTS instead of ALL',
                        NEW.lease_name, NEW.epoch
              USING ERRCODE = 'LVF04';
    END IF;
    IF pg_catalog.current_query() OPERATOR(pg_catalog.~*) '\mprepare\s+transaction\M' THEN
        RAISE EXCEPTION 'liveness: fenced transaction of lease %% (epoch %%) refused: it cannot be prepared for two-phase '
                        'commit, whose COMMIT PREPARED would not be checked', NEW.lease_name, NEW.epoch
              USING ERRCODE = 'LVF05';
    END IF;
    v_set := pg_catalog.current_setting('pg_liveness.commit_deadline', true);
    -- Nested, not one AND: SQL does not stop at the first false (or null) operand, and the
    -- hash is for a deadline that was set.
    IF v_set OPERATOR(pg_catalog.<>) '' THEN
        IF pg_catalog.split_part(v_set, ':', 1) OPERATOR(pg_catalog.=) NEW.epoch::pg_catalog.text
           AND pg_catalog.split_part(v_set, ':', 3) OPERATOR(pg_catalog.=) pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
                   NEW.commit_key OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) NEW.epoch::pg_catalog.text
                   OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) pg_catalog.split_part(v_set, ':', 2), 'UTF8')), 'hex') THEN
            -- OPERATOR() forms share one precedence: the parentheses say which comes first.
            v_deadline := 'epoch'::pg_catalog.timestamptz OPERATOR(pg_catalog.+)
                          (pg_catalog.split_part(v_set, ':', 2)::pg_catalog.int8 OPERATOR(pg_catalog.*) '1 microsecond'::pg_catalog.interval);
        END IF;
    END IF;
    IF pg_catalog.clock_timestamp() OPERATOR(pg_catalog.>=) v_deadline THEN
        RAISE EXCEPTION 'liveness: fenced transaction of lease %% (epoch %%) refused at commit: past its fence deadline %%',
                        NEW.lease_name, NEW.epoch, v_deadline
              USING ERRCODE = 'LVF03';
    END IF;
    RETURN NULL;
END
$$;
$ddl$, v_schema);
END
$migration$;

