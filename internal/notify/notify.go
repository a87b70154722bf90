// Package notify is the encoding of the schema's notifications, payload "<kind>:<id>",
// as the triggers and the watcher send them: the kinds, and the parse of a payload; and
// the Hub through which a process's listening session wakes the waiters they concern.
// The library's alive lock and the node agent's session both receive them; the library's
// waiters and the node agent's processes act on them.
//
// It only reads and names payloads and wakes the process's own waiters: it never sends a
// notification, never talks to PostgreSQL, and imports nothing of this module.
package notify

import "strings"

// The kinds, on the channel <schema>_events, and from migration 0010 on, membership
// (dead, left, joined) on <schema>_members, which a session listens to only while
// something waits for membership.
const (
	Dead   = "dead"   // dead:<instance id>: dead by the verdict after its lock vanished
	Left   = "left"   // left:<instance id>: its row was deleted (a graceful stop, the reaper)
	Joined = "joined" // joined:<instance id>: its row was inserted
	Free   = "free"   // free:<lease name>: released, or its holder is dead
	Taken  = "taken"  // taken:<lease name>: it has a new epoch (migration 0010 on)
	// Resync is no notification: the listening session (re)started, so anything may have
	// been missed while it was away; whoever waits reads the state again.
	Resync = "resync"
	// DeadHere is no notification either: the process's watcher has just notified deaths
	// (and the dead holders' leases free) while its own session does not listen. Its
	// colon keeps it from ever being parsed from a payload (Parse cuts the kind at the
	// first one), so only the watcher can publish it, at most once a tick, and a follower
	// acts on it at once rather than through its wake-up limiter.
	DeadHere = "dead:here"
)

// Event is one notification of the schema's channels.
type Event struct {
	Kind string
	ID   string // an instance id or a lease name
}

// Parse reads a payload "<kind>:<id>"; ok is false for anything else.
func Parse(payload string) (Event, bool) {
	kind, id, ok := strings.Cut(payload, ":")
	if !ok || kind == "" {
		return Event{}, false
	}
	return Event{Kind: kind, ID: id}, true
}
