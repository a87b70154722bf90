package sqltag

import "strings"

// Prefix starts every tag's name inside its comment.
const Prefix = "pg_liveness:"

// The tags. Writes and the alive lock's session first, then the reads.
const (
	Heartbeat       = "/* pg_liveness:heartbeat */"         // the heartbeat's upsert of the instance row
	HeartbeatDelete = "/* pg_liveness:heartbeat_delete */"  // the instance row's removal on shutdown
	AliveLockClaim  = "/* pg_liveness:alive_lock_claim */"  // claiming the alive lock on the direct session
	AliveLockVerify = "/* pg_liveness:alive_lock_verify */" // verifying the alive lock on the direct session
	LeaseAcquire    = "/* pg_liveness:lease_acquire */"     // taking a lease
	LeaseRenew      = "/* pg_liveness:lease_renew */"       // renewing a held lease
	LeaseRelease    = "/* pg_liveness:lease_release */"     // giving a lease back (or an acquisition whose answer was lost)
	LeaseLeader     = "/* pg_liveness:lease_leader */"      // who holds a lease: the elector's followers, Reader.Leader
	LeaseFence      = "/* pg_liveness:lease_fence */"       // a leader's fence, inside the transaction of the writes it guards
	Cleanup         = "/* pg_liveness:cleanup */"           // the reaper's cleanup_stale_instances

	Instances     = "/* pg_liveness:instances */"      // the instances collector's read
	Leases        = "/* pg_liveness:leases */"         // the leases collector's read
	AdvisoryLocks = "/* pg_liveness:advisory_locks */" // the advisory-locks collector's (and the status page's) read of pg_locks
	ReadInstances = "/* pg_liveness:read_instances */" // Reader.Instance and Reader.Instances
	ReadFleet     = "/* pg_liveness:read_fleet */"     // Reader.Fleet (the status page)
	WhizbangTable = "/* pg_liveness:whizbang_table */" // whether a Whizbang source's table can be read
	SchemaState   = "/* pg_liveness:schema_state */"   // which migrations a schema has (at start-up)
)

// All lists every tag once, in the order the statements collector tries them.
var All = []string{
	Heartbeat, HeartbeatDelete, AliveLockClaim, AliveLockVerify,
	LeaseAcquire, LeaseRenew, LeaseRelease, LeaseLeader, LeaseFence, Cleanup,
	Instances, Leases, AdvisoryLocks, ReadInstances, ReadFleet, WhizbangTable, SchemaState,
}

// Name is a tag's name, the statement label value: "heartbeat" for Heartbeat.
func Name(tag string) string {
	return strings.TrimSuffix(strings.TrimPrefix(tag, "/* "+Prefix), " */")
}
