package liveness

import (
	"time"

	"github.com/google/uuid"
)

// AliveLockStats is a point-in-time view of an AliveLock, for exporters.
type AliveLockStats struct {
	Duplicate  bool   // the last claim found the lock held by another session of this instance (a duplicate instance id)
	Stranger   bool   // the last claim found the key held by a session that did not claim it: that lock counts for nobody
	Held       bool   // claimed and verified on this connection's own backend
	Claims     uint64 // successful claims
	Losses     uint64 // times a held lock was lost (connection dropped, backend gone)
	Reconnects uint64 // direct connections opened after the first
}

// HeartbeatStats is a point-in-time view of a HeartbeatWorker.
type HeartbeatStats struct {
	Interval time.Duration // the cadence chosen on the last tick
	Beats    uint64        // successful heartbeat writes
	Failures uint64        // failed heartbeat writes
	LastBeat time.Time     // database time of the last successful write; zero before it
	// Duplicate is true while the worker writes nothing because another session holds
	// this instance's alive lock.
	Duplicate bool
}

// LostReason says why a lease was lost.
type LostReason string

const (
	LostExpired LostReason = "expired" // the local trust window ran out without a renewal
	LostTaken   LostReason = "taken"   // a renewal found another holder or epoch, or no row
	LostError   LostReason = "error"   // a renewal failed and the lease could not be confirmed
	// LostNotAlive: the holder's instance could no longer prove that it is alive (its
	// alive lock vanished without a heartbeat in time, or its heartbeat aged), so it
	// stepped down before the fleet could call it dead and take the lease over.
	LostNotAlive LostReason = "not_alive"
)

// LeaseStats is a point-in-time view of one lease name as used by this process.
type LeaseStats struct {
	Name string
	Held bool // this process holds it now
	// Epoch is the fencing epoch this process holds it under (the highest, if it holds
	// several acquisitions); 0 when not held. Compared with the row's epoch, it shows a
	// process that still believes it leads after someone else took over.
	Epoch int64
	Lost  map[LostReason]uint64 // leases lost, by reason
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
	Timing    Timing
	AliveLock AliveLockStats // zero in ModeHeartbeatTableOnly: no lock
	Heartbeat HeartbeatStats
	Leases    []LeaseStats    // sorted by Name
	Reaped    uint64          // instances removed by this agent's reaper
	Shards    []ShardSetStats // the shard sets it takes part in (Agent.Shards), sorted by Set
}
