// Package liveness lets instances of a service that share one PostgreSQL tell which of
// them are alive, and run singleton jobs on one instance at a time. It is what the
// pg_liveness_exporter agent runs, and a Go service can embed the same parts. The SQL
// objects it uses come from the migrations package.
//
// # Signals
//
// Two signals feed one verdict. The SQL function instance_states (from the migrations)
// is the only definition of an instance's state; is_instance_alive, the reaper, the
// exporter and Reader (Reader.Fleet for a whole fleet at once, as the exporter's status
// page reads it) all read it, and each instance is judged by the timing its own
// heartbeat records:
//
//   - The alive lock (AliveLock): a session-level advisory lock on the instance's id,
//     held on a dedicated connection. PostgreSQL releases it when the session ends: at
//     once when the process exits or its connection drops, and on a half-open connection
//     (a crashed host, a network partition) when TCP keepalive gives up, about 30 s with
//     the defaults instead of Linux's two hours.
//   - The heartbeat (HeartbeatWorker): the instance's row in <schema>.instances, whose
//     last_heartbeat_at is set by the database clock, and which records whether the
//     instance holds its lock.
//
// A lock that vanishes while the row says it is held means the session ended. The
// instance is dead unless it proves life within its lock grace (1 s by default): a live
// agent notices its session's end at once and beats through its pool. So a crashed
// process is dead for everyone about a second after PostgreSQL frees its lock, while a
// restarted server, a terminated backend or a short network blip kills nobody.
//
// # Leadership
//
// Leases hold no connection. An Agent's leases record its instance as their holder, so
// Reader.Leader can say who leads, and a holder that is dead by the verdict may be
// replaced before its lease expires. In exchange the agent ends its leases (reason
// LostNotAlive) as soon as it cannot be sure that the fleet still sees it alive, always
// before anyone else can take them. Leases.Elect runs a campaign with callbacks on top.
// Every write that must never come from two leaders is fenced in the database with
// lease_is_held(name, epoch).
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
//     /* pg_liveness:<name> */ tag right after its first keyword (where PostgreSQL 14 to
//     18 all keep it in pg_stat_statements' text), so that the exporter can count it.
//
// # What it never does
//
//   - Hold a pool connection. The alive lock has its own pgx.Conn, opened from the direct
//     DSN; the heartbeat and leases borrow a pool connection for one statement at a time.
//   - Trust the local clock for liveness. Heartbeat times and lease expiries are the
//     database's now(). The local monotonic clock only schedules statements, and gives
//     a lease up early when its renewals stop; it never extends anything.
//   - Log a password. Each constructor wraps the Logger it is given in a slog.Handler
//     that removes passwords from every line it passes on (the message, strings, errors
//     and any value whose printed form holds one), so no line of this package can leak
//     one, whatever the caller's handler. Errors it returns carry no password either.
//
// # Logging
//
// Every config has a Logger field; nil discards. A part logs with no key naming itself:
// whoever owns it adds that, once. The Agent gives its parts part=alive_lock,
// part=heartbeat, part=leases and part=reaper, and adds nothing naming the agent; a
// process that runs several agents adds what tells them apart (an instance id). A
// condition that repeats (a connection that keeps failing, a duplicate instance id) is
// logged once when it begins or changes, at debug level while it lasts, and once when it
// ends.
//
// # Embedding it in a service
//
// Build one Agent with NewAgent: give it the service's pgxpool (heartbeat, leases,
// reaper) and a DirectDSN that reaches PostgreSQL directly, never through PgBouncer in
// transaction mode (the alive lock's own connection). Run it in a goroutine the
// service owns, and campaign for singleton jobs with Agent.Leases().Elect, whose leases
// record the instance as their holder and end as soon as it cannot prove life. To stop,
// cancel Run's context and wait for it to return: it stops the heartbeat and the
// reaper, deletes the instance row while the lock is still held, and then closes the
// lock's session, so the fleet sees the instance gone at once. Apply the migrations
// (migrations.Apply) before, or set AgentConfig.WaitForSchema. Read the fleet with a
// Reader. See ExampleAgent, ExampleLeases_Elect and ExampleReader.
//
// AliveLock, HeartbeatWorker and Leases stay exported for a service that needs them on
// their own (leases without an alive lock, for instance); an Agent wires them together
// as the guarantees above need, and hand wiring must keep their order of shutdown.
package liveness
