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
-- Whether this very backend holds the instance's alive lock, with the same match (this
-- database, objsubid = 1, both key halves) the views use.
-- $1 instance id. Returns the backend's pid, whether it holds the lock, and the server's
-- clock while the statement ran (as the claim does).
SELECT pg_catalog.pg_backend_pid(),
       EXISTS (SELECT 1 FROM {schema}.bigint_advisory_locks l
                WHERE l.granted
                  AND l.pid = pg_catalog.pg_backend_pid()
                  AND l.classid = {schema}.lock_key_classid({schema}.instance_lock_key($1::uuid))
                  AND l.objid = {schema}.lock_key_objid({schema}.instance_lock_key($1::uuid))),
       pg_catalog.clock_timestamp()
