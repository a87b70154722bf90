-- compatible-from: 1
-- Older binaries keep working: this adds functions only, and grants them to every role
-- that may write the leases table today; their own statements still write the table.
--
-- A lease is written only by the acquisition that holds it. Until now an agent's role
-- needed INSERT, UPDATE and DELETE on the leases table, so any agent's role could delete
-- or rewrite any other instance's lease (the fence then refused the victim's epoch, so no
-- write was corrupted, but the lease's availability was anyone's). Now an agent takes,
-- renews, releases, abandons and detaches a lease through the functions below, which run
-- with their owner's rights and act only on the acquisition whose holder token the caller
-- presents. The table keeps the token's SHA-256 (hex), so what SELECT shows of it (the
-- collectors and the status page read the column) opens nothing. Once every agent runs a
-- binary of this release, revoke INSERT, UPDATE and DELETE on the leases table, and USAGE
-- on its sequence, from the agents' roles (docs/security.md): EXECUTE on these functions
-- is all an agent needs of the leases.

-- The stored form of a holder token.
CREATE FUNCTION lease_token(p_holder text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(p_holder, 'UTF8')), 'hex') $$;

-- Takes the lease when it is free (lease_acquire's statement until this migration), and
-- says why not otherwise: whether a holder alive by the verdict holds it, and the
-- instance the row names.
CREATE FUNCTION lease_take(p_name text, p_holder text, p_ttl_seconds float8, p_instance_id uuid, p_host text)
    RETURNS TABLE (epoch bigint, taken_at timestamptz, expires_at timestamptz, held_by_live boolean, holder_instance_id uuid)
    LANGUAGE sql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
    WITH taken AS (
        INSERT INTO leases AS l (name, holder, holder_instance_id, holder_host, epoch, taken_at, expires_at)
        SELECT p_name, lease_token(p_holder), p_instance_id, p_host, nextval('lease_epoch_seq'), now(),
               now() + make_interval(secs => p_ttl_seconds)
         WHERE lease_is_free(p_name)
           AND (p_instance_id IS NULL OR is_instance_alive(p_instance_id))
        ON CONFLICT (name) DO UPDATE
           SET holder = excluded.holder, holder_instance_id = excluded.holder_instance_id, holder_host = excluded.holder_host,
               epoch = excluded.epoch, taken_at = excluded.taken_at, expires_at = excluded.expires_at
         WHERE l.expires_at < now()
            OR (l.holder_instance_id IS NOT NULL AND NOT is_instance_alive(l.holder_instance_id))
        RETURNING l.epoch, l.taken_at, l.expires_at
    )
    SELECT t.epoch, t.taken_at, t.expires_at, false, NULL::uuid FROM taken t
    UNION ALL
    SELECT NULL, NULL, NULL, NOT lease_is_free(p_name), (SELECT l.holder_instance_id FROM leases l WHERE l.name = p_name)
     WHERE NOT EXISTS (SELECT 1 FROM taken)
$$;

-- Extends this acquisition's lease while it holds it and it has not expired.
CREATE FUNCTION lease_extend(p_name text, p_holder text, p_epoch bigint, p_ttl_seconds float8) RETURNS SETOF timestamptz
    LANGUAGE sql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
    UPDATE leases SET expires_at = now() + make_interval(secs => p_ttl_seconds)
     WHERE name = p_name AND holder = lease_token(p_holder) AND epoch = p_epoch AND expires_at >= now()
    RETURNING expires_at
$$;

-- Extends many acquisitions' leases at once (a shard set's member).
CREATE FUNCTION lease_extend_many(p_names text[], p_holders text[], p_epochs bigint[], p_ttl_seconds float8)
    RETURNS TABLE (name text, expires_at timestamptz)
    LANGUAGE sql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
    UPDATE leases AS l SET expires_at = now() + make_interval(secs => p_ttl_seconds)
      FROM ROWS FROM (pg_catalog.unnest(p_names), pg_catalog.unnest(p_holders), pg_catalog.unnest(p_epochs)) AS t(name, holder, epoch)
     WHERE l.name = t.name AND l.holder = lease_token(t.holder) AND l.epoch = t.epoch AND l.expires_at >= now()
    RETURNING l.name, l.expires_at
$$;

-- Deletes this acquisition's lease; returns how many rows went (0 or 1).
CREATE FUNCTION lease_let_go(p_name text, p_holder text, p_epoch bigint) RETURNS bigint
    LANGUAGE sql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
    WITH gone AS (DELETE FROM leases WHERE name = p_name AND holder = lease_token(p_holder) AND epoch = p_epoch RETURNING 1)
    SELECT count(*) FROM gone
$$;

-- Deletes what an acquisition whose answer was lost may hold (the token is new on every
-- acquisition, so it matches nothing else).
CREATE FUNCTION lease_abandon(p_name text, p_holder text) RETURNS bigint
    LANGUAGE sql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
    WITH gone AS (DELETE FROM leases WHERE name = p_name AND holder = lease_token(p_holder) RETURNING 1)
    SELECT count(*) FROM gone
$$;

-- Leaves this acquisition's lease to expire: it no longer names a holder instance.
CREATE FUNCTION lease_detach(p_name text, p_holder text, p_epoch bigint) RETURNS bigint
    LANGUAGE sql VOLATILE SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
    WITH left_ AS (UPDATE leases SET holder_instance_id = NULL
                    WHERE name = p_name AND holder = lease_token(p_holder) AND epoch = p_epoch RETURNING 1)
    SELECT count(*) FROM left_
$$;

REVOKE ALL ON FUNCTION lease_take(text, text, float8, uuid, text), lease_extend(text, text, bigint, float8),
    lease_extend_many(text[], text[], bigint[], float8), lease_let_go(text, text, bigint),
    lease_abandon(text, text), lease_detach(text, text, bigint) FROM PUBLIC;

-- Every role that may write the leases table today (an agent's) may use the functions:
-- upgrading changes no one's access.
DO $$
DECLARE
    v_role name;
BEGIN
    FOR v_role IN SELECT DISTINCT r.rolname
                    FROM pg_catalog.pg_roles r
                   WHERE pg_catalog.has_table_privilege(r.oid, 'leases', 'INSERT')
                     AND pg_catalog.has_table_privilege(r.oid, 'leases', 'DELETE')
                     AND NOT r.rolsuper LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION lease_take(text, text, float8, uuid, text), '
            'lease_extend(text, text, bigint, float8), lease_extend_many(text[], text[], bigint[], float8), '
            'lease_let_go(text, text, bigint), lease_abandon(text, text), lease_detach(text, text, bigint) TO %I', v_role);
    END LOOP;
END
$$;
