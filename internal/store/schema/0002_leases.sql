-- compatible-from: 1
-- Leases: singleton jobs held by a row, not by a connection.

-- Epochs come from a sequence, so they strictly increase across takeovers, releases and
-- deletes. An epoch is the fencing token of one acquisition.
CREATE SEQUENCE lease_epoch_seq AS bigint;

CREATE TABLE leases (
    name       text        PRIMARY KEY,
    holder     text        NOT NULL,
    epoch      bigint      NOT NULL DEFAULT nextval('lease_epoch_seq'),
    taken_at   timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);

ALTER SEQUENCE lease_epoch_seq OWNED BY leases.epoch;

CREATE INDEX leases_expires_at_idx ON leases (expires_at);

-- True while the lease is held under this epoch and not expired. Inside a writing
-- transaction it also locks the lease row (FOR SHARE), so no takeover can commit until
-- that transaction ends: a job fences its writes with
--   UPDATE … WHERE lease_is_held('cleanup', $epoch)
CREATE FUNCTION lease_is_held(p_name text, p_epoch bigint) RETURNS boolean
    LANGUAGE sql VOLATILE STRICT
    SET search_path FROM CURRENT
AS $$
    SELECT coalesce((SELECT true FROM leases l
                      WHERE l.name = p_name AND l.epoch = p_epoch AND l.expires_at >= now()
                        FOR SHARE), false)
$$;
