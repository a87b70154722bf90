-- The heartbeat: an agent's instance row, and the reaper that removes dead ones.

-- name: heartbeat
-- Upserts the instance row, timed by the database clock. started_at is kept from the
-- first insert. The row carries the instance's own timing, so that observers judge it by
-- the settings it runs with, and whether it holds its alive lock: while that is true, a
-- vanished lock means the session ended (see instance_states).
-- $1 instance id, $2 service, $3 host, $4 pid, $5 liveness mode, $6 metadata (a JSON
-- object), $7 holds_alive_lock; $8 to $12 the heartbeat interval, slow interval, stale
-- threshold, definitive-dead cutoff and lock grace in seconds (NULL when not configured);
-- $13 the backend pid of the session that holds the alive lock (0 when none does): only
-- that session's lock counts for the instance (migration 0012). The claim records it on
-- the row; a beat writes it only on a row that records none yet (the claim ran before the
-- row existed), never over a claim's: a beat read the lock's state before it was sent,
-- and one sent before the lock was lost and claimed again from a new session can land
-- after that claim, which would make the new session's lock a stranger's.
-- The row's time never moves back: a beat whose transaction began before another's
-- committed (it waited for the row, or its message was held back) keeps the newer time, so
-- the row is never older than the last beat this process saw acknowledged, which its
-- leaders count on (internal/lifegate).
-- $14 is the beat's deadline by the server's clock (NULL: none): a beat the process gave
-- up on never lands after it, so that it cannot overwrite a newer beat's word. Without it,
-- a beat that recorded the lock as held, abandoned on a slow link, could land after the
-- beat that recorded its loss, and the row would claim a lock that is gone. The deadline is
-- checked after the row is locked: a beat that passed it commits before any later beat
-- can write the row.
-- Returns the row's time (this beat's, or a newer one that committed while it ran: either
-- way a reading of the server's clock taken while it ran; NULL when the beat was past its
-- deadline and wrote nothing), whether the row had to be inserted, which after the first
-- beat means that it was removed as dead in between, and the server's clock (now()), from
-- which the process times its next deadline whether or not this beat landed.
WITH beat AS (
INSERT INTO {schema}.instances AS i
       (instance_id, service_name, host_name, process_id, started_at, last_heartbeat_at, liveness_mode, metadata,
        holds_alive_lock, heartbeat_interval, heartbeat_slow_interval, stale_threshold, definitive_dead_cutoff, lock_grace,
        lock_pid)
SELECT $1::uuid, $2::text, $3::text, $4::integer, now(), now(), $5::text, $6::jsonb,
       $7::boolean, make_interval(secs => $8::float8), make_interval(secs => $9::float8),
       make_interval(secs => $10::float8), make_interval(secs => $11::float8), make_interval(secs => $12::float8),
       $13::integer
 WHERE $14::timestamptz IS NULL OR pg_catalog.clock_timestamp() <= $14::timestamptz
ON CONFLICT (instance_id) DO UPDATE
   SET service_name = excluded.service_name,
       host_name = excluded.host_name,
       process_id = excluded.process_id,
       last_heartbeat_at = greatest(i.last_heartbeat_at, excluded.last_heartbeat_at),
       liveness_mode = excluded.liveness_mode,
       metadata = excluded.metadata,
       holds_alive_lock = excluded.holds_alive_lock,
       heartbeat_interval = excluded.heartbeat_interval,
       heartbeat_slow_interval = excluded.heartbeat_slow_interval,
       stale_threshold = excluded.stale_threshold,
       definitive_dead_cutoff = excluded.definitive_dead_cutoff,
       lock_grace = excluded.lock_grace,
       lock_pid = CASE WHEN excluded.holds_alive_lock AND coalesce(i.lock_pid, 0) = 0 THEN excluded.lock_pid
                       ELSE coalesce(i.lock_pid, 0) END
 WHERE $14::timestamptz IS NULL OR pg_catalog.clock_timestamp() <= $14::timestamptz
RETURNING i.last_heartbeat_at, i.xmax = 0 AS inserted
)
SELECT b.last_heartbeat_at, coalesce(b.inserted, false), now()
  FROM (SELECT) AS one LEFT JOIN beat b ON true

-- name: heartbeat_delete
-- Removes the instance row on graceful shutdown, so that other instances see it gone at
-- once. $1 instance id.
DELETE FROM {schema}.instances WHERE instance_id = $1::uuid

-- name: cleanup
-- The reaper's round: deletes the instances that are dead by the one verdict and
-- returns their ids. $1 and $2 the stale threshold and definitive-dead cutoff in
-- seconds, for rows that record no timing of their own.
SELECT id FROM {schema}.cleanup_stale_instances(
	now() - make_interval(secs => $1), now() - make_interval(secs => $2)) AS id
