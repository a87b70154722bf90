// Package targets reads the exporter's configuration file of named targets, named
// credentials and discover entries (--config.file), for /probe?target=NAME and for
// discovery within a server, and keeps one small connection pool per target and per
// discovered database under a cap shared by all of them. Discovery lists a discover
// entry's databases (pg_database: taking connections, no templates) and keeps those that
// hold the source's instances table, at start and every entry's interval, in a loop its
// caller owns (Discovery.Run, until its context ends). The loop follows the
// configuration in force (Pools.Replace): an added entry is checked at its next tick, a
// changed one again at once, a removed one's databases are forgotten and their pools
// closed (Discovery.Prune, for a caller that stops the loop when no entry is left).
//
// What it guarantees:
//
//   - A password is read from its file and put into the target's DSN, which never leaves
//     this package but into a pool: no error, log line, label or URL holds it. Errors name
//     the field path (targets.orders.credentials) and the file, never a file's contents.
//
//   - Load refuses the whole file for one mistake (an unknown field, a duplicate name, a
//     target naming unknown credentials, a file that cannot be read), so that a reload
//     keeps the last valid configuration.
//
//   - Pools are opened lazily, on a target's first probe, hold at most
//     Options.MaxConnsPerTarget connections, close a connection that sat idle for
//     Options.IdleTimeout, and together never hold more than Options.MaxConns: a target
//     that needs a connection when the cap is reached first closes another target's idle
//     one, and else waits within its own deadline.
//
//   - Discovery never forgets a database because its server does not answer a re-check:
//     only a listing that no longer names it, a check that finds no table, or a reload
//     that removes its entry, does.
//
// What it must never do: connect at start-up (an unreachable database must not stop the
// exporter), or let one target's connections wait on another target's statements.
package targets
