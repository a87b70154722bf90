-- Leases: taking, renewing, releasing and fencing a lease, and reading who holds one.
-- Every time comes from the server's clock: the client sends the ttl in seconds, and a fence
-- the deadline it computed from times this server returned.
-- Each statement runs on a pool connection borrowed for that statement alone.

-- name: lease_acquire
-- Through lease_take (migration 0015), which writes the table with its owner's rights and
-- stores the holder token's SHA-256: the agents' roles need no privilege on the table,
-- and only the acquisition that holds a lease can renew, release or detach it (each
-- statement below presents its token). Inserts the row, or takes it over only when it has expired by the database clock. ON
-- CONFLICT DO UPDATE decides atomically, so two callers can never both get a row back.
-- The SELECT yields no row while the lease is held, so a refused attempt draws no epoch:
-- epochs count acquisitions (only racing attempts on an expired lease waste one), and the
-- common "held by another" answer takes no row lock.
--
-- A lease whose holder instance is dead by the one verdict (is_instance_alive) is free as
-- well, so a crashed holder's lease moves without waiting for its ttl; and an acquirer
-- that names its instance takes the lease only while that instance is alive by the same
-- verdict, so that its own death is visible to the others.
--
-- $1 name, $2 holder, $3 ttl in seconds, $4 the holder's instance id (or NULL), $5 its
-- host. Returns the epoch, taken_at and expires_at once taken. Refused, it returns one
-- row without them that says why, so that a follower needs no second statement to know
-- whether to wait quietly: whether another holder alive by the verdict holds the lease
-- (held_by_live), and the row's holder instance as it was (holder_instance_id: this very
-- instance after a release that failed, or NULL).
SELECT t.epoch, t.taken_at, t.expires_at, t.held_by_live, t.holder_instance_id
  FROM {schema}.lease_take($1, $2, $3::float8, $4::uuid, $5::text) t

-- name: lease_renew
-- Extends the lease only while this very acquisition (name, holder and epoch) still
-- holds it and it has not expired by the database clock. Matching on name and holder
-- alone lets a stale process renew a lease it has lost; the expiry guard stops a late
-- renewal from resurrecting an expired lease before someone else takes it.
-- $1 name, $2 holder, $3 epoch, $4 ttl in seconds. Returns the new expires_at; no row
-- when the lease is lost.
SELECT e FROM {schema}.lease_extend($1, $2, $3, $4::float8) AS e

-- name: lease_release
-- Deletes the row only if it still belongs to this acquisition, so a late release never
-- deletes a newer holder's lease. $1 name, $2 holder, $3 epoch, $4 why the holder lets it
-- go: '' when it simply releases it, or the liveness.LostReason of a leadership it lost.
-- The history (migration 0020) records the end as stepped_down with that reason; the
-- setting lasts until the statement's transaction ends, and a schema without the history
-- ignores it.
SELECT {schema}.lease_let_go($1, $2, $3) FROM pg_catalog.set_config('pg_liveness.end_reason', $4::text, true)

-- name: lease_abandon tag=lease_release
-- Deletes the row an acquisition may have inserted when its answer was lost: the holder
-- token is new on every acquisition, so it matches nothing else. $1 name, $2 holder.
SELECT {schema}.lease_abandon($1, $2)

-- name: lease_detach tag=lease_release
-- Leaves a lease to expire: without a holder instance, lease_is_free no longer frees it
-- when that instance is dead, only once it expires. Guarded like the release, so it never
-- touches a newer holder's row. Sent as a release: it is how a holder lets a lease go
-- when it may not delete it yet. $1 name, $2 holder, $3 epoch.
SELECT {schema}.lease_detach($1, $2, $3)

-- name: lease_leader
-- Who holds a lease: the elector's followers and Reader.Leader. $1 name.
SELECT l.holder_instance_id, coalesce(l.holder_host, '') AS holder_host, l.epoch,
       l.taken_at, l.expires_at, l.expires_at >= now() AS held,
       l.holder_instance_id IS NULL OR {schema}.is_instance_alive(l.holder_instance_id) AS holder_alive
  FROM {schema}.leases l WHERE l.name = $1

-- name: lease_fence
-- A leader's fence, inside the transaction of the writes it guards (Lease.Fence): fence
-- (migration 0017) acts only for the holder whose token it is given, and locks the lease
-- row FOR KEY SHARE until that transaction ends, so no takeover (nor release) commits in
-- between, while renewals go on. The deadline is the leader's own (Lease.FenceDeadline, on this
-- server's clock): a fence that reaches the server after its sender was told it lost the
-- lease (held back by the network, say) is refused, even while nobody has taken the lease
-- yet; and so is the transaction's COMMIT when it reaches the server past that deadline
-- (migration 0009's check at commit, queued by the fence whatever it answers).
-- The transaction may then idle (between its statements) at most $4 (the lease's ttl,
-- as '<n>ms'), after which the server ends the session: a holder that hangs with a
-- fenced transaction open (SIGSTOP, a pause) would otherwise hold the row lock, and so
-- every takeover, until it resumes; this way no longer than its lease would have lasted.
-- $1 name, $2 holder, $3 epoch, $4 the fence deadline, $5 the idle limit. Returns whether
-- the lease is held under that epoch, and whether the server's clock is still before the
-- deadline.
SELECT f.held, f.in_time
  FROM {schema}.fence($1, $2, $3, $4) f,
       pg_catalog.set_config('idle_in_transaction_session_timeout', $5::text, true) AS idle

-- name: lease_fence_strict tag=lease_fence
-- The fence of Lease.BeginTx (and of Lease.Exec's second try, see fenced.go): the same, but a refusal is an error, so that
-- the writes sent after it in the same pipeline never run: SQLSTATE LVF01 when the lease
-- is not held under the epoch, LVF02 when the fence came past its deadline.
-- $1 name, $2 holder, $3 epoch, $4 the fence deadline, $5 the idle limit (as lease_fence's).
SELECT f.held
  FROM {schema}.fence($1, $2, $3, $4, true) f,
       pg_catalog.set_config('idle_in_transaction_session_timeout', $5::text, true) AS idle

-- name: lease_fence_exec tag=lease_fence
-- The fence of Lease.Exec, sent in one pipeline with the write it guards and no BEGIN or
-- COMMIT: the two run as one implicit transaction, committed at the pipeline's Sync, so
-- the write takes one round trip and its COMMIT leaves with the fence (whose deadline is
-- then the COMMIT's). Refuses as lease_fence_strict does (LVF01, LVF02) and queues the
-- same check at commit (migration 0018). $1 name, $2 holder, $3 epoch, $4 the fence
-- deadline.
SELECT {schema}.fence_exec($1, $2, $3, $4)

-- name: lease_fence_commit tag=lease_fence
-- Sent with the COMMIT of a transaction of Lease.BeginTx (when its deadline moved since
-- its fence) or of Lease.Exec's second try, in one simple
-- query ("...; COMMIT"), with the deadline read just before it: the check at commit then
-- holds the COMMIT to the deadline as of when it was sent, so that the time the
-- transaction's own statements took (a row lock's wait, say) does not count. Transaction
-- local: it ends with the transaction. $1, inlined as a literal of digits, colons, a
-- minus sign and hex only: '<epoch>:<the deadline in Unix microseconds>:<signature>', signed
-- with the fence's commit key (migration 0017), which no one without the holder's token
-- can make.
SELECT pg_catalog.set_config('pg_liveness.commit_deadline', $1, true)

-- name: lease_renew_many
-- Renews many leases of one holder instance at once (a shard set's member lease and
-- every shard it owns), each only while that very acquisition (name, holder and epoch)
-- still holds it and it has not expired, as lease_renew does one: the cost of owning
-- many shards is one statement per renewal, not one per shard. $1 names, $2 holders,
-- $3 epochs (arrays of one length), $4 ttl in seconds. Returns the leases renewed and
-- their new expiry; a lease missing from the answer is lost.
SELECT r.name, r.expires_at FROM {schema}.lease_extend_many($1::text[], $2::text[], $3::bigint[], $4::float8) AS r

-- name: lease_acquire_many tag=lease_acquire
-- Takes many leases for one holder instance at once (a shard set member's share), each
-- as lease_acquire takes one, with a holder token of its own: one statement however many
-- shards a member comes to own. $1 names, $2 holders (arrays of one length), $3 ttl in
-- seconds, $4 the holder's instance id, $5 its host. Returns the leases taken, with
-- their epoch, taken_at and expires_at; a name missing from the answer is held.
SELECT t.name, r.epoch, r.taken_at, r.expires_at
  FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[])) AS t(name, holder)
 CROSS JOIN LATERAL {schema}.lease_take(t.name, t.holder, $3::float8, $4::uuid, $5::text) AS r
 WHERE r.epoch IS NOT NULL

-- name: shard_free tag=shard_members
-- Which of the shards a member waits for are free now (no unexpired row, or one whose
-- holder instance is dead by the one verdict), read without a row lock: a member tries to
-- take only those, so that its tries never hold the row of a shard another member is
-- about to release (a try locks each row it tries until its statement ends). The verdict
-- is asked once per holder, not per shard. $1 lease names. Returns the free ones.
SELECT w.name
  FROM pg_catalog.unnest($1::text[]) AS w(name)
  LEFT JOIN {schema}.leases l ON l.name = w.name AND l.expires_at >= pg_catalog.now()
 WHERE l.name IS NULL
    OR l.holder_instance_id IS NOT NULL AND l.holder_instance_id <> ALL (
           SELECT h.id
             FROM (SELECT DISTINCT k.holder_instance_id AS id FROM {schema}.leases k
                    WHERE k.name = ANY ($1::text[]) AND k.holder_instance_id IS NOT NULL) h
            WHERE {schema}.is_instance_alive(h.id))

-- name: lease_abandon_many tag=lease_release
-- lease_abandon for many acquisitions at once, whose answer was lost: $1 names, $2
-- holders (arrays of one length). Returns how many rows went.
SELECT coalesce(pg_catalog.sum({schema}.lease_abandon(t.name, t.holder)), 0)::bigint
  FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[])) AS t(name, holder)

-- name: lease_release_many tag=lease_release
-- lease_release for many acquisitions at once (the shards a member gives up together, all
-- of them when it stops): each row goes only if it still belongs to its acquisition. $1
-- names, $2 holders, $3 epochs (arrays of one length). Returns how many rows went.
SELECT coalesce(pg_catalog.sum({schema}.lease_let_go(t.name, t.holder, t.epoch)), 0)::bigint
  FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::bigint[]))
       AS t(name, holder, epoch)

-- name: lease_detach_many tag=lease_release
-- lease_detach for many acquisitions at once (the shards whose callbacks outlived their
-- wind-down): each is left to expire. $1 names, $2 holders, $3 epochs (arrays of one
-- length). Returns how many rows were left.
SELECT coalesce(pg_catalog.sum({schema}.lease_detach(t.name, t.holder, t.epoch)), 0)::bigint
  FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]), pg_catalog.unnest($3::bigint[]))
       AS t(name, holder, epoch)

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
