// Package proto is the node agent's wire protocol, the one both ends speak: the library's
// client (a process's alive lock held through the node agent) and the node agent's
// server (the binary's --node-agent mode). It holds the messages and their ops, the
// line decoder with its size bound, and the TCP settings (keepalive, user timeout) of
// connections to and from a node agent, so that the two ends cannot drift apart.
//
// It does no I/O beyond the connection or reader it is given, never talks to
// PostgreSQL, and imports nothing of this module: the public library and the server
// both depend on it.
package proto
