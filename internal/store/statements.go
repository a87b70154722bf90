package store

import (
	"cmp"
	"slices"
)

// Statement is a statement of sql/ whose only placeholders are the schema it reads or
// writes ({schema}) and what derives from it ({epoch_seq}). Render it once, when the
// component that sends it is built.
type Statement struct{ name string }

// Name is the statement's name in sql/.
func (st Statement) Name() string { return st.name }

// Tag is the tag the statement is sent with, "" for an untagged one.
func (st Statement) Tag() string { return sections.section(st.name, kindStatement).tag }

// In renders the statement for schema ("" is DefaultSchema), which only ever enters the
// text as a quoted identifier.
func (st Statement) In(schema string) Query {
	schema = cmp.Or(schema, DefaultSchema)
	return render(sections.section(st.name, kindStatement), "", values{
		"schema": ident(schema), "epoch_seq": regclassLiteral(schema, "lease_epoch_seq"),
	})
}

// SourceStatement is a statement of sql/ that reads a source's instances: the source's
// fragments (source_liveness.sql, source_whizbang.sql) fill it, and its Query carries the
// source's timing and key prefix as arguments after the caller's own.
type SourceStatement struct{ name string }

// Name is the statement's name in sql/.
func (st SourceStatement) Name() string { return st.name }

// For renders the statement for src (nil is this project's schema with every default).
func (st SourceStatement) For(src *Source) Query {
	src = src.orDefault()
	return render(sections.section(st.name, kindStatement), string(src.cfg.Kind), src.vals)
}

// The statements, by what sends them. Each one's file in sql/ says what it does, its
// parameters and its columns; rows.go has the row types of those that views read.
var (
	// The agent (package liveness): the alive lock's session, the heartbeat, the reaper.
	AliveLockClaim  = Statement{"alive_lock_claim"}
	AliveLockVerify = Statement{"alive_lock_verify"}
	AliveLockHolder = Statement{"alive_lock_holder"}
	// The node agent's: letting one instance's lock go, and which database a session is on.
	AliveLockRelease           = Statement{"alive_lock_release"}
	LockDatabase               = Statement{"lock_database"}
	NodeAgentDeadInstances     = Statement{"node_agent_dead_instances"}
	NodeAgentRowsClaimingLocks = Statement{"node_agent_rows_claiming_locks"}
	Heartbeat                  = Statement{"heartbeat"}
	HeartbeatDelete            = Statement{"heartbeat_delete"}
	Cleanup                    = Statement{"cleanup"}

	// The watcher (package liveness) and the events the alive lock's session listens to.
	WatchAliveLocks     = Statement{"watch_alive_locks"}
	NotifyDeadInstances = Statement{"notify_dead_instances"}
	WatchFresh          = Statement{"watch_fresh"}
	EventsListen        = Statement{"events_listen"}
	MembersListen       = Statement{"members_listen"}
	MembersUnlisten     = Statement{"members_unlisten"}

	// Leases (package liveness): an elector's, a reaper's, Leases'.
	LeaseAcquire = Statement{"lease_acquire"}
	LeaseRenew   = Statement{"lease_renew"}
	LeaseRelease = Statement{"lease_release"}
	LeaseAbandon = Statement{"lease_abandon"}
	LeaseDetach  = Statement{"lease_detach"}
	LeaseLeader  = Statement{"lease_leader"}
	LeaseFence   = Statement{"lease_fence"}
	// A shard set's (Agent.Shards): its leases renewed, taken, released and left to expire
	// many at a time, one statement each, and its members.
	LeaseRenewMany   = Statement{"lease_renew_many"}
	LeaseAcquireMany = Statement{"lease_acquire_many"}
	LeaseAbandonMany = Statement{"lease_abandon_many"}
	LeaseReleaseMany = Statement{"lease_release_many"}
	LeaseDetachMany  = Statement{"lease_detach_many"}
	ShardMembers     = Statement{"shard_members"}
	ShardFree        = Statement{"shard_free"}
	// Lease.BeginTx's fence, which fails rather than answers, and what its COMMIT
	// carries (the deadline as of then), sent in one simple query with it; Lease.Exec's
	// fence, sent in one pipeline with its write.
	LeaseFenceStrict = Statement{"lease_fence_strict"}
	LeaseFenceCommit = Statement{"lease_fence_commit"}
	LeaseFenceExec   = Statement{"lease_fence_exec"}

	// Where a schema stands (package migrations, and an Agent before it runs).
	SchemaState      = Statement{"schema_state"}
	SchemaMigrations = Statement{"schema_migrations"}
	SchemaVersion    = Statement{"schema_version"}

	// Applying migrations (package migrations), untagged.
	MigrateLock        = Statement{"migrate_lock"}
	MigrateSchema      = Statement{"migrate_schema"}
	MigrateBookkeeping = Statement{"migrate_bookkeeping"}
	MigrateApplied     = Statement{"migrate_applied"}
	MigrateSearchPath  = Statement{"migrate_search_path"}
	MigrateRecord      = Statement{"migrate_record"}

	// The statements collector's reads of pg_stat_statements, untagged; {schema} is the
	// extension's.
	StatStatementsSchema = Statement{"stat_statements_schema"}
	StatStatements       = Statement{"stat_statements"}
	StatStatementsTexts  = Statement{"stat_statements_texts"}

	// The reads of a source's instances: liveness.Reader's (ReadInstances, ReadFleet),
	// the instances collector's, and the advisory-locks collector's, which is the status
	// page's too.
	ReadInstances = SourceStatement{"read_instances"}
	ReadFleet     = SourceStatement{"read_fleet"}
	Instances     = SourceStatement{"instances"}
	AdvisoryLocks = SourceStatement{"advisory_locks"}

	// An observer of several databases of one server (discovery within a server): the
	// server's advisory locks read once for all of them, and each database's part judged
	// without reading pg_locks again (see also InstancesOfLocks).
	ServerAdvisoryLocks     = Statement{"server_advisory_locks"}
	AdvisoryLocksOfSnapshot = SourceStatement{"advisory_locks_of_snapshot"}

	// The history of leaderships and deaths (migration 0020): the history collector's and
	// the status page's reads, and the reaper's pruning.
	HistorySince    = Statement{"history_since"}
	HistoryLastID   = Statement{"history_last_id"}
	HistoryRecent   = Statement{"history_recent"}
	LeaseLeaderless = Statement{"lease_leaderless"}
	HistoryPrune    = Statement{"history_prune"}

	// The identity of an exporter's database (package collector), untagged.
	DatabaseIdentity = Statement{"database_identity"}
)

// InstancesOfLocks renders the instances statement for src with the verdict of given
// locks: its arguments are the max series, then the classids and objids (oid[]) and the
// holders' pids (integer[]) of the database's granted exclusive bigint advisory locks as
// server_advisory_locks read them, and pg_locks is not read (but by the stamping of
// vanished locks, when one vanished). On this project's schema it needs migration 0012
// (instance_state_verdicts_of_locks with pids); on an older schema the statement fails
// with undefined_function.
func InstancesOfLocks(src *Source) Query {
	src = src.orDefault()
	vals := make(values, len(src.vals)+1)
	for k, v := range src.vals {
		vals[k] = v
	}
	switch src.cfg.Kind {
	case SourceWhizbang:
		vals["exclusive_locks"] = use("exclusive_locks_given")
	default:
		vals["verdicts"] = use("liveness.verdicts_of_locks")
	}
	return render(sections.section(Instances.name, kindStatement), string(src.cfg.Kind), vals)
}

// VerdictOfLocksMigration is the migration of this project's schema that InstancesOfLocks
// needs.
const VerdictOfLocksMigration = 12

// handles lists every statement above, so that the package checks, when it loads, that
// each one is in sql/ and that sql/ has no statement without one.
var handles = []string{
	AliveLockClaim.name, AliveLockVerify.name, AliveLockHolder.name, AliveLockRelease.name, LockDatabase.name,
	NodeAgentDeadInstances.name, NodeAgentRowsClaimingLocks.name, Heartbeat.name, HeartbeatDelete.name, Cleanup.name,
	WatchAliveLocks.name, NotifyDeadInstances.name, WatchFresh.name, EventsListen.name, MembersListen.name, MembersUnlisten.name,
	LeaseAcquire.name, LeaseRenew.name, LeaseRenewMany.name, LeaseAcquireMany.name, LeaseAbandonMany.name,
	LeaseReleaseMany.name, LeaseDetachMany.name, ShardMembers.name, ShardFree.name, LeaseRelease.name, LeaseAbandon.name, LeaseDetach.name, LeaseLeader.name, LeaseFence.name,
	LeaseFenceStrict.name, LeaseFenceCommit.name, LeaseFenceExec.name,
	SchemaState.name, SchemaMigrations.name, SchemaVersion.name,
	MigrateLock.name, MigrateSchema.name, MigrateBookkeeping.name, MigrateApplied.name, MigrateSearchPath.name, MigrateRecord.name,
	StatStatementsSchema.name, StatStatements.name, StatStatementsTexts.name,
	ReadInstances.name, ReadFleet.name, Instances.name, AdvisoryLocks.name,
	ServerAdvisoryLocks.name, AdvisoryLocksOfSnapshot.name, DatabaseIdentity.name,
	HistorySince.name, HistoryLastID.name, HistoryRecent.name, LeaseLeaderless.name, HistoryPrune.name,
	leasesStatement, whizbangTable,
}

// Statements sent from inside this package.
const (
	leasesStatement = "leases"
	whizbangTable   = "whizbang_table"
)

func init() {
	for _, name := range handles {
		sections.section(name, kindStatement)
	}
	for _, s := range sections.statements {
		if !slices.Contains(handles, s.name) {
			panic("store: statement " + s.name + " of sql/" + s.file + " has no handle in statements.go")
		}
	}
}

// The shape of a leases table, as the leases statement reports it in its summary row:
// which of the optional columns it has, and LeasesUniqueName when a unique index
// guarantees one row per name.
const LeasesUniqueName = "unique name"

// OurLeasesShape is this project's leases table's shape (sorted), the shape to render
// the leases statement for until a scrape tells another.
func OurLeasesShape() []string {
	return []string{"epoch", "holder_host", "holder_instance_id", LeasesUniqueName}
}

// LeasesFor renders the leases collector's statement for a table of the given shape: its
// optional columns where it has them, NULL where it has not, and every row per name
// unless a unique index makes it one. Its own arguments are the table (Table.Quoted) and
// the max series.
func LeasesFor(table Table, shape []string) Query {
	vals := values{"table": ident(table.identifier()...), "lease_rows": use("lease_rows_any")}
	if slices.Contains(shape, LeasesUniqueName) {
		vals["lease_rows"] = use("lease_rows_unique")
	}
	for _, col := range []string{"epoch", "holder_instance_id", "holder_host"} {
		vals[col] = use("lease_no_" + col)
		if slices.Contains(shape, col) {
			vals[col] = use("lease_column_" + col)
		}
	}
	return render(sections.section(leasesStatement, kindStatement), "", vals)
}
