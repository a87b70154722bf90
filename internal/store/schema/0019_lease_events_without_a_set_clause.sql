-- compatible-from: 17
-- Older binaries keep working: this replaces functions with the same arguments, results
-- and behaviour.
--
-- A shard set's member releasing its shards, and taking them, paid per shard for search
-- path changes: lease_let_go (once per lease of lease_release_many) and the notification
-- triggers of every lease taken or freed (notify_lease_taken, notify_lease_free, and
-- events_channel inside them) each had a SET search_path clause, which changes the
-- search path and back at every call and re-validates cached plans (about 75 us a call
-- on PostgreSQL 15; see migration 0018). A member stopping with 5,000 shards took about a
-- second, nearly all of it these calls. They now have no SET clause: every name in their
-- bodies carries its schema, operators included, as migration 0018's fences do, so a
-- caller's search_path reaches nothing inside them. What they do is unchanged.

DO $migration$
DECLARE
    v_schema text := pg_catalog.quote_ident(pg_catalog.current_schema());
BEGIN
    EXECUTE pg_catalog.format($ddl$
-- As in migration 0015, without the SET clause (a SQL function without one is parsed
-- with its caller's search_path: every name is written with its schema).
CREATE OR REPLACE FUNCTION %1$s.lease_let_go(p_name text, p_holder text, p_epoch bigint) RETURNS bigint
    LANGUAGE sql VOLATILE SECURITY DEFINER
AS $$
    WITH gone AS (DELETE FROM %1$s.leases l
                   WHERE l.name OPERATOR(pg_catalog.=) p_name AND l.holder OPERATOR(pg_catalog.=) %1$s.lease_token(p_holder)
                     AND l.epoch OPERATOR(pg_catalog.=) p_epoch
                  RETURNING 1)
    SELECT pg_catalog.count(*) FROM gone
$$;

-- As in migration 0012, without the SET clause; the channel read from its table, and
-- event_fits written out (its body's < would be the caller's).
CREATE OR REPLACE FUNCTION %1$s.notify_lease_free() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    v_payload pg_catalog.text := 'free:' OPERATOR(pg_catalog.||) OLD.name;
BEGIN
    IF pg_catalog.octet_length(v_payload) OPERATOR(pg_catalog.<) 8000 THEN
        PERFORM pg_catalog.pg_notify((SELECT c.events FROM %1$s.event_channels c), v_payload);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION %1$s.notify_lease_taken() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
DECLARE
    v_payload pg_catalog.text := 'taken:' OPERATOR(pg_catalog.||) NEW.name;
BEGIN
    IF pg_catalog.octet_length(v_payload) OPERATOR(pg_catalog.<) 8000 THEN
        PERFORM pg_catalog.pg_notify((SELECT c.events FROM %1$s.event_channels c), v_payload);
    END IF;
    RETURN NULL;
END
$$;
$ddl$, v_schema);
END
$migration$;
