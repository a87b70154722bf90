package liveness

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/sqltag"
)

// FleetQuery selects what Reader.Fleet returns besides the per-service counts: one page
// of instances, problems first, and one page of leases.
type FleetQuery struct {
	Service    string    // only this service's instances; "" for every service
	InstanceID uuid.UUID // only this instance; uuid.Nil for all
	// The page of instances: Limit rows after Offset, ordered zombie, stale, lock_lost,
	// lock_only, then the rest, each group by service and id. Limit 0 returns none.
	Offset, Limit int

	LeaseName string // only leases whose name contains this, ignoring case; "" for all
	// The page of leases: first those whose holder is dead (takeable before they
	// expire), then the expired ones, then the held ones, each group by name.
	LeaseOffset, LeaseLimit int
}

// Fleet is the whole fleet as one statement saw it: the states of every instance by the
// one verdict, evaluated once, so that the counts, the page of instances and the lease
// holders' states agree with each other.
type Fleet struct {
	Now        time.Time // the database clock
	Database   string    // the database's name
	InRecovery bool      // a hot standby: states rest on heartbeats alone

	Services       []ServiceStates  // every service, by name
	Instances      []InstanceStatus // the page
	InstancesTotal int              // instances that match FleetQuery.Service and InstanceID
	Leases         []LeaseStatus    // the page
	LeasesTotal    int              // leases that match FleetQuery.LeaseName
}

// ServiceStates counts one service's instances by state.
type ServiceStates struct {
	Service            string
	Counts             map[InstanceState]int // states without instances are absent
	OldestHeartbeatAge time.Duration
}

// LeaseStatus is one row of the leases table, its holder judged by the one verdict.
type LeaseStatus struct {
	Name             string
	HolderInstanceID uuid.UUID     // uuid.Nil when the holder recorded none (older software)
	HolderHost       string        // recorded, or the holder token up to its first colon
	HolderService    string        // "" when the holder's instance row is gone or unknown
	HolderState      InstanceState // "" likewise
	Epoch            int64         // the fencing token of the current acquisition
	TakenAt          time.Time     // the last acquisition (a takeover or a first take)
	ExpiresAt        time.Time
	ExpiresIn        time.Duration // negative once expired
	HeldFor          time.Duration
	// Held is the answer of lease_is_free, negated: not expired, and the holder (when
	// recorded) alive by the verdict. A lease that is not held may be taken.
	Held bool
}

// fleetSQL reads instance_states once (which stamps vanished locks first, then runs the
// one verdict) and returns, as one JSON object a row: a 'meta' row (clock, database,
// standby, how many instances and leases match), a 'count' row per service and state, the
// page of instances and the page of leases. Lease rows carry their holder's state from the
// same evaluation; their "held" is lease_is_free's rule (not expired, holder alive when
// recorded) applied to it, since calling lease_is_free per lease would evaluate the
// verdict again for each.
//
// $1 and $2 the fallback stale threshold and definitive-dead cutoff in seconds; $3 a
// service or NULL, $4 an instance id or NULL; $5 offset and $6 limit of instances; $7 a
// lease name fragment or NULL; $8 offset and $9 limit of leases.
const fleetSQL = `WITH ` + sqltag.ReadFleet + ` v AS MATERIALIZED (
    SELECT s.instance_id, s.service_name, s.state, s.alive, s.lock_held, s.last_heartbeat_at
      FROM {states} s
), picked AS (
    SELECT v.*, CASE v.state WHEN 'zombie' THEN 0 WHEN 'stale' THEN 1 WHEN 'lock_lost' THEN 2
                             WHEN 'lock_only' THEN 3 ELSE 4 END AS rank
      FROM v
     WHERE ($3::text IS NULL OR v.service_name = $3::text) AND ($4::uuid IS NULL OR v.instance_id = $4::uuid)
), page AS ( -- a top-N sort: only offset + limit rows are kept in order
    SELECT p.*, row_number() OVER (ORDER BY p.rank, p.service_name, p.instance_id) AS ord
      FROM (SELECT * FROM picked ORDER BY rank, service_name, instance_id LIMIT $6 OFFSET $5) p
), lease_rows AS MATERIALIZED (
    SELECT l.name, l.holder_instance_id, coalesce(l.holder_host, split_part(l.holder, ':', 1)) AS holder_host,
           l.epoch, l.taken_at, l.expires_at, h.service_name AS holder_service, h.state AS holder_state,
           extract(epoch FROM l.expires_at - now())::float8 AS expires_in,
           extract(epoch FROM now() - l.taken_at)::float8 AS held_for,
           l.expires_at >= now() AND (l.holder_instance_id IS NULL OR coalesce(h.alive, false)) AS held
      FROM {leases} l
      LEFT JOIN v h ON h.instance_id = l.holder_instance_id
     WHERE $7::text IS NULL OR strpos(lower(l.name), lower($7::text)) > 0
), lease_page AS (
    SELECT r.*, row_number() OVER (ORDER BY CASE WHEN r.held THEN 2 WHEN r.expires_in >= 0 THEN 0 ELSE 1 END,
                                             r.name) AS ord
      FROM lease_rows r
)
SELECT 'meta', 0::bigint, jsonb_build_object('now', now(), 'database', current_database(),
       'in_recovery', pg_is_in_recovery(), 'instances', (SELECT count(*) FROM picked),
       'leases', (SELECT count(*) FROM lease_rows))
UNION ALL
SELECT 'count', 0, jsonb_build_object('service', v.service_name, 'state', v.state, 'count', count(*),
       'oldest_age', extract(epoch FROM now() - min(v.last_heartbeat_at))::float8)
  FROM v GROUP BY v.service_name, v.state
UNION ALL
SELECT 'instance', p.ord, jsonb_build_object('instance_id', p.instance_id, 'service_name', p.service_name,
       'host_name', i.host_name, 'process_id', i.process_id, 'state', p.state,
       'lock_held', coalesce(p.lock_held, false), 'last_heartbeat_at', p.last_heartbeat_at,
       'heartbeat_age', extract(epoch FROM now() - p.last_heartbeat_at)::float8, 'started_at', i.started_at,
       'liveness_mode', {mode}, 'metadata', i.metadata,
       'heartbeat_interval', {heartbeat_interval}, 'heartbeat_slow_interval', {heartbeat_slow_interval},
       'stale_threshold', {stale_threshold}, 'definitive_dead_cutoff', {definitive_dead_cutoff},
       'lock_grace', {lock_grace})
  FROM page p JOIN {instances} i ON i.instance_id = p.instance_id
UNION ALL
SELECT 'lease', p.ord, to_jsonb(p) - 'ord'
  FROM lease_page p
 WHERE p.ord > $8 AND p.ord <= $8 + $9`

// Fleet reads every instance's state once and returns the counts per service, a page of
// instances (problems first) and a page of leases with their holders' states. It is one
// statement.
func (r *Reader) Fleet(ctx context.Context, q FleetQuery) (Fleet, error) {
	if q.Offset < 0 || q.Limit < 0 || q.LeaseOffset < 0 || q.LeaseLimit < 0 {
		return Fleet{}, fmt.Errorf("liveness: FleetQuery offsets and limits must not be negative")
	}
	var service, lease *string
	if q.Service != "" {
		service = &q.Service
	}
	if q.LeaseName != "" {
		lease = &q.LeaseName
	}
	var id *uuid.UUID
	if q.InstanceID != uuid.Nil {
		id = &q.InstanceID
	}
	rows, err := r.db.Query(ctx, r.fleetSQL, append([]any{r.stale, r.dead, service, id, q.Offset, q.Limit, lease,
		q.LeaseOffset, q.LeaseLimit}, r.extraArgs...)...)
	if err != nil {
		return Fleet{}, fmt.Errorf("liveness: read fleet: %w", err)
	}
	var (
		f                 Fleet
		services          = map[string]*ServiceStates{}
		instOrd, leaseOrd []int64
		row               fleetRow
	)
	_, err = pgx.ForEachRow(rows, []any{&row.kind, &row.ord, &row.obj}, func() error {
		switch row.kind {
		case "meta":
			var m fleetMeta
			if err := json.Unmarshal(row.obj, &m); err != nil {
				return err
			}
			f.Now, f.Database, f.InRecovery, f.InstancesTotal, f.LeasesTotal = m.Now, m.Database, m.InRecovery, m.Instances, m.Leases
		case "count":
			var c fleetCount
			if err := json.Unmarshal(row.obj, &c); err != nil {
				return err
			}
			s := services[c.Service]
			if s == nil {
				s = &ServiceStates{Service: c.Service, Counts: map[InstanceState]int{}}
				services[c.Service] = s
			}
			s.Counts[c.State] += c.Count
			s.OldestHeartbeatAge = max(s.OldestHeartbeatAge, seconds(&c.OldestAge))
		case "instance":
			var i fleetInstance
			if err := json.Unmarshal(row.obj, &i); err != nil {
				return err
			}
			f.Instances = append(f.Instances, i.status())
			instOrd = append(instOrd, row.ord)
		case "lease":
			var l fleetLease
			if err := json.Unmarshal(row.obj, &l); err != nil {
				return err
			}
			f.Leases = append(f.Leases, l.status())
			leaseOrd = append(leaseOrd, row.ord)
		}
		return nil
	})
	if err != nil {
		return Fleet{}, fmt.Errorf("liveness: read fleet: %w", err)
	}
	for _, s := range services {
		f.Services = append(f.Services, *s)
	}
	sort.Slice(f.Services, func(i, j int) bool { return f.Services[i].Service < f.Services[j].Service })
	sortBy(f.Instances, instOrd)
	sortBy(f.Leases, leaseOrd)
	return f, nil
}

// sortBy orders s by the ordinals in ord (one per element): UNION ALL keeps no order.
func sortBy[T any](s []T, ord []int64) {
	idx := make([]int, len(s))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return ord[idx[a]] < ord[idx[b]] })
	out := make([]T, len(s))
	for i, j := range idx {
		out[i] = s[j]
	}
	copy(s, out)
}

// fleetRow is a row of fleetSQL: its kind, its place in its page and its object.
type fleetRow struct {
	kind string
	ord  int64
	obj  []byte
}

type fleetMeta struct {
	Now        time.Time `json:"now"`
	Database   string    `json:"database"`
	InRecovery bool      `json:"in_recovery"`
	Instances  int       `json:"instances"`
	Leases     int       `json:"leases"`
}

type fleetCount struct {
	Service   string        `json:"service"`
	State     InstanceState `json:"state"`
	Count     int           `json:"count"`
	OldestAge float64       `json:"oldest_age"`
}

type fleetInstance struct {
	ID            uuid.UUID       `json:"instance_id"`
	Service       string          `json:"service_name"`
	Host          string          `json:"host_name"`
	PID           int             `json:"process_id"`
	State         InstanceState   `json:"state"`
	LockHeld      bool            `json:"lock_held"`
	LastHeartbeat time.Time       `json:"last_heartbeat_at"`
	Age           float64         `json:"heartbeat_age"`
	StartedAt     time.Time       `json:"started_at"`
	Mode          Mode            `json:"liveness_mode"`
	Metadata      json.RawMessage `json:"metadata"`
	Interval      *float64        `json:"heartbeat_interval"`
	Slow          *float64        `json:"heartbeat_slow_interval"`
	Stale         *float64        `json:"stale_threshold"`
	Dead          *float64        `json:"definitive_dead_cutoff"`
	Grace         *float64        `json:"lock_grace"`
}

type fleetLease struct {
	Name          string        `json:"name"`
	HolderID      *uuid.UUID    `json:"holder_instance_id"`
	HolderHost    *string       `json:"holder_host"`
	Epoch         int64         `json:"epoch"`
	TakenAt       time.Time     `json:"taken_at"`
	ExpiresAt     time.Time     `json:"expires_at"`
	HolderService *string       `json:"holder_service"`
	HolderState   InstanceState `json:"holder_state"`
	ExpiresIn     float64       `json:"expires_in"`
	HeldFor       float64       `json:"held_for"`
	Held          bool          `json:"held"`
}

func (i fleetInstance) status() InstanceStatus {
	return InstanceStatus{
		InstanceID: i.ID, ServiceName: i.Service, HostName: i.Host, ProcessID: i.PID, State: i.State,
		LockHeld: i.LockHeld, LastHeartbeat: i.LastHeartbeat, HeartbeatAge: seconds(&i.Age), StartedAt: i.StartedAt,
		Mode: i.Mode, Metadata: i.Metadata,
		Timing: Timing{HeartbeatInterval: seconds(i.Interval), HeartbeatSlowInterval: seconds(i.Slow),
			StaleThreshold: seconds(i.Stale), DefinitiveDeadCutoff: seconds(i.Dead), LockGrace: seconds(i.Grace)},
	}
}

func (l fleetLease) status() LeaseStatus {
	s := LeaseStatus{Name: l.Name, Epoch: l.Epoch, TakenAt: l.TakenAt, ExpiresAt: l.ExpiresAt, HolderState: l.HolderState,
		ExpiresIn: seconds(&l.ExpiresIn), HeldFor: seconds(&l.HeldFor), Held: l.Held}
	if l.HolderID != nil {
		s.HolderInstanceID = *l.HolderID
	}
	if l.HolderHost != nil {
		s.HolderHost = *l.HolderHost
	}
	if l.HolderService != nil {
		s.HolderService = *l.HolderService
	}
	return s
}
