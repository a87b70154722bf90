package liveness

import (
	"time"

	"github.com/google/uuid"
)

// AgentSnapshot.AliveLock is declared as the alive lock's own Stats (internal/alivelock),
// by name for the lock's two kinds (held on the agent's own session or through a node
// agent). The two declarations must stay alike: Snapshot assigns one to the other, so the
// build fails if they drift.

// heartbeatStats is AgentSnapshot.Heartbeat's type, by name for the heartbeat worker;
// the same rule holds.
type heartbeatStats struct {
	Interval        time.Duration
	Beats, Failures uint64
	LastBeat        time.Time
	Duplicate       bool
}

// LeaseStats is a point-in-time view of one lease name as used by this process.
type LeaseStats struct {
	Name string
	Held bool // this process holds it now
	// Epoch is the fencing epoch this process holds it under (the highest, if it holds
	// several acquisitions); 0 when not held. Compared with the row's epoch, it shows a
	// process that still believes it leads after someone else took over.
	Epoch int64
	// Lost counts the leases lost, by LeaseLostError.Reason: every reason is a key
	// ("expired", "taken", "error", "not_alive"), zero included.
	Lost map[string]uint64
	// FencedRefused counts the writes fenced under this lease that were refused, by
	// Exec, BeginTx, BeginFunc and Fence: the lease was not held, or the fence or the
	// COMMIT reached the server past its deadline (FenceDeadline). A COMMIT sent by the
	// caller itself (after Fence, on its own transaction) is refused by the server
	// without this process seeing why, and is not counted.
	FencedRefused uint64
}

// AgentSnapshot is everything an exporter reports about the local agent.
type AgentSnapshot struct {
	InstanceID  uuid.UUID
	ServiceName string
	Mode        Mode
	// Timing is the configured timing, defaults filled in: Timing.HeartbeatInterval is the
	// cadence without a verified alive lock, Timing.HeartbeatSlowInterval with one.
	Timing Timing
	// AliveLock is the alive lock's state; zero in ModeHeartbeatTableOnly: no lock.
	AliveLock struct {
		// Duplicate: the last claim found the lock held by another session of this
		// instance (a duplicate instance id). Stranger: it found the key held by a session
		// that did not claim it, a lock that counts for nobody. Held: claimed and verified
		// on this connection's own backend.
		Duplicate, Stranger, Held bool
		// Claims counts successful claims, Losses the times a held lock was lost
		// (connection dropped, backend gone), Reconnects the direct connections opened
		// after the first.
		Claims, Losses, Reconnects uint64
	}
	// Heartbeat is the heartbeat's state.
	Heartbeat struct {
		Interval        time.Duration // the cadence chosen on the last tick
		Beats, Failures uint64        // heartbeat writes that succeeded, that failed
		LastBeat        time.Time     // database time of the last successful write; zero before it
		// Duplicate is true while the heartbeat writes nothing because another session
		// holds this instance's alive lock.
		Duplicate bool
	}
	Leases []LeaseStats    // sorted by Name
	Reaped uint64          // instances removed by this agent's reaper
	Shards []ShardSetStats // the shard sets it takes part in (Agent.Shards), sorted by Set
}
