package liveness

import "github.com/pg-liveness/pg_liveness_exporter/internal/sqltag"

// Statements of the alive lock and the heartbeat. Each carries its sqltag right after its
// first keyword, where every major keeps it in pg_stat_statements' text, so that the
// exporter's statements collector can classify it; {schema} is rendered
// by sqlFor. Ids are passed as text and cast on the server, which works in every pgx query
// mode, including the ones a PgBouncer in front of the service's pool needs.

// claimSQL claims the alive lock, but only when the statement runs on the session the
// server opened for this connection ($2 is the backend pid from the startup handshake).
// Behind a transaction-mode pooler it runs on some other server session, and a claim there
// would leave the lock on a pooled backend that outlives this process; so it returns
// NULL instead, and the caller reports the pooling.
const claimSQL = `SELECT ` + sqltag.AliveLockClaim + ` pg_catalog.pg_backend_pid(),
       CASE WHEN pg_catalog.pg_backend_pid() = $2::bigint
            THEN {schema}.claim_instance_alive_lock($1::uuid) END`

// verifySQL reports whether this very backend holds the instance's alive lock, with the
// same match (this database, objsubid = 1, both key halves) the views use.
const verifySQL = `SELECT ` + sqltag.AliveLockVerify + ` pg_catalog.pg_backend_pid(),
       EXISTS (SELECT 1 FROM {schema}.bigint_advisory_locks l
                WHERE l.granted
                  AND l.pid = pg_catalog.pg_backend_pid()
                  AND l.classid = {schema}.lock_key_classid({schema}.instance_lock_key($1::uuid))
                  AND l.objid = {schema}.lock_key_objid({schema}.instance_lock_key($1::uuid)))`

// heartbeatSQL upserts the instance row, timed by the database clock. started_at is kept
// from the first insert. The row carries the instance's own timing, so that observers
// judge it by the settings it runs with, and whether it holds its alive lock: while that
// is true, a vanished lock means the session ended (see instance_states). It returns
// whether the row had to be inserted, which after the first beat means that it was
// removed as dead in between.
//
// $7 holds_alive_lock; $8–$12 heartbeat interval, slow interval, stale threshold,
// definitive-dead cutoff and lock grace in seconds (NULL when not configured).
const heartbeatSQL = `INSERT ` + sqltag.Heartbeat + ` INTO {schema}.instances AS i
       (instance_id, service_name, host_name, process_id, started_at, last_heartbeat_at, liveness_mode, metadata,
        holds_alive_lock, heartbeat_interval, heartbeat_slow_interval, stale_threshold, definitive_dead_cutoff, lock_grace)
VALUES ($1::uuid, $2::text, $3::text, $4::integer, now(), now(), $5::text, $6::jsonb,
        $7::boolean, make_interval(secs => $8::float8), make_interval(secs => $9::float8),
        make_interval(secs => $10::float8), make_interval(secs => $11::float8), make_interval(secs => $12::float8))
ON CONFLICT (instance_id) DO UPDATE
   SET service_name = excluded.service_name,
       host_name = excluded.host_name,
       process_id = excluded.process_id,
       last_heartbeat_at = excluded.last_heartbeat_at,
       liveness_mode = excluded.liveness_mode,
       metadata = excluded.metadata,
       holds_alive_lock = excluded.holds_alive_lock,
       heartbeat_interval = excluded.heartbeat_interval,
       heartbeat_slow_interval = excluded.heartbeat_slow_interval,
       stale_threshold = excluded.stale_threshold,
       definitive_dead_cutoff = excluded.definitive_dead_cutoff,
       lock_grace = excluded.lock_grace
RETURNING i.last_heartbeat_at, i.xmax = 0`

// heartbeatDeleteSQL removes the instance row on graceful shutdown, so that other
// instances see it gone at once.
const heartbeatDeleteSQL = `DELETE ` + sqltag.HeartbeatDelete + ` FROM {schema}.instances WHERE instance_id = $1::uuid`
