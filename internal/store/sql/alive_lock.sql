-- The alive lock's session: claiming and verifying the lock on the agent's direct
-- connection. Ids are passed as text and cast on the server, which works in every pgx
-- query mode, including the ones a PgBouncer in front of the service's pool needs.

-- name: alive_lock_claim
-- Claims the alive lock, but only when the statement runs on the session the server
-- opened for this connection ($2 is the backend pid from the startup handshake). Behind
-- a transaction-mode pooler it runs on some other server session, and a claim there
-- would leave the lock on a pooled backend that outlives this process; so it returns
-- NULL instead, and the caller reports the pooling.
-- $1 instance id, $2 the backend pid of the startup handshake.
-- Returns the backend's pid, whether the claim succeeded (NULL: not claimed) and the
-- server's clock while the statement ran, which a leader's fence deadline is counted from.
SELECT pg_catalog.pg_backend_pid(),
       CASE WHEN pg_catalog.pg_backend_pid() = $2::bigint
            THEN {schema}.claim_instance_alive_lock($1::uuid) END,
       pg_catalog.clock_timestamp()

-- name: alive_lock_verify
-- Whether this session still holds the lock it claimed, proved in O(1): a session-level
-- advisory lock is released only by its own session (an unlock, which nothing here
-- sends, or the session's end), so while the backend that took it still answers on this
-- connection, with the pid of the startup handshake (the caller compares them), the lock
-- is held. Reading pg_locks instead would copy the server's whole lock table and take
-- every lock-manager partition, on every agent every few seconds: O(fleet) each, O(fleet²)
-- in all.
-- $1 instance id (unused: kept so that claim and verify take the same arguments).
-- Returns the backend's pid, true, and the server's clock while the statement ran (as the
-- claim does).
SELECT pg_catalog.pg_backend_pid(), $1::uuid IS NOT NULL, pg_catalog.clock_timestamp()

-- name: alive_lock_holder
-- Who holds the instance's key after a claim that found it held (migration 0012 on): the
-- holder's backend pid, and whether it is the backend the instance's row records as the
-- one that claimed it (a second process with this instance id, or this instance's
-- previous session not yet ended) or not (a stranger's session, whose lock counts for
-- nobody). No row once nobody holds it. Reads pg_locks: sent after the first refused
-- claim, then at most every 30 s while the claims are refused.
-- $1 instance id.
SELECT h.holder_pid, h.claimed FROM {schema}.alive_lock_holder($1::uuid) h

-- name: alive_lock_release
-- Lets an instance's alive lock go on the calling session, which holds it: the node
-- agent, when the process it holds the lock for detaches or its local socket closes (it
-- exited, or was killed). The fleet then sees the lock vanish, as it would the process's
-- own session end. $1 instance id. Returns whether the session held it.
SELECT pg_catalog.pg_advisory_unlock({schema}.instance_lock_key($1::uuid))

-- name: lock_database
-- The database the session is on: a process that attaches to a node agent says which
-- database its pool reaches, and the node agent holds locks only for its own (a lock
-- held in another database would count for nobody while the process believed it held).
SELECT pg_catalog.current_database()

-- name: node_agent_dead_instances
-- Which of the given instances are dead by the one verdict: the node agent asks of the
-- instances whose claimant process has ended, before it lets another process claim one
-- (a new life of the id, never the old one's) and before it forgets one. $1 instance ids.
SELECT d.id FROM pg_catalog.unnest($1::text[]::uuid[]) AS d(id) WHERE NOT {schema}.is_instance_alive(d.id)

-- name: node_agent_rows_claiming_locks
-- How many of the given instances' rows still record that they hold their alive lock: a
-- node agent that stops waits, boundedly, until none does before its session ends, so
-- that each process has proved life by its heartbeat while its lock still stood, and no
-- observer sees a held lock vanish from under a row that claims it. $1 instance ids.
SELECT pg_catalog.count(*) FROM {schema}.instances i
 WHERE i.instance_id = ANY ($1::text[]::uuid[]) AND i.holds_alive_lock
