// Package alivelock holds what every session that holds alive locks shares: the
// library's alive lock (a process's own direct session) and the node agent's (one
// session for the processes of a node). That is the session's connection settings, the
// server-side keepalive and user timeout that make PostgreSQL free the locks within
// seconds of the client going silent, and the client socket's, one probe shorter, so
// that the holder stops trusting its locks first (Config); the timeouts of its
// statements, connects and closes; the pace of claims again and of questions about a
// key's holder; and the backoff between sessions.
//
// It holds settings and arithmetic only: it never connects, sends no statement, keeps no
// state, and imports nothing of this module but the shared defaults, the logging helpers
// (to redact a DSN's parse error) and the data layer's configuration error. The library's lock state machine stays in the library, and the
// node agent's server in the binary's packages; neither is imported here.
package alivelock
