// Package lifegate is the leader's gate: from what one process knows of its own alive lock
// and heartbeat, and the time, it says until when that process may count on the fleet
// seeing it alive; a Trust holds one leadership to that, and stays over once it has run
// out. The liveness package feeds it (its goroutines gather the evidence, read the
// clock and act on the answer); nothing here reads a clock, does I/O or keeps a
// goroutine, so a test can drive it through any schedule.
//
// # The verdict it answers to
//
// The fleet judges an instance by the schema's rule (instance_state_rule, with the
// stamps of vanished alive locks, in the migrations): with its lock held by the backend
// the row records, an instance is dead once its heartbeat is the definitive-dead cutoff
// old; without it, once its heartbeat is the stale threshold old, or, while its row says
// the lock is held, a lock grace after the lock's absence was stamped, which happens no
// earlier than the lock vanished. An observer that trusts the row's word that the lock
// is held (a fresh watch) judges such a row by its heartbeat alone.
//
// A leader's deadline (Deadline with leading) is therefore the earliest of:
//
//   - its last acknowledged beat's sending plus the stale threshold, less a margin: any
//     observer may judge it by its heartbeat alone, whatever the lock;
//   - once its lock has ever been held, its last proof's sending (the latest claim or
//     verification that found the lock held) plus three quarters of the lock grace: the
//     lock may have vanished just after that proof ran, unseen by a session cut off from
//     the server, and the fleet may call it dead one grace after it vanished. The last
//     quarter is the job's time to stop. Noticing the loss moves nothing: the loss may
//     have happened long before the notice (a late FIN, a paused process), and a beat
//     after it cannot revive a leadership.
//
// # What it guarantees
//
// At no instant does a started Trust say alive, nor does a fence deadline taken from it
// (Anchor.OnServer) lie past, a moment at which the schema's rule may call the instance
// dead, whatever the order and delays of the lock's loss at the server, the absence
// stamp, the session's notice, proofs, beats (landing late, out of order, or refused),
// claims after a reconnect, server restarts, and evaluations that come late or not at
// all. TestGateNeverOutlivesTheVerdict checks that over generated schedules against the
// rule's own SQL, assuming only that the host's and the server's clocks run at the same
// rate (the lease's margin covers the difference), that the heartbeat never moves the
// row's time back (greatest(), internal/store/sql/heartbeat.sql), and that a stamp is no
// earlier than the read of pg_locks that found the lock missing (migration 0017).
//
// # What it must never do
//
// Read a clock; extend a Trust whose deadline in force has passed, whatever evidence
// comes later; count a deadline from when an evaluation ran rather than from the
// evidence's own sending.
package lifegate
