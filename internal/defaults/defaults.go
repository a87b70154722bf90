// Package defaults holds the settings the liveness library, the data layer and the
// binary take when a field or a flag is left at zero: one place, so that a flag's
// default and the library's cannot drift apart. It imports nothing of this module. The library's users read them in each config field's comment; they
// are not part of its API, so that changing one is not a breaking change.
package defaults

import "time"

// Schema is where the migrations put the liveness objects unless configured
// (migrations.DefaultSchema and store.DefaultSchema are this).
const Schema = "liveness"

// The instance's timing (liveness.Timing), as the agent's flags have them.
const (
	HeartbeatInterval     = 30 * time.Second
	HeartbeatSlowInterval = 60 * time.Second
	StaleThreshold        = 90 * time.Second
	DefinitiveDeadCutoff  = 5 * time.Minute
	// LockGrace: a live agent notices the end of its lock's session at once and beats
	// within milliseconds.
	LockGrace = time.Second
)

// The alive lock's session (AgentConfig.Keepalive*, VerifyInterval). With them the
// server drops a half-open client's session, and so frees its lock, after about 25–30 s
// instead of Linux's two hours: 10 s idle, then 3 probes 5 s apart, and unacknowledged data gives up after
// 30 s (counted from the first notification the server could not deliver, when it sends
// one: up to a minute).
//
// VerifyInterval is the pace of an agent that leads nothing. Its verification only tells
// the agent itself, a little sooner, that a silent network took its session: a session
// that ends is noticed at once on the idle connection, the socket's keepalive gives up
// within about 25 s, and the fleet's verdict never depends on it. A leader verifies
// every quarter of its lock grace whatever this is. At 10 s it was the fleet's busiest
// statement (at 1,000 agents, 100 of 235 statements a second).
const (
	KeepaliveIdle     = 10 * time.Second
	KeepaliveInterval = 5 * time.Second
	KeepaliveCount    = 3
	UserTimeout       = 30 * time.Second
	VerifyInterval    = 30 * time.Second
)

// The agent's own parts (liveness.AgentConfig).
const (
	ReaperInterval = 30 * time.Second
	ReaperLeaseTTL = 2 * time.Minute
	// HistoryRetention: a week, so that Monday's look reaches the weekend's incidents.
	HistoryRetention = 7 * 24 * time.Hour
	// JobWindDown: a job that needs longer to stop sets its own, and its process's grace
	// before SIGKILL with it (AgentConfig.ShutdownBudget).
	JobWindDown     = 10 * time.Second
	ShutdownTimeout = 5 * time.Second
	// DuplicateTimeout is twice the time the server needs, with the default keepalive
	// settings, to end a half-open session.
	DuplicateTimeout = 2 * time.Minute
)

// A campaign (liveness.ElectorConfig).
const (
	ElectorTTL         = 15 * time.Second
	ElectorRetryPeriod = time.Second
	ElectorQuietPeriod = time.Minute
)

// ShardsPollPeriod is how often a shard set reads its members without a notification:
// the fallback for a notification lost while its session did not listen. A set of more
// than 100 members polls every members times the library's spacing instead, so that the
// set's reads stay about ten a second.
const ShardsPollPeriod = 10 * time.Second

// The node agent's limits.
const (
	NodeAgentMaxConnections  = 4096
	NodeAgentMaxMessageBytes = 16 << 10 // an event's id is a lease name, under 8000 bytes
)

// Fixed: no field or flag sets these.

// ReaperLease is the lease name under which one agent at a time reaps.
const ReaperLease = "pg_liveness.reaper"

// WatcherLeases are the lease names of the fleet's two watchers. Every Agent campaigns
// for both (unless AgentConfig.DisableWatcher), and leads at most one of them at a time,
// so that with two agents or more the two watchers run in different processes: each
// records the other's crash within a tick, where a single watcher's own crash would be
// noticed only by its followers' next try.
var WatcherLeases = [2]string{"pg_liveness.watcher.a", "pg_liveness.watcher.b"}

// WatchInterval is how often a watcher reads the digest of the alive locks: a crashed
// instance is stamped at most this long after PostgreSQL freed its lock, and is dead
// for everyone its lock grace after that. Each tick is one statement that reads
// pg_locks and, unless a lock appeared or vanished since the previous tick, nothing
// else, and it writes nothing then.
const WatchInterval = 250 * time.Millisecond

// WatchAlivePoll is how often Agent.WatchAlive reads the set again without a
// notification: the fallback for what is not notified (an instance gone stale by its
// heartbeat, a process without a listening session) and for a lost notification.
const WatchAlivePoll = 5 * time.Second
