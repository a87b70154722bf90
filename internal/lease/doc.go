// Package lease takes and keeps table leases for the library (package liveness), which
// is the only package that uses it: singleton jobs held by a row in <schema>.leases,
// renewed every ttl/4, their fence (Lease.Fence and the fenced transactions Exec, BeginTx
// and BeginFunc), and the batches a shard set takes, renews and lets go in one statement
// each. The library's types (Leases, Lease, LeaseLostError, FencedError) hand every call
// to it, and document what users see.
//
// What it guarantees:
//
//   - A lease's context ends before anyone else can take the lease: its trust window
//     ends ttl − margin after the last successful acquire or renew statement was sent,
//     which the server answered with now() + ttl, so the window closes at least margin
//     before the row expires by the database clock (at equal clock rates). Under a Gate
//     (an Agent's), it also ends the moment its Leadership is over, however a renewal
//     in flight fares.
//   - A write fenced under a lease commits only while the row holds its epoch, and only
//     if it reached the server before FenceDeadline as of when it was sent; a takeover
//     waits for it. A fenced transaction lasts at most the lease's ttl.
//   - An acquisition whose answer was lost is given back by its holder token, at once or
//     before this process's next acquisition, until its ttl has passed.
//   - Every error a user can see is one the library made through Errors: a lost lease's
//     cause, a release's, a refused acquisition's sentinel, a refused fenced write.
//
// What it must never do:
//
//   - Hold a connection while a lease is held: every statement borrows one from the pool
//     for that statement alone.
//   - Import the library or the alive lock: what it needs of them (may this instance
//     lead? until when?) comes through Gate and Leadership, and the errors through
//     Errors, so that the imports show the layers.
//   - Let its own error types (Loss, Refusal) reach a user, who could not match them.
//   - Log a holder token: whoever presents one may renew or release its acquisition.
package lease
