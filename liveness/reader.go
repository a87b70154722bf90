package liveness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// InstanceState is an instance's liveness state, as the migrations' instance_states
// defines it. That SQL function is the only definition: the reaper, the exporter,
// is_instance_alive and this reader all read it, so they always agree (a Whizbang
// source is judged by the same rule, from the same migration).
type InstanceState string

const (
	StateAlive         InstanceState = "alive"          // lock held, heartbeat fresh
	StateLockOnly      InstanceState = "lock_only"      // lock held, heartbeat stale (alive)
	StateLockLost      InstanceState = "lock_lost"      // lock vanished, within the grace to prove life (alive)
	StateHeartbeatOnly InstanceState = "heartbeat_only" // no lock, heartbeat fresh (alive)
	StateStale         InstanceState = "stale"          // dead: heartbeat stale, or lock vanished without proof of life
	StateZombie        InstanceState = "zombie"         // dead: lock held, heartbeat past the definitive-dead cutoff
)

// Alive reports whether the state counts as alive.
func (s InstanceState) Alive() bool {
	switch s {
	case StateAlive, StateLockOnly, StateLockLost, StateHeartbeatOnly:
		return true
	}
	return false
}

// ErrInstanceNotFound is returned by Reader.Instance for an id without a row: never
// registered, removed on shutdown, or reaped as dead.
var ErrInstanceNotFound = errors.New("liveness: instance not found")

// Querier runs a query: *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and pgx.Tx are ones.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// ReaderConfig configures a Reader. Its zero value (with DB set) reads this package's
// schema, "liveness", and judges rows that record no timing by the default stale
// threshold and definitive-dead cutoff.
type ReaderConfig struct {
	DB Querier

	// Schema is the schema the migrations were applied to ("" is "liveness").
	Schema string

	// Fallback is the timing for rows that record none (rows written by other
	// software); an Agent's rows are judged by their own. Only its StaleThreshold and
	// DefinitiveDeadCutoff are used; zero takes 90 s and
	// 5 min.
	Fallback Timing

	// Whizbang, when set, reads a Whizbang database as it is instead of the schema: its
	// instances judged by the same rule, read only (Leader then returns ErrNoLeases).
	// Schema and Fallback are then unused, though still checked.
	Whizbang *WhizbangSource
}

// WhizbangSource is a Whizbang database, read as it is: its <Prefix>service_instances
// table and the session advisory lock each Whizbang instance takes,
// hashtext(LockKeyPrefix || instance_id). Its instances are judged by the same rule as
// this package's own, and nothing is written: reading it needs only SELECT on the table
// and pg_read_all_stats. Whizbang records no timing in its rows, so it is given here.
//
// Zero fields take Whizbang's documented defaults: schema public, prefix wh_, lock key
// prefix "wh_instance_alive:", and a heartbeat every 30 s (every 60 s while the lock is
// held), stale after 90 s (one fast beat after the slow cadence, so that a lock holder
// beating every minute is never stale), dead with the lock held after 5 min.
// Whizbang's rows do not say whether the instance holds its lock, so there is no
// lock_lost state (and Timing.LockGrace must stay zero); two instances whose 32-bit
// keys collide are judged by their heartbeats while the key is held.
type WhizbangSource struct {
	Schema string // the table's schema
	// Prefix of the table's name; "" means Whizbang's default, wh_, unless NoPrefix.
	Prefix string
	// NoPrefix reads service_instances, for an install whose tables have no prefix.
	// Prefix must then be empty.
	NoPrefix bool
	// LockKeyPrefix: the lock key is hashtext(LockKeyPrefix || instance_id::text).
	LockKeyPrefix string
	// Timing is the cadence Whizbang's services run with: its HeartbeatInterval (while
	// the lock is not held), HeartbeatSlowInterval (while it is), and the StaleThreshold
	// and DefinitiveDeadCutoff to judge them by.
	Timing Timing
}

// source checks the configuration as the data layer's source, whose fields it carries
// under the same names, so that its errors name ReaderConfig's fields.
func (c ReaderConfig) source() (*store.Source, error) {
	sc := store.SourceConfig{Schema: c.Schema, Fallback: store.Timing(c.Fallback)}
	if w := c.Whizbang; w != nil {
		sc.Kind = store.SourceWhizbang
		sc.Whizbang = store.Whizbang{Schema: w.Schema, Prefix: w.Prefix, NoPrefix: w.NoPrefix,
			LockKeyPrefix: w.LockKeyPrefix, Timing: store.Timing(w.Timing)}
	}
	src, err := store.NewSourceNamed(sc, "ReaderConfig")
	var ce *store.ConfigError
	if errors.As(err, &ce) {
		return nil, &ConfigError{Field: ce.Field, Reason: ce.Reason}
	}
	return src, err
}

// ErrNoLeases is returned by Reader.Leader for a source without leases (Whizbang's).
var ErrNoLeases = errors.New("liveness: this source has no leases")

// Reader answers "is instance X alive?" and "which instances of service Y are alive?"
// from the source's verdict. Each call is one statement; it holds no connection in
// between.
type Reader struct {
	db        Querier
	instances store.Query // read_instances
	fleet     store.Query // read_fleet
	leaderSQL string      // lease_leader; "" for a source without leases
}

// InstanceStatus is one instance as the database judges it now.
type InstanceStatus struct {
	InstanceID    uuid.UUID
	ServiceName   string
	HostName      string
	ProcessID     int
	State         InstanceState
	LockHeld      bool          // a session holds its alive lock (always false on a standby)
	LastHeartbeat time.Time     // by the database clock
	HeartbeatAge  time.Duration // by the database clock, when it was read
	StartedAt     time.Time
	Mode          Mode            // the liveness mode the instance runs in
	Metadata      json.RawMessage // the row's metadata, a JSON object
	Timing        Timing          // as recorded in the row
}

// NewReader checks cfg. Errors name the ReaderConfig field.
func NewReader(cfg ReaderConfig) (*Reader, error) {
	if cfg.DB == nil {
		return nil, &ConfigError{Field: "ReaderConfig.DB", Reason: "must not be nil"}
	}
	src, err := cfg.source()
	if err != nil {
		return nil, err
	}
	r := &Reader{db: cfg.DB, instances: store.ReadInstances.For(src), fleet: store.ReadFleet.For(src)}
	if src.HasLeases() {
		r.leaderSQL = store.LeaseLeader.In(src.Schema()).SQL
	}
	return r, nil
}

// Instance returns one instance's status, or ErrInstanceNotFound.
func (r *Reader) Instance(ctx context.Context, id uuid.UUID) (InstanceStatus, error) {
	out, err := r.read(ctx, &id, nil)
	if err != nil {
		return InstanceStatus{}, err
	}
	if len(out) == 0 {
		return InstanceStatus{}, fmt.Errorf("%w: %s", ErrInstanceNotFound, id)
	}
	return out[0], nil
}

// Leader returns who holds the lease name: the holder's instance id and host, the
// epoch (the fencing token) and the expiry, or ErrNoLeader when nobody does (no row, an
// expired lease, or a holder that is dead by the one verdict).
func (r *Reader) Leader(ctx context.Context, name string) (Leader, error) {
	if r.leaderSQL == "" {
		return Leader{}, ErrNoLeases
	}
	return readLeader(ctx, r.db, r.leaderSQL, name)
}

// Instances returns the instances of one service (every service when service is empty),
// ordered by service and id, dead ones included until they are reaped.
func (r *Reader) Instances(ctx context.Context, service string) ([]InstanceStatus, error) {
	var svc *string
	if service != "" {
		svc = &service
	}
	return r.read(ctx, nil, svc)
}

func (r *Reader) read(ctx context.Context, id *uuid.UUID, service *string) ([]InstanceStatus, error) {
	rows, err := r.db.Query(ctx, r.instances.SQL, r.instances.Args(id, service)...)
	if err != nil {
		return nil, fmt.Errorf("liveness: read instances: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (InstanceStatus, error) {
		i, err := pgx.RowToStructByName[store.InstanceRow](row)
		return instanceStatus(i), err
	})
	if err != nil {
		return nil, fmt.Errorf("liveness: read instances: %w", err)
	}
	return out, nil
}

// recordedTiming is the timing a row records, in seconds; NULL (not recorded) is zero.
func recordedTiming(interval, slow, stale, dead, grace *float64) Timing {
	return Timing{HeartbeatInterval: seconds(interval), HeartbeatSlowInterval: seconds(slow),
		StaleThreshold: seconds(stale), DefinitiveDeadCutoff: seconds(dead), LockGrace: seconds(grace)}
}

// seconds converts seconds from the database to a duration; NULL is zero.
func seconds(s *float64) time.Duration {
	if s == nil {
		return 0
	}
	return time.Duration(*s * float64(time.Second))
}
