package store

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// The rows of the statements the views read (the collectors, the status page,
// liveness.Reader), by column name: scan them with pgx.RowToStructByName. The store's
// tests check every one against its statement's columns on a real server of each
// supported major. NULLs that a statement can return stay pgtype values or pointers.

// InstancesRow is one row of the instances statement: the first row the server's state
// (InRecovery and KeyShared set), then one per service (ServiceName and the counts),
// then one per exported instance (ServiceName and InstanceID). Age is the oldest
// heartbeat's age, or the instance's, in seconds.
type InstancesRow struct {
	ServiceName   pgtype.Text   `db:"service_name"`
	InstanceID    pgtype.Text   `db:"instance_id"`
	Alive         pgtype.Int8   `db:"alive"`
	LockOnly      pgtype.Int8   `db:"lock_only"`
	LockLost      pgtype.Int8   `db:"lock_lost"`
	HeartbeatOnly pgtype.Int8   `db:"heartbeat_only"`
	Stale         pgtype.Int8   `db:"stale"`
	Zombie        pgtype.Int8   `db:"zombie"`
	Age           pgtype.Float8 `db:"age"`
	InRecovery    pgtype.Bool   `db:"in_recovery"`
	KeyShared     pgtype.Int8   `db:"key_shared"` // instances whose Whizbang key another shares
}

// LeasesRow is one row of the leases statement: an exported lease, or the summary, last
// (Folded set). The NULLs of a foreign table stay invalid.
type LeasesRow struct {
	Name             pgtype.Text   `db:"name"`
	Holder           pgtype.Text   `db:"holder"`
	Epoch            pgtype.Int8   `db:"epoch"`
	HolderInstanceID pgtype.Text   `db:"holder_instance_id"`
	HolderHost       pgtype.Text   `db:"holder_host"`
	ExpiresIn        pgtype.Float8 `db:"expires_in"` // the summary's: the soonest folded expiry
	Held             pgtype.Bool   `db:"held"`
	HeldFor          pgtype.Float8 `db:"held_for"` // the summary's: the longest held folded lease
	Folded           pgtype.Int8   `db:"folded"`
	FoldedHeld       pgtype.Int8   `db:"folded_held"`
	NullNames        pgtype.Int8   `db:"null_names"`
	NullValues       pgtype.Int8   `db:"null_values"`
	Duplicates       pgtype.Int8   `db:"duplicates"`
	Shape            []string      `db:"shape"` // the table's optional columns, and LeasesUniqueName
}

// HistoryRow is one row of the history (migration 0020) as history_since and
// history_recent read it, with Now, the server's clock when it read.
// LeaseName, Epoch, Host, Service, How and Reason are empty or zero where the row has none.
type HistoryRow struct {
	ID         int64              `db:"id"`
	At         time.Time          `db:"at"`
	Kind       string             `db:"kind"`
	LeaseName  string             `db:"lease_name"`
	Epoch      int64              `db:"epoch"`
	InstanceID *uuid.UUID         `db:"instance_id"`
	Host       string             `db:"host"`
	Service    string             `db:"service"`
	How        string             `db:"how"`
	Reason     string             `db:"reason"`
	Since      pgtype.Timestamptz `db:"since"`
	DeadAt     pgtype.Timestamptz `db:"dead_at"`
	Now        time.Time          `db:"now"`
}

// LeaderlessRow is one row of lease_leaderless: a lease whose row no live holder holds,
// for how many seconds, and After: "expired" or "holder_dead".
type LeaderlessRow struct {
	Name          string  `db:"name"`
	LeaderlessFor float64 `db:"leaderless_for"`
	After         string  `db:"after"`
}

// AdvisoryLocksRow is one row of the advisory-locks statement.
type AdvisoryLocksRow struct {
	// Kind is "backends" or "locks".
	Kind string `db:"kind"`
	// Name is, for "backends", the application_name; for "locks", the kind of lock:
	// "alive_lock" (an instance's alive-lock key) or "other".
	Name string `db:"name"`
	// State is, for "backends", the backend state; for "locks", whether the locks are
	// granted: "true" or "false" (waiting).
	State string `db:"state"`
	// Count is how many backends, or locks.
	Count int64 `db:"count"`
	// Holders and Waiters are the backends that hold a granted advisory lock, and that
	// wait for one; IdleHolderMaxSeconds is the longest an idle holder has been idle.
	// All 0 for "locks".
	Holders              int64   `db:"holders"`
	Waiters              int64   `db:"waiters"`
	IdleHolderMaxSeconds float64 `db:"idle_holder_max_seconds"`
}

// InstanceRow is an instance by the verdict, with its identity, the heartbeat's age by
// the database clock, and the timing its row records in seconds (NULL where it records
// none): a row of read_instances, and read_fleet's "instance" object, whose keys are the
// same names.
type InstanceRow struct {
	InstanceID            uuid.UUID       `db:"instance_id" json:"instance_id"`
	ServiceName           string          `db:"service_name" json:"service_name"`
	HostName              string          `db:"host_name" json:"host_name"`
	ProcessID             int             `db:"process_id" json:"process_id"`
	State                 string          `db:"state" json:"state"`
	Alive                 bool            `db:"alive" json:"alive"` // the state is alive by the verdict
	LockHeld              bool            `db:"lock_held" json:"lock_held"`
	LastHeartbeatAt       time.Time       `db:"last_heartbeat_at" json:"last_heartbeat_at"`
	HeartbeatAge          float64         `db:"heartbeat_age" json:"heartbeat_age"`
	StartedAt             time.Time       `db:"started_at" json:"started_at"`
	LivenessMode          string          `db:"liveness_mode" json:"liveness_mode"`
	Metadata              json.RawMessage `db:"metadata" json:"metadata"` // a JSON object
	HeartbeatInterval     *float64        `db:"heartbeat_interval" json:"heartbeat_interval"`
	HeartbeatSlowInterval *float64        `db:"heartbeat_slow_interval" json:"heartbeat_slow_interval"`
	StaleThreshold        *float64        `db:"stale_threshold" json:"stale_threshold"`
	DefinitiveDeadCutoff  *float64        `db:"definitive_dead_cutoff" json:"definitive_dead_cutoff"`
	LockGrace             *float64        `db:"lock_grace" json:"lock_grace"`
}

// FleetRow is one row of read_fleet: Kind "meta" (FleetMeta), "count" (FleetCount),
// "instance" (InstanceRow) or "lease" (FleetLease), its place in its page (UNION ALL
// keeps no order), and the object.
type FleetRow struct {
	Kind   string `db:"kind"`
	Ord    int64  `db:"ord"`
	Object []byte `db:"object"`
}

// FleetMeta is read_fleet's "meta" object: the clock, the database, whether it is a
// standby, and how many instances and leases match the query.
type FleetMeta struct {
	Now        time.Time `json:"now"`
	Database   string    `json:"database"`
	InRecovery bool      `json:"in_recovery"`
	Instances  int       `json:"instances"`
	Leases     int       `json:"leases"`
}

// FleetCount is a "count" object: one service's instances in one state (alive or not by
// the verdict), and the oldest heartbeat's age in seconds.
type FleetCount struct {
	Service   string  `json:"service"`
	State     string  `json:"state"`
	Alive     bool    `json:"alive"`
	Count     int     `json:"count"`
	OldestAge float64 `json:"oldest_age"`
}

// FleetLease is a "lease" object: a lease with its holder judged by the same evaluation.
type FleetLease struct {
	Name             string     `json:"name"`
	HolderInstanceID *uuid.UUID `json:"holder_instance_id"`
	HolderHost       *string    `json:"holder_host"`
	Epoch            int64      `json:"epoch"`
	TakenAt          time.Time  `json:"taken_at"`
	ExpiresAt        time.Time  `json:"expires_at"`
	HolderService    *string    `json:"holder_service"`
	HolderState      string     `json:"holder_state"`
	ExpiresIn        float64    `json:"expires_in"`
	HeldFor          float64    `json:"held_for"`
	Held             bool       `json:"held"`
}

// LeaderRow is the row of lease_leader: who holds a lease, whether it has not expired
// (Held) and whether its holder is alive by the verdict (true when it names none).
type LeaderRow struct {
	HolderInstanceID *uuid.UUID `db:"holder_instance_id"`
	HolderHost       string     `db:"holder_host"`
	Epoch            int64      `db:"epoch"`
	TakenAt          time.Time  `db:"taken_at"`
	ExpiresAt        time.Time  `db:"expires_at"`
	Held             bool       `db:"held"`
	HolderAlive      bool       `db:"holder_alive"`
}

// StatStatementsRow is one row of stat_statements: an entry's counters, or (Entries set)
// the summary of all entries: how many, and two sums of hashes of their queryids.
type StatStatementsRow struct {
	UserID   *uint32  `db:"userid"`
	QueryID  *int64   `db:"queryid"`
	TopLevel *bool    `db:"toplevel"`
	Calls    *int64   `db:"calls"`
	Seconds  *float64 `db:"seconds"`
	Rows     *int64   `db:"rows"`
	Entries  *int64   `db:"entries"`
	Hash1    *int64   `db:"hash1"`
	Hash2    *int64   `db:"hash2"`
}

// StatStatementsTextRow is one row of stat_statements_texts.
type StatStatementsTextRow struct {
	QueryID int64  `db:"queryid"`
	Query   string `db:"query"`
}

// ServerAdvisoryLocksRow is one row of server_advisory_locks: a database's part of the
// server's advisory locks and client backends.
type ServerAdvisoryLocksRow struct {
	// Datname is the database the row is of.
	Datname string `db:"datname"`
	// Kind "backends" or "locks" (the locks on two int4 keys, never alive locks): the
	// advisory-locks statement's row for the database; or "keys": the locks on bigint
	// keys, below.
	AdvisoryLocksRow
	// Of a "keys" row: the locks on bigint keys, one element each: the key's halves,
	// whether the lock is granted, whether in ExclusiveLock mode, and the backend's pid.
	Classids  []uint32 `db:"classids"`
	Objids    []uint32 `db:"objids"`
	Granted   []bool   `db:"granted"`
	Exclusive []bool   `db:"exclusive"`
	Pids      []int32  `db:"pids"`
}

// rowTypes are the row types above by statement.
var rowTypes = map[string]any{
	ServerAdvisoryLocks.name:     ServerAdvisoryLocksRow{},
	AdvisoryLocksOfSnapshot.name: AdvisoryLocksRow{},
	Instances.name:               InstancesRow{},
	leasesStatement:              LeasesRow{},
	AdvisoryLocks.name:           AdvisoryLocksRow{},
	ReadInstances.name:           InstanceRow{},
	ReadFleet.name:               FleetRow{},
	LeaseLeader.name:             LeaderRow{},
	StatStatements.name:          StatStatementsRow{},
	StatStatementsTexts.name:     StatStatementsTextRow{},
}
