package liveness

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/sqltag"
)

// InstanceState is an instance's liveness state, as the migrations' instance_states
// defines it. That SQL function is the only definition: the reaper, the exporter,
// is_instance_alive and this reader all read it, so they always agree.
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

// ReaderConfig configures a Reader.
type ReaderConfig struct {
	DB     Querier
	Schema string // DefaultSchema if empty

	// Fallback is the timing for rows that record none (rows written by other
	// software); an Agent's rows are judged by their own. Only its StaleThreshold and
	// DefinitiveDeadCutoff are used; zero takes DefaultStaleThreshold and
	// DefaultDefinitiveDeadCutoff.
	Fallback Timing

	// Whizbang, when set, reads a Whizbang database as it is instead of this package's
	// schema (Schema and Fallback are then unused; the source carries its timing).
	// Leader returns ErrNoLeases.
	Whizbang *WhizbangSource
}

// Reader answers "is instance X alive?" and "which instances of service Y are alive?"
// from instance_states. Each call is one statement; it holds no connection in between.
type Reader struct {
	db          Querier
	sql         string
	leaderSQL   string
	fleetSQL    string
	stale, dead float64 // seconds
	extraArgs   []any   // after each statement's own: a Whizbang source's lock key prefix
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

// Alive reports whether the instance is alive by the one verdict.
func (s InstanceStatus) Alive() bool { return s.State.Alive() }

// readerSQL reads instance_states joined to the rows' identity. $1 and $2 the fallback
// stale threshold and definitive-dead cutoff in seconds, $3 one instance id or NULL, $4 a
// service name or NULL.
const readerSQL = `SELECT ` + sqltag.ReadInstances + ` s.instance_id, s.service_name, i.host_name, i.process_id,
       s.state, coalesce(s.lock_held, false), s.last_heartbeat_at, ` + instanceDetailColumns + `
  FROM {states} s
  JOIN {instances} i ON i.instance_id = s.instance_id
 WHERE ($3::uuid IS NULL OR s.instance_id = $3::uuid) AND ($4::text IS NULL OR s.service_name = $4::text)
 ORDER BY s.service_name, s.instance_id`

// NewReader validates cfg. Errors name the ReaderConfig field.
func NewReader(cfg ReaderConfig) (*Reader, error) {
	if cfg.DB == nil {
		return nil, &ConfigError{Field: "ReaderConfig.DB", Reason: "must not be nil"}
	}
	stale := cmp.Or(cfg.Fallback.StaleThreshold, DefaultStaleThreshold)
	dead := cmp.Or(cfg.Fallback.DefinitiveDeadCutoff, DefaultDefinitiveDeadCutoff)
	if stale < 0 {
		return nil, &ConfigError{Field: "ReaderConfig.Fallback.StaleThreshold", Reason: fmt.Sprintf("(%s) must not be negative", stale)}
	}
	if dead <= stale {
		return nil, &ConfigError{Field: "ReaderConfig.Fallback.DefinitiveDeadCutoff",
			Reason: fmt.Sprintf("(%s) must be above ReaderConfig.Fallback.StaleThreshold (%s)", dead, stale)}
	}
	if cfg.Whizbang != nil {
		return newWhizbangReader(cfg)
	}
	r := readerSources(cfg.Schema)
	return &Reader{db: cfg.DB, sql: r.render(readerSQL, "$3::uuid"), leaderSQL: newLeaseStatements(cfg.Schema).leader,
		fleetSQL: r.render(fleetSQL, "NULL::uuid"), stale: stale.Seconds(), dead: dead.Seconds()}, nil
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
	rows, err := r.db.Query(ctx, r.sql, append([]any{r.stale, r.dead, id, service}, r.extraArgs...)...)
	if err != nil {
		return nil, fmt.Errorf("liveness: read instances: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (InstanceStatus, error) {
		var (
			s InstanceStatus
			d instanceDetail
		)
		err := row.Scan(append([]any{&s.InstanceID, &s.ServiceName, &s.HostName, &s.ProcessID, &s.State, &s.LockHeld,
			&s.LastHeartbeat}, d.dest()...)...)
		d.fill(&s)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("liveness: read instances: %w", err)
	}
	return out, nil
}

// instanceDetailColumns are the columns of an instances row i (joined to a verdict s)
// that instanceDetail scans: the heartbeat's age by the database clock, the start, the
// mode, the metadata and the recorded timing in seconds.
const instanceDetailColumns = `extract(epoch FROM now() - s.last_heartbeat_at)::float8, i.started_at, {mode},
       coalesce(i.metadata, '{}')::text, {heartbeat_interval}, {heartbeat_slow_interval}, {stale_threshold},
       {definitive_dead_cutoff}, {lock_grace}`

// instanceDetail receives instanceDetailColumns.
type instanceDetail struct {
	age                                float64
	started                            time.Time
	mode, metadata                     string
	interval, slow, stale, dead, grace *float64
}

func (d *instanceDetail) dest() []any {
	return []any{&d.age, &d.started, &d.mode, &d.metadata, &d.interval, &d.slow, &d.stale, &d.dead, &d.grace}
}

func (d *instanceDetail) fill(s *InstanceStatus) {
	s.HeartbeatAge = seconds(&d.age)
	s.StartedAt, s.Mode, s.Metadata = d.started, Mode(d.mode), json.RawMessage(d.metadata)
	s.Timing = Timing{HeartbeatInterval: seconds(d.interval), HeartbeatSlowInterval: seconds(d.slow),
		StaleThreshold: seconds(d.stale), DefinitiveDeadCutoff: seconds(d.dead), LockGrace: seconds(d.grace)}
}

// seconds converts seconds from the database to a duration; NULL is zero.
func seconds(s *float64) time.Duration {
	if s == nil {
		return 0
	}
	return time.Duration(*s * float64(time.Second))
}
