// Package alivelock holds an instance's alive lock: the session-level advisory lock on its
// id that PostgreSQL releases when the session ends, the fleet's fast signal that the
// instance is gone. A process holds it on a direct session of its own (Direct), or
// through the node agent of its node, whose one session holds the locks of the processes
// attached to it (Node); either is a Lock, which is all the library's Agent, heartbeat
// and life monitor see.
//
// It also holds what every session that holds alive locks shares, the node agent's
// included: the session's connection settings, the server-side keepalive and user
// timeout that make PostgreSQL free the locks within seconds of the client going silent,
// and the client socket's, one probe shorter, so that the holder stops trusting its locks
// first (Config); the timeouts of its statements, connects and closes; the pace of claims
// again and of questions about a key's holder; and the backoff between sessions.
//
// A lock counts as held only while a claim or a verification answered "held" on the
// holding session's own backend (the one its startup handshake named: never through a
// pooler), and only within the trust bound: a statement unanswered past the client
// socket's user timeout, counted from the last answer, clears Held before the server
// could free the lock for another session. A key held by a session that did not claim it
// for this instance counts for nobody, and does not make this instance a duplicate. Each
// Proof says when it was sent and by which claim, so that a leader trusts only a proof
// sent after its lease was answered, by the claim that held the lock then. Failures are
// logged once per condition, never returned: the heartbeat carries liveness meanwhile.
//
// It never imports the library nor the node agent's server: of this module, only the
// shared defaults, the logging helpers, the data layer's statements and configuration
// error, the notifications (internal/notify), the verdict's timing (internal/lifegate)
// and the node agent's protocol (internal/nodeagent/proto), which both ends speak. So the
// library carries no server, and the server, which builds its session from Config, no
// library.
package alivelock
