-- Our own source: the pieces the statements that read instances (read_instances,
-- read_fleet, instances, advisory_locks) take from this project's schema. {stale} and
-- {dead} are SourceConfig.Fallback's, for rows that record no timing of their own.

-- fragment: liveness.states
-- The verdict for read_instances, narrowed to its instance id ($1) when it has one.
{schema}.instance_states({stale}::interval, {dead}::interval, $1::uuid)

-- fragment: liveness.all_states
-- The verdict of every instance, after stamping vanished locks.
{schema}.instance_states({stale}::interval, {dead}::interval)

-- fragment: liveness.verdicts
-- The verdict without stamping: the instances collector stamps after it ({stamp}).
{schema}.instance_state_verdicts({stale}::interval, {dead}::interval)

-- fragment: liveness.stamp
-- Stamps vanished locks from the instances the verdict called lock_lost (see
-- stamp_alive_lock_absences_seen); services is the instances statement's own CTE.
{schema}.stamp_alive_lock_absences_seen(ARRAY(SELECT unnest(v.lost) FROM services v))

-- fragment: liveness.key_shared
-- Our keys are 64 bits: no two instances share one.
false

-- fragment: liveness.instances
{schema}.instances

-- fragment: liveness.leases
{schema}.leases

-- fragment: liveness.mode
i.liveness_mode

-- fragment: liveness.heartbeat_interval
extract(epoch FROM i.heartbeat_interval)::float8

-- fragment: liveness.heartbeat_slow_interval
extract(epoch FROM i.heartbeat_slow_interval)::float8

-- fragment: liveness.stale_threshold
extract(epoch FROM i.stale_threshold)::float8

-- fragment: liveness.definitive_dead_cutoff
extract(epoch FROM i.definitive_dead_cutoff)::float8

-- fragment: liveness.lock_grace
extract(epoch FROM i.lock_grace)::float8

-- fragment: liveness.alive_lock_match
-- A bigint lock (objsubid = 1, checked by the caller) whose key halves are those of some
-- instance's alive-lock key: one lookup per lock in the index on the key-half columns
-- stored with each instance, so the cost follows the locks, not the instances.
EXISTS (
               SELECT 1 FROM {schema}.instances i
                WHERE i.lock_classid = l.classid AND i.lock_objid = l.objid)

-- fragment: liveness.verdicts_of_locks
-- {verdicts} of the locks an observer of the server read for this database
-- (server_advisory_locks): $2, $3 and $4 the classids, objids and holders' pids of its
-- granted exclusive bigint advisory locks. Migration 0012's function: the same rule, a
-- lock counting only when held by the session that claimed it, no pg_locks read.
{schema}.instance_state_verdicts_of_locks({stale}::interval, {dead}::interval, $2::oid[], $3::oid[], $4::integer[])
