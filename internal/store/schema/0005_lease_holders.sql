-- compatible-from: 1
-- Older binaries keep working: they write no holder identity, so their leases are only
-- taken over once they expire, as before.
--
-- A lease records who holds it: the holder's instance id and host. A lease whose holder
-- is dead by the one verdict (is_instance_alive) may be taken before it expires, so a
-- crashed leader's job moves within about its lock grace instead of its whole ttl. A
-- holder stops leading on its own before the verdict can call it dead (the liveness
-- package's leases end when the instance can no longer prove life), and lease_is_held
-- keeps fencing every write with the epoch either way.

ALTER TABLE leases
    ADD COLUMN holder_instance_id uuid,
    ADD COLUMN holder_host        text;

-- Whether the lease name may be taken now: nobody holds it, it expired by the database
-- clock, or its holder is an instance that is dead by the one verdict.
CREATE FUNCTION lease_is_free(p_name text) RETURNS boolean
    LANGUAGE sql VOLATILE STRICT
    SET search_path FROM CURRENT
AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM leases l
         WHERE l.name = p_name
           AND l.expires_at >= now()
           AND (l.holder_instance_id IS NULL OR is_instance_alive(l.holder_instance_id)))
$$;
