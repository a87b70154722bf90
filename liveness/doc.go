// Package liveness lets instances of a service that share one PostgreSQL tell which of
// them are alive, and run singleton jobs on one instance at a time. It is what the
// pg_liveness_exporter agent runs, and a Go service can embed the same parts. The SQL
// objects it uses come from the migrations package.
//
// # Signals
//
// An instance is alive while either signal says so (is_instance_alive in SQL):
//
//   - The alive lock (AliveLock): a session-level advisory lock on the instance's id,
//     held on a dedicated connection. PostgreSQL releases it when the session ends: at
//     once when the process exits or its connection drops, and on a half-open connection
//     (a crashed host, a network partition) when TCP keepalive gives up, about 30 s with
//     the defaults instead of Linux's two hours.
//   - The heartbeat (HeartbeatWorker): the instance's row in <schema>.instances, whose
//     last_heartbeat_at is set by the database clock.
//
// # What it guarantees
//
//   - The lock counts as held only after it was claimed and then verified, on every tick,
//     on this connection's own backend. A connection through a transaction-mode pooler
//     (PgBouncer) fails that check, is reported not held with one log line that says why,
//     and never claims, so no lock is left behind on a pooled server connection.
//   - A dropped lock connection is noticed at once, by a read on the idle connection, not
//     at the next verification. The lock is then claimed again after a reconnect with
//     backoff and jitter. A claim that fails (a duplicate instance id, migrations not yet
//     applied) is logged once and retried; it is never fatal.
//   - The heartbeat beats at the slow interval only while the lock is held and verified,
//     and at the fast interval otherwise; the cadence is chosen again after every beat.
//     Losing the lock triggers a beat at once. Whatever the cadence, a watchdog starts the
//     next beat within the stale threshold minus one fast interval of the previous one.
//     A failed beat is retried after a fraction of the fast interval.
//   - Every statement carries a deadline below the interval it serves, and a
//     /* pg_liveness:<name> */ tag so that pg_stat_statements can count it.
//
// # What it never does
//
//   - Hold a pool connection. The alive lock has its own pgx.Conn, opened from the direct
//     DSN; the heartbeat and leases borrow a pool connection for one statement at a time.
//   - Trust the local clock for liveness. Heartbeat times and lease expiries are the
//     database's now(). The local monotonic clock only schedules statements, and gives
//     a lease up early when its renewals stop; it never extends anything.
//   - Log a password.
//
// # Embedding it in a service
//
// Open the AliveLock on a DSN that reaches PostgreSQL directly (not through PgBouncer in
// transaction mode), run a HeartbeatWorker on the service's pgxpool with the lock as its
// LockSource, and take Leases from the same pool for singleton jobs. On shutdown, stop
// the heartbeat, delete the row with Remove, release leases, and then stop the lock,
// whose session end releases it. See the example.
package liveness
