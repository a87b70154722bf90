-- The history of leaderships and deaths (migration 0020): what the history collector, the
-- status page and the reaper read and prune. The rows are written by the schema's own
-- functions and triggers, never by these statements; every time in them is the
-- database's clock.

-- name: history_since
-- Every read of the history is sent as history_since (pg_liveness_statement_calls_total
-- counts them together).
-- The rows after id $1, oldest first, at most $2 of them: the history collector's read of
-- what happened since its previous scrape. Empty strings and zeros for what a row lacks
-- (lease, epoch, host, service, how, reason); instance_id, since and dead_at may be NULL
-- (an infinite since or dead_at, which the schema never writes, is NULL; a row whose time
-- is infinite is not read); then the server's clock.
SELECT h.id, h.at, h.kind, coalesce(h.lease_name, '') AS lease_name, coalesce(h.epoch, 0) AS epoch, h.instance_id,
       coalesce(h.host, '') AS host, coalesce(h.service, '') AS service, coalesce(h.how, '') AS how,
       coalesce(h.reason, '') AS reason, CASE WHEN isfinite(h.since) THEN h.since END AS since,
       CASE WHEN isfinite(h.dead_at) THEN h.dead_at END AS dead_at, now() AS now
  FROM {schema}.history h
 WHERE h.id > $1::bigint AND isfinite(h.at)
 ORDER BY h.id
 LIMIT $2::integer

-- name: history_last_id tag=history_since
-- The newest row's id (0 when the history is empty): where a collector that just started
-- begins, so that it counts what happens from then on, as every counter does.
SELECT coalesce(pg_catalog.max(h.id), 0)::bigint AS last_id FROM {schema}.history h

-- name: history_recent tag=history_since
-- The newest rows of the last $1 seconds, newest first, at most $2 of them, and the
-- server's clock: the status page's timelines. Columns as history_since's. An index scan
-- of history_at_idx from its end: the rows read, not the history, set its cost.
SELECT h.id, h.at, h.kind, coalesce(h.lease_name, '') AS lease_name, coalesce(h.epoch, 0) AS epoch, h.instance_id,
       coalesce(h.host, '') AS host, coalesce(h.service, '') AS service, coalesce(h.how, '') AS how,
       coalesce(h.reason, '') AS reason, CASE WHEN isfinite(h.since) THEN h.since END AS since,
       CASE WHEN isfinite(h.dead_at) THEN h.dead_at END AS dead_at,
       now() AS now
  FROM {schema}.history h
 WHERE h.at >= now() - make_interval(secs => $1::float8) AND isfinite(h.at)
 ORDER BY h.at DESC, h.id DESC
 LIMIT $2::integer

-- name: lease_leaderless tag=history_since
-- The leases that nobody leads now although their row stands: expired (its holder stopped
-- renewing, or left it to expire), or held by an instance dead by the verdict. For each,
-- the seconds since it was last led: since its holder's last sign of life (the lock's
-- vanishing as stamped, or its last heartbeat) when the holder is dead and that came
-- before the expiry, else since the expiry; and why ('holder_dead' or 'expired'), as the
-- history will record the end when the next holder takes it. A lease let go is deleted
-- and is not here: its holder said so. The verdict (instance_state_verdicts, which writes
-- nothing) is taken of the leases' holders only, in one pass: pg_locks is read once, and
-- the fleet's other instances are not judged.
WITH holders AS (
    SELECT DISTINCT l.holder_instance_id AS id FROM {schema}.leases l WHERE l.holder_instance_id IS NOT NULL
),
dead AS (
    SELECT s.instance_id FROM {schema}.instance_state_verdicts() s
     WHERE NOT s.alive AND s.instance_id IN (SELECT h.id FROM holders h)
),
candidates AS (
    SELECT l.name, l.expires_at, l.holder_instance_id, l.holder_instance_id IN (SELECT d.instance_id FROM dead d) AS holder_dead
      FROM {schema}.leases l
     WHERE l.expires_at < now() OR l.holder_instance_id IN (SELECT d.instance_id FROM dead d)
)
SELECT c.name,
       extract(epoch FROM now() - least(c.expires_at, d.last_alive_at))::float8 AS leaderless_for,
       CASE WHEN d.last_alive_at < c.expires_at THEN 'holder_dead' ELSE 'expired' END AS after
  FROM candidates c
  LEFT JOIN LATERAL {schema}.history_death_of(c.holder_instance_id) d ON c.holder_dead

-- name: history_prune tag=cleanup
-- The reaper's round: deletes history older than $1 seconds, at most $2 rows, and rows
-- dated more than a day ahead of the server's clock. Returns the rows deleted and how
-- many of them were dated ahead.
SELECT p.pruned, p.ahead FROM {schema}.history_prune(make_interval(secs => $1::float8), $2::integer) p
