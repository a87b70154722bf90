// Package nodeagent is the node agent's server, the binary's --node-agent mode: one
// direct session that holds the alive locks of every process of a node attached to it
// over a unix socket or TCP, and listens to the schema's channels once for them (Server,
// New, Config, Snapshot). The processes are the library's agents (AgentConfig's
// NodeAgentSocket); the protocol both ends speak is package proto, and what the server's
// session shares with the library's own alive lock (connection settings, timeouts,
// backoff) is package alivelock.
//
// It is the binary's: the public library never imports it, and it never imports the
// library (only the shared internal packages below both), so that the server can change
// without changing the library's API. It never gives a lock to a process it has not
// authenticated (over TCP, its token) nor an instance to another process than its
// claimant, and it never logs a token or a process's secret.
package nodeagent
