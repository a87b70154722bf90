// Package liveness lets instances of a service that share one PostgreSQL tell which of
// them are alive, and run singleton jobs on one instance at a time. It is what the
// pg_liveness_exporter agent runs, and a Go service embeds the same thing. The SQL
// objects it uses come from the migrations package, which applies them; every statement
// it sends comes from the exporter's internal data layer, which its collectors read
// too. A service imports this package (and migrations) and nothing else of the module:
// every type of its API is defined here.
//
// A service needs three things from it: an Agent to take part (NewAgent, Agent.Run),
// Agent.Elect to campaign for a singleton job, and a Reader to ask the verdict. Leases
// is for a service that wants leases without an alive lock (see below).
//
// # Signals
//
// Two signals feed one verdict. The SQL function instance_states (from the migrations)
// is the only definition of an instance's state; is_instance_alive, the reaper, the
// exporter and Reader (Reader.Fleet for a whole fleet at once, as the exporter's status
// page reads it) all read it, and each instance is judged by the Timing its own
// heartbeat records:
//
//   - The alive lock: a session-level advisory lock on the instance's id, held on a
//     dedicated connection (AgentConfig.DirectDSN). PostgreSQL releases it when the
//     session ends: at once when the process exits or its connection drops, and on a
//     half-open connection (a crashed host, a network partition) when TCP keepalive
//     gives up, about 30 s with the defaults instead of Linux's two hours.
//   - The heartbeat: the instance's row in <schema>.instances, whose last_heartbeat_at
//     is set by the database clock, and which records whether the instance holds its
//     lock.
//
// Only the session that claimed the lock counts (the row records its backend, migration
// 0012): a stranger's session that takes the key, which anyone may, counts for nobody.
//
// A lock that vanishes while the row says it is held means the session ended. The
// instance is dead unless it proves life within its lock grace (1 s by default): a live
// agent notices its session's end at once and beats through its pool. So a crashed
// process is dead for everyone about a second after PostgreSQL frees its lock, while a
// restarted server, a terminated backend or a short network blip kills nobody.
//
// # Nobody has to look
//
// The grace runs from when the vanished lock was first seen missing, so someone must
// see it: every Agent campaigns for the two watcher leases ("pg_liveness.watcher.a" and ".b"; at most one
// per agent, so that two processes watch and each notices the other's crash), and a
// watcher reads a digest of the advisory locks held, the locks the instances' rows
// expect and the stamps every 250 ms, stamping absences only when it changed: one
// statement per tick, and nothing written when nothing changed. Every lock that
// vanishes is stamped, even one claimed and lost between two ticks, and each absence is
// notified once, whichever watcher sees it first. A crashed instance is thus dead for the first
// look after any silence, about its lock grace after PostgreSQL freed its lock. When both
// watchers die at once, nobody is left to stamp their locks or to notify their leases
// free: so every Agent is a sentry, which asks now and then how long ago a watcher
// ticked (the fleet's sentries together about ten times a second whatever its size, the
// reaper's leader every tick), and when none did lately ticks in their place until a
// watcher is back (a crash is then dead a few hundred milliseconds later than with a
// watcher left). Readers stamp at their first look too: the fallback when no watcher
// runs (AgentConfig.DisableWatcher everywhere).
//
// Waiters are woken: the schema's events channel (<schema>_events; its real name is
// private from migration 0012 on, so that a role without USAGE on the schema can send
// nothing to it, and a flood from one that can costs each follower at most a try a
// second) carries free:<lease>
// (released, its holder dead, or expired: the watcher's tick notices) and taken:<lease>,
// and the alive lock's session LISTENs to it; the members channel (<schema>_members)
// carries dead:<id> (from the watcher, once the verdict agrees), left:<id> and
// joined:<id>, and the session LISTENs to it only while something of the process waits
// for membership (a watcher that leads, Agent.WatchAlive): PostgreSQL signals every
// listener of a channel for each notification, and a fleet that all listened to every
// join would pay O(N) per join. An elector's follower tries when its lease
// is free (within a random part of 250 ms, so that a fleet's followers do not all try at
// once; taken:<lease> sends the rest back to waiting), the reaper's too, and
// Agent.WatchAlive reads the alive set again. Notifications are only wake-ups, sent on
// commit: every waiter also polls, rarely while its session listens (QuietPeriod, 1 min)
// and another live instance leads, at RetryPeriod otherwise (not listening, or refused for
// a reason nothing notifies the end of: its own old row, a verdict on this very instance),
// so a dropped session or a lost notification delays, never misleads. In ModeHeartbeatTableOnly there is no listening session: polling only.
//
// What an agent costs the database is the same whatever the fleet's size: its statements
// are index lookups and updates of its own rows. Only the fleet's watcher reads pg_locks
// (a copy of the server's whole lock table, taken under every lock-manager partition):
// a session proves its own lock by answering from the backend that took it (a session
// lock is released only by that session), and while a watcher ticks, a refused lease try
// judges the holder from its row and its absence stamp rather than by the full verdict
// (migration 0010).
//
// A Reader reads this package's schema (ReaderConfig.Schema, with ReaderConfig.Fallback
// for rows that record no timing), or a Whizbang database as it is
// (ReaderConfig.Whizbang), judged by the same rule.
//
// ModeHeartbeatTableOnly is for a service that reaches PostgreSQL only through PgBouncer
// in transaction mode: no direct connection, no lock. Its instances are heartbeat_only
// while they beat, and a crashed one is dead after its stale threshold (90 s by
// default), not within a second.
//
// # Leadership
//
// Agent.Elect campaigns for a lease name: a row in <schema>.leases that holds no
// connection, records this instance as its holder (Reader.Leader says who leads) and
// carries an epoch, the fencing token, that strictly increases with every acquisition.
// Only the database clock decides expiry; this host's monotonic clock only gives a
// lease up early. The leader runs ElectorConfig.OnStartedLeading, and the campaign's
// rule is that an elector's lease outlives its job: another process may start only
// after the job's callback has returned, after a crash, or after the lease expired.
// Never two job runners at once, outside the database too.
//
// When another process may start, for each way a leadership ends (default settings:
// TTL 15 s, RetryPeriod 1 s, JobWindDown 10 s, lock grace 1 s, heartbeat every 30 s):
//
//   - Return. The callback returns on its own: the lease is released (its row deleted)
//     and another process may start at once: the release is notified and wakes the
//     followers, or at their next try (within their QuietPeriod) without it.
//   - Cancel. Elect's context or Run's ends (SIGTERM): the callback's context is
//     cancelled, and the lease stays renewed, and the instance alive (Run still beats
//     and holds its lock), while the callback winds down. Another process may start
//     once the callback has returned, as above. A callback still running JobWindDown
//     after the cancel has its lease left to expire instead: its renewals stop, and its
//     row no longer names the instance, so that the instance's going away does not free
//     it; another process may start once it expires, at most TTL after its last
//     renewal. Elect then returns ErrWindDownExceeded.
//   - Lost lease. The callback's context is cancelled with a *LeaseLostError. When the
//     trust window runs out (the database unreachable or not answering: Reason "expired",
//     "error"), the cancel comes TTL less the margin (TTL/10, 1.5 s) after the last
//     renewal that succeeded was sent, and the row expires by the database clock no
//     earlier than TTL after it: the callback has at least the margin before another
//     process may start (clocks running at the same rate). When a renewal finds the
//     lease taken (Reason "taken"), another process may already run: that happens only if
//     the row was changed by hand, or this host's clock ran slower than the database's
//     by more than the margin. The fence below keeps the database right either way.
//   - Lost life. The instance can no longer count on the fleet seeing it alive
//     (Reason "not_alive"), and the callback's context is cancelled before anyone may take the
//     lease: three quarters of the lock grace (0.75 s) after the last proof that its lock
//     was held was sent, since the lock may vanish unseen just after that proof (a server
//     restart, a failover or a terminated backend while the leader is cut off, or its
//     notice held back), and the fleet calls it dead a lock grace after it vanished;
//     or when its last beat is half a fast heartbeat interval (15 s) short of the stale
//     threshold, past which some observer may judge it by its heartbeat alone. Noticing
//     the loss moves neither, and a beat or a new claim after the deadline does not
//     revive the leadership. See "What a leader guarantees". Once the callback has
//     returned, the lease is released
//     as on a return; a release that fails (the server restarting, failing over, out of
//     reach) is sent again every 0.5 s until it succeeds or the row has expired, so that
//     the lease is free as soon as the server answers: otherwise nobody could take it
//     until it expired, since its holder instance is alive again then. So is an
//     acquisition whose answer was lost (the connection cut while the server went on
//     with it): the row it may have written is deleted by its holder token, at once or,
//     when the server is out of reach, before this process's next acquisition of any
//     lease.
//   - Crash. The callback dies with the process. Another process may start once the
//     holder is dead by the verdict: the lock grace after PostgreSQL freed the lock (at
//     once for a killed process, after the keepalive for a vanished host; the watcher
//     stamps it within a tick), which the watcher notifies: about 1.3 s for a killed
//     process, whatever the followers' RetryPeriod (their next try without the
//     notification). In ModeHeartbeatTableOnly the lease's expiry (TTL) comes first.
//
// In every case the callback must return soon after its context is cancelled: the
// campaign leads again only after it has, and Run waits for it (see Shutting down).
//
// # What a leader guarantees
//
// At no instant does a leadership's trust say alive, nor does its fence accept a write,
// while the schema's verdict rule (instance_state_rule, with the stamps of vanished
// locks) may call the instance dead; the job's context is cancelled when the trust ends,
// at its deadline (or, in a process that was not running then, as soon as it runs).
// Each lease an Agent holds follows a trust (internal/lifegate) whose deadline is the
// earliest of:
//
//   - three quarters of the lock grace (750 ms) after the last proof that the alive lock
//     was held was sent. The lock may vanish at any moment after that proof ran:
//     PostgreSQL frees every advisory lock when it restarts, fails over or ends the
//     lock's backend, and a leader learns of that only when the session's end reaches
//     it, which a half-open network delays to its keepalive (about 20 s at the defaults)
//     and a retransmitted FIN or a paused process by any amount. The fleet calls it dead
//     a lock grace after the vanishing, at the earliest; the last quarter (250 ms) is the
//     job's time to stop (fence its writes, below, for what it cannot stop in time);
//   - its last acknowledged beat's sending plus the stale threshold, less half a fast
//     interval (75 s at the defaults): an observer that trusts the row's word on the
//     lock, or finds the lock gone, judges it by its heartbeat alone.
//
// Noticing the loss moves neither, and once the clock has reached the deadline in force
// the leadership is over for good: a proof, a beat or a new claim that comes later (the
// process was unscheduled, a timer fired late) does not revive it; the campaign tries
// again with a new acquisition. Every question put to a leadership reads the evidence and
// the clock as of then, so no late evaluation answers from an old view. A fence's
// deadline is the trust's carried over to the server's clock (and, for a lock never yet
// held, at most three quarters of the grace ahead, since it stays on the server whatever
// the process learns later).
//
// internal/lifegate's TestGateNeverOutlivesTheVerdict checks this over 10,000 generated
// schedules in every run of the tests, against the migrations' own rule on a real server:
// any order and delays of the lock's loss at the server, the absence stamp, the session's
// notice, proofs, beats (landing late, out of order, or refused), claims after a
// reconnect, server restarts and missing or late evaluations, with the host's and the
// server's clocks offset. It assumes the clocks run at the same rate (the lease's margin
// covers the difference) and that a backend pid is not reused by the instance's next
// session within a watcher tick.
//
// While an Agent holds at least one lease (a campaign's, the reaper's, a watcher's), its
// lock's session verifies the lock every quarter of the lock grace (250 ms) instead of
// every VerifyInterval, so a healthy leader's deadline stays half to three quarters of
// the grace ahead. A new lease is trusted, and its job started, only once a
// verification sent after the acquisition was answered, on the session that held the
// lock before it was sent, finds the lock held; otherwise, one lock grace after the
// acquisition at most, the lease is given back. The cost is per leader, not per agent:
// an Agent that holds no lease verifies every VerifyInterval (30 s). The price of the
// guarantee is availability: a leader whose lock session stalls for more than about
// 750 ms (a slow network, a stalled server, a paused process) steps down, although the
// fleet might still have seen it alive, and so does one whose session ends and is not
// claimed again within that time. ModeHeartbeatTableOnly holds no lock, so only the
// heartbeat's deadline applies. OnNewLeader tells every process, the leader included,
// who leads, and when it sees nobody lead.
//
// # Fencing
//
// A write that must never come from two leaders is fenced under the leader's *Lease (the
// one OnStartedLeading gets): Lease.Exec runs one statement, Lease.BeginTx and BeginFunc
// a transaction.
// The fence, sent first in the writing transaction, runs the schema's fence, which acts
// only for the caller that presents the lease's holder token and locks the lease row FOR
// KEY SHARE: any takeover (and release) waits until the transaction ends, so every write
// accepted under one epoch commits before the next holder's first, while the lease's
// renewals go on.
// A refused write is a *FencedError (errors.Is ErrFenced), never 0 rows: its Held says
// whether the lease is still held (the write only came too late) or lost (errors.Is
// ErrLeaseLost too). During a wind-down (the campaign over, the lease still renewed)
// fenced writes still count. lease_is_held looks at the row's epoch and expiry only, not
// at the holder's life: while the holder is dead by the verdict but nobody has taken the
// lease yet, a write fenced under its epoch is still accepted; it lands before any other
// holder's. A fenced transaction may idle between its statements at most the lease's
// TTL, after which the server ends its session (the fence sets
// idle_in_transaction_session_timeout for the transaction), and its COMMIT is a
// *FencedError: a holder that hangs with one open would otherwise hold back every
// takeover until it resumes. Exec's, BeginTx's and BeginFunc's transactions also last at
// most the TTL from their start: past it, the library cancels the running statement and
// ends that lease alone (Reason "expired", with one log line naming the transaction's age and
// the bound), so that no takeover waits on a statement that never ends; a shorter one
// costs no lease, since renewals do not wait for the fence. A write whose context
// was cancelled may still have committed, as any COMMIT whose answer was lost: it landed
// before any other holder's. Lease.Fence fences a pgx.Tx of the caller's own.
//
// A fence also carries FenceDeadline: when, on the server's clock, this process stops
// trusting the lease (the end of its trust window; under an Agent, also the moment its
// leader steps down for want of a fresh proof of its alive lock, three quarters of the
// lock grace after the last). It is carried over from this host's clock with the
// server's own times and the round trips of the statements that returned them, so the
// clocks need not agree. A fence, or a COMMIT, that reaches the server later (held back
// by a partition that heals, TCP retransmitting it) is refused, although nobody has
// taken the lease: the fence queues a check that runs at COMMIT (a deferred constraint
// trigger) and rolls the transaction back. Nothing inside the transaction moves that
// check: SET CONSTRAINTS that would run it early refuses the transaction (SQLSTATE
// LVF04), so does PREPARE TRANSACTION (LVF05), and the fresh deadline a COMMIT carries is
// signed with a key only the holder's token gives. Exec, BeginTx and BeginFunc take their
// connection before reading the deadline. Exec is one round trip: the fence and the
// statement in one pipeline, one implicit transaction whose COMMIT leaves with the fence,
// so its statement's own time counts against the deadline; one that runs past it is
// rolled back at its COMMIT and, while the lease is held, run once more as BeginTx runs
// it. BeginTx's COMMIT carries the deadline as of when it is sent (when it moved since
// the fence), so a healthy leader's transaction may wait for a row lock as long as it
// needs; only the fence's and the COMMIT's own way to the server count against the
// deadline, which is half to three quarters of the lock grace ahead (Lease.FenceDeadline
// says why). Refusals are counted per lease (LeaseStats.FencedRefused), and the first of
// each lease is logged at warning level.
//
// # Sharded ownership
//
// Agent.Shards spreads a set of shards over the instances that take part, each shard
// owned by one live instance at a time. Membership says who may own a shard, a lease who
// does: a member holds the set's member lease, <set>/member/<id>, and the owner of a
// shard its lease, <set>/<shard>, both in <schema>.leases. Each member reads the set's
// live members when they change (notified) and every few seconds, and owns the shards
// that rendezvous hashing gives it among them, so a join or a departure moves about one
// shard in members. A shard's callback gets the shard's *Lease: fence its writes
// with shard.Exec or shard.BeginFunc. A shard's lease is released only once its callback
// has returned, so a shard that moves between live members (a join, a graceful stop) has
// its new owner start after the old one's callback returned, tens of milliseconds later
// (the release, its notification and one take); a crashed owner's shards move once it is
// dead by the verdict (about 1.2 s after it died), and a hung one's once their leases
// expire (at most TTL after its last renewal), since its member lease expires with them
// whatever the verdict says of the instance. A member joins as soon as its agent can
// prove life, so a new process owns its share a few tenths of a second after its start.
// Every lease of a member is renewed in one statement every TTL/4, however many shards it
// owns; its shards are taken 1,000 and released 5,000 a statement.
//
// # One session per node
//
// With AgentConfig.NodeAgentSocket the alive lock is held not on a direct session of the
// process's own but on the node agent's (the pg_liveness_exporter binary run with
// --node-agent.socket): one liveness session, and one listener, per node instead of per
// process. The process's connection to the node agent is the lock: when it closes,
// however the process ended, the node agent lets the lock go and the fleet sees it vanish
// as it would have seen a session of the process's own end. A leader's proofs are the
// node agent's verifications of its session, each sent after the leader asked, so every
// guarantee of "What a leader guarantees" holds as it does with a session of its own.
// When the node agent dies its processes notice at once, prove life by their heartbeats
// (heartbeat_only), lead nothing (a leader's trust runs out three quarters of the lock
// grace after its last proof, as with a session of its own), and attach again within a
// fraction of a second of its return: they dial its socket every 100 ms while nobody
// answers. A node agent that stops (SIGTERM) closes their connections first and keeps the
// locks until their rows no longer claim them (at most 2 s): the locks go only once the
// processes have proved life by their heartbeats.
//
// Where no unix socket can be shared (Kubernetes under the restricted Pod Security
// Standard, which forbids host paths) the node agent listens on TCP too
// (--node-agent.listen-address, behind a Service with internalTrafficPolicy Local), and
// a process attaches with NodeAgentSocket "tcp://host:port" and NodeAgentToken: the node
// agent takes no attach without its token (compared in constant time, never logged). An
// instance is the process that claimed it: on the socket by its peer credentials (uid,
// pid and start time), and on any transport by the random secret the process drew at its
// start and presents on every attach, of which the node agent keeps only a hash. Another
// process that names the instance is refused while its claimant runs (over TCP: while a
// connection that presented its secret is attached) and, after that, until the fleet
// has called the instance dead. A killed process's TCP connection closes as promptly as
// its socket (its kernel sends FIN or RST); one whose peer vanished without closing is
// dropped within 10 s, on both ends: TCP keepalive after 5 s of silence, five probes a
// second apart, and a user timeout of as much.
//
// # Leases without an alive lock
//
// Leases takes and keeps leases alone, with no alive lock (a table of leases is what
// replaced a session advisory lock held on a pool connection for the whole job, which
// deadlocked a service whose four jobs held its four connections): TryAcquire (an
// ErrLeaseHeld when another holder has the lease) and Run, which runs one round of a job
// and releases its lease only once the job has returned, renewing it until then. Such
// leases name no instance, so another process may take one only once it expires. An
// Agent's campaigns do better, and an Agent in ModeHeartbeatTableOnly needs no direct
// connection either.
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
//     A failed beat is retried after a fraction of the fast interval; one that proves
//     life after the lock was lost has a third of the lock grace per attempt and is
//     retried at once after a timeout, every 250 ms after another failure.
//   - A beat carries its deadline by the server's clock (timed from the last reading of
//     it, less that reading's round trip); one that reaches the row later writes nothing,
//     so a beat given up on never lands after a newer one.
//   - Every statement carries a deadline below the interval it serves, and a
//     /* pg_liveness:<name> */ tag right after its first keyword (where PostgreSQL 14 to
//     18 all keep it in pg_stat_statements' text), so that the exporter can count it.
//   - A lease is released only by the holder that took it (name, holder and epoch), so
//     a late release never deletes a newer holder's lease.
//
// # What it never does
//
//   - Hold a pool connection. The alive lock has its own pgx.Conn, opened from the direct
//     DSN; the heartbeat and leases borrow a pool connection for one statement at a time.
//   - Trust the local clock for liveness. Heartbeat times and lease expiries are the
//     database's now(). The local monotonic clock only schedules statements, and gives
//     a lease up early when its renewals stop; it never extends anything.
//   - Release a lease while its job may still run, or let the fleet see its instance go
//     before its jobs have returned.
//   - Log a password. Each constructor wraps the Logger it is given in a slog.Handler
//     that removes passwords from every line it passes on (the message, strings, errors
//     and any value whose printed form holds one), so no line of this package can leak
//     one, whatever the caller's handler. Errors it returns carry no password either.
//
// # Errors
//
// Every error the package returns starts with "liveness: ", then names the part or the
// operation that failed: "liveness: acquire lease "jobs": ...", "liveness: node agent:
// another node agent listens on /run/pg-liveness/agent.sock", "liveness:
// AgentConfig.DirectDSN must not be empty". An error that wraps one of the package's
// sentinels starts with it: "liveness: lease lost: lease "jobs" (epoch 3) is not held:
// ...". Match errors with errors.Is against the sentinels (ErrLeaseLost, ErrLeaseHeld,
// ErrFenced, ErrNoLeader, ...) and errors.As against the types (*ConfigError,
// *LeaseLostError, *FencedError), not by their text.
//
// # Logging
//
// Every config has a Logger field; nil discards. A part logs with no key naming itself:
// whoever owns it adds that, once. The Agent gives its parts part=alive_lock,
// part=heartbeat, part=leases, part=reaper and part=watcher, and adds nothing naming the agent; a
// process that runs several agents adds what tells them apart (an instance id). A
// condition that repeats (a connection that keeps failing, a duplicate instance id) is
// logged once when it begins or changes, at debug level while it lasts, and once when it
// ends.
//
// # Embedding it in a service
//
// Apply the migrations (migrations.Apply) before, or set AgentConfig.WaitForSchema.
// Build one Agent with NewAgent: give it the service's pgxpool (it may go through
// PgBouncer) and a DirectDSN that reaches PostgreSQL directly, never through PgBouncer
// in transaction mode (or ModeHeartbeatTableOnly and no DirectDSN). Run it in a
// goroutine the service owns, campaign with Agent.Elect in others, and read the fleet
// with a Reader. See ExampleAgent, ExampleAgent_Elect, ExampleReader and the runnable
// examples/billing-worker.
//
// # Shutting down
//
// Cancel one context for Run and every Elect (the SIGTERM context), then wait for Run
// and for each Elect to return. The order that keeps two jobs from running at once is
// the Agent's own: Run first cancels its campaigns' jobs and keeps the instance alive,
// and their leases renewed, until the jobs have returned and the leases are released
// (at most JobWindDown, then 5 s); then it stops the heartbeat, deletes the instance
// row while the lock is still held, and closes the lock's session, so the fleet sees
// the instance gone at once. AgentConfig.ShutdownBudget is the longest that takes (35 s
// with the defaults): give the process at least that between SIGTERM and SIGKILL.
package liveness
