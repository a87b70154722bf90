-- Leases: taking, renewing, releasing and fencing a lease, and reading who holds one.
-- Every time comes from the server's clock: the client sends the ttl in seconds, and a fence
-- the deadline it computed from times this server returned.
-- Each statement runs on a pool connection borrowed for that statement alone.

-- name: lease_acquire
-- Inserts the row, or takes it over only when it has expired by the database clock. ON
-- CONFLICT DO UPDATE decides atomically, so two callers can never both get a row back.
-- The SELECT yields no row while the lease is held, so a refused attempt draws no epoch:
-- epochs count acquisitions (only racing attempts on an expired lease waste one), and the
-- common "held by another" answer takes no row lock.
--
-- A lease whose holder instance is dead by the one verdict (is_instance_alive) is free as
-- well, so a crashed holder's lease moves without waiting for its ttl; and an acquirer
-- that names its instance takes the lease only while that instance is alive by the same
-- verdict, so that its own death is visible to the others. {epoch_seq} is the epoch
-- sequence as nextval takes it, a regclass literal.
--
-- $1 name, $2 holder, $3 ttl in seconds, $4 the holder's instance id (or NULL), $5 its
-- host. Returns the epoch, taken_at and expires_at; no row when the lease is held.
INSERT INTO {schema}.leases AS l
       (name, holder, holder_instance_id, holder_host, epoch, taken_at, expires_at)
SELECT $1, $2, $4::uuid, $5::text, nextval({epoch_seq}), now(), now() + make_interval(secs => $3::float8)
 WHERE {schema}.lease_is_free($1)
   AND ($4::uuid IS NULL OR {schema}.is_instance_alive($4::uuid))
ON CONFLICT (name) DO UPDATE
   SET holder = excluded.holder, holder_instance_id = excluded.holder_instance_id, holder_host = excluded.holder_host,
       epoch = excluded.epoch, taken_at = excluded.taken_at, expires_at = excluded.expires_at
 WHERE l.expires_at < now()
    OR (l.holder_instance_id IS NOT NULL AND NOT {schema}.is_instance_alive(l.holder_instance_id))
RETURNING l.epoch, l.taken_at, l.expires_at

-- name: lease_renew
-- Extends the lease only while this very acquisition (name, holder and epoch) still
-- holds it and it has not expired by the database clock. Matching on name and holder
-- alone lets a stale process renew a lease it has lost; the expiry guard stops a late
-- renewal from resurrecting an expired lease before someone else takes it.
-- $1 name, $2 holder, $3 epoch, $4 ttl in seconds. Returns the new expires_at; no row
-- when the lease is lost.
UPDATE {schema}.leases
   SET expires_at = now() + make_interval(secs => $4::float8)
 WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at >= now()
RETURNING expires_at

-- name: lease_release
-- Deletes the row only if it still belongs to this acquisition, so a late release never
-- deletes a newer holder's lease. $1 name, $2 holder, $3 epoch.
DELETE FROM {schema}.leases
 WHERE name = $1 AND holder = $2 AND epoch = $3

-- name: lease_abandon tag=lease_release
-- Deletes the row an acquisition may have inserted when its answer was lost: the holder
-- token is new on every acquisition, so it matches nothing else. $1 name, $2 holder.
DELETE FROM {schema}.leases
 WHERE name = $1 AND holder = $2

-- name: lease_detach tag=lease_release
-- Leaves a lease to expire: without a holder instance, lease_is_free no longer frees it
-- when that instance is dead, only once it expires. Guarded like the release, so it never
-- touches a newer holder's row. Sent as a release: it is how a holder lets a lease go
-- when it may not delete it yet. $1 name, $2 holder, $3 epoch.
UPDATE {schema}.leases SET holder_instance_id = NULL
 WHERE name = $1 AND holder = $2 AND epoch = $3

-- name: lease_leader
-- Who holds a lease: the elector's followers and Reader.Leader. $1 name.
SELECT l.holder_instance_id, coalesce(l.holder_host, '') AS holder_host, l.epoch,
       l.taken_at, l.expires_at, l.expires_at >= now() AS held,
       l.holder_instance_id IS NULL OR {schema}.is_instance_alive(l.holder_instance_id) AS holder_alive
  FROM {schema}.leases l WHERE l.name = $1

-- name: lease_fence
-- A leader's fence, inside the transaction of the writes it guards (Lease.Fence):
-- lease_is_held locks the lease row FOR SHARE until that transaction ends, so no takeover
-- commits in between. The deadline is the leader's own (Lease.FenceDeadline, on this
-- server's clock): a fence that reaches the server after its sender was told it lost the
-- lease (held back by the network, say) is refused, even while nobody has taken the lease
-- yet; and so is the transaction's COMMIT when it reaches the server past that deadline
-- (migration 0009's check at commit, queued by the fence whatever it answers).
-- $1 name, $2 epoch, $3 the fence deadline. Returns whether the lease is held under that
-- epoch, and whether the server's clock is still before the deadline.
SELECT f.held, f.in_time FROM {schema}.fence($1, $2, $3) f

-- name: lease_fence_strict tag=lease_fence
-- The fence of Lease.Exec and Lease.BeginTx: the same, but a refusal is an error, so that
-- the writes sent after it in the same pipeline never run: SQLSTATE LVF01 when the lease
-- is not held under the epoch, LVF02 when the fence came past its deadline.
-- $1 name, $2 epoch, $3 the fence deadline.
SELECT f.held FROM {schema}.fence($1, $2, $3, true) f

-- name: lease_fence_commit tag=lease_fence
-- Sent with the COMMIT of a transaction of Lease.Exec or Lease.BeginTx, in one simple
-- query ("...; COMMIT"), with the deadline read just before it: the check at commit then
-- holds the COMMIT to the deadline as of when it was sent, so that the time the
-- transaction's own statements took (a row lock's wait, say) does not count. Transaction
-- local: it ends with the transaction. $1, inlined as a literal of digits, a colon and a
-- minus sign only: '<epoch>:<the deadline in Unix microseconds>'.
SELECT pg_catalog.set_config('pg_liveness.commit_deadline', $1, true)

-- name: lease_renew_many
-- Renews many leases of one holder instance at once (a shard set's member lease and
-- every shard it owns), each only while that very acquisition (name, holder and epoch)
-- still holds it and it has not expired, as lease_renew does one: the cost of owning
-- many shards is one statement per renewal, not one per shard. $1 names, $2 holders,
-- $3 epochs (arrays of one length), $4 ttl in seconds. Returns the leases renewed and
-- their new expiry; a lease missing from the answer is lost.
UPDATE {schema}.leases AS l
   SET expires_at = now() + make_interval(secs => $4::float8)
  FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::bigint[])) AS t(name, holder, epoch)
 WHERE l.name = t.name AND l.holder = t.holder AND l.epoch = t.epoch AND l.expires_at >= now()
RETURNING l.name, l.expires_at

-- name: shard_members
-- A shard set's live members (Agent.Shards): the instances holding an unexpired member
-- lease of the set, "<set>/member/<id>", whose holder is alive by the one verdict. $1 and
-- $2 the range of those names in byte order ("<set>/member/" and the same with its last
-- byte raised), which migration 0013's index answers. O(members).
SELECT l.holder_instance_id
  FROM {schema}.leases l
 WHERE l.name COLLATE "C" >= $1::text AND l.name COLLATE "C" < $2::text
   AND l.expires_at >= now() AND l.holder_instance_id IS NOT NULL
   AND {schema}.is_instance_alive(l.holder_instance_id)
