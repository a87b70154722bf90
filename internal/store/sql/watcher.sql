-- The watcher (package liveness): one agent of the fleet, elected for it, records the
-- vanishing of alive locks when it happens and tells the waiters; and the alive lock's
-- session listens to the schema's events (see migration 0007 for the channel and the
-- payloads).

-- name: watch_alive_locks
-- One tick: the digest of the exclusive advisory locks, the locks the rows expect (from
-- migration 0021) and the absence stamps, and when it differs from the previous tick's,
-- the stamp of every vanished alive lock. From
-- migration 0010 on it also records the tick (while one is recent, refused lease tries
-- judge holders from their rows and stamps, not pg_locks) and notifies the leases that
-- expired since the previous one. $1 the previous digest (NULL on the first tick).
-- Returns the digest (after a stamp, as the stamp left the stamps), then one row per
-- standing absence not notified yet: the instance and the seconds until its grace ends.
SELECT w.digest, w.instance_id, w.dead_in FROM {schema}.watch_alive_locks($1::text) w

-- name: notify_dead_instances
-- Notifies dead:<id> for the instances of $1 (uuid[]) that are dead by the verdict, and
-- free:<name> for the leases they hold, once per absence (migration 0021: a stamp another
-- watcher notified is not notified again). Returns the ids notified, by this call or before.
SELECT d.id FROM {schema}.notify_dead_instances($1::uuid[]) AS d(id)

-- name: watch_fresh
-- How long ago a watcher last ticked, in seconds, and the lock count it saw then (the
-- fleet's size, roughly); no row when none has in this server lifetime (migration 0011
-- on). Every agent's sentry asks, at a pace that keeps the fleet's questions to a few a
-- second (the reaper's leader every tick): when both watchers died at once nobody
-- notifies their leases free or stamps their locks, and a sentry that finds no recent
-- tick ticks in their place until one is back.
SELECT w.age, w.lock_count FROM {schema}.alive_lock_watch_state() w

-- name: events_listen
-- LISTEN on the schema's events channel, on the alive lock's session. Returns the channel.
SELECT {schema}.events_listen()

-- name: members_listen
-- LISTEN on the schema's members channel (joined:, left:, dead:; migration 0010 on), on
-- the alive lock's session, while something in the process waits for membership (a
-- watcher that leads, Agent.WatchAlive). Returns the channel.
SELECT {schema}.members_listen()

-- name: members_unlisten tag=members_listen
-- UNLISTEN the members channel once nothing waits for membership. Returns the channel.
SELECT {schema}.members_unlisten()
