package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Querier runs a query: *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and pgx.Tx are ones.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// InstanceStates are the states of the one verdict (the migrations' instance_state_rule),
// alive ones first: alive, lock_only, lock_lost, heartbeat_only, then the dead stale and
// zombie. Views that show every state, zeros included, list them from here.
func InstanceStates() []string {
	return []string{"alive", "lock_only", "lock_lost", "heartbeat_only", "stale", "zombie"}
}

// FleetQuery selects what read_fleet returns besides the per-service counts: one page
// of instances, problems first, and one page of leases (the status page sends it, and
// liveness.Reader.Fleet as liveness.FleetQuery, the same fields, converted).
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

// ErrNegativePage: a FleetQuery offset or limit is negative.
var ErrNegativePage = errors.New("FleetQuery offsets and limits must not be negative")

// Args are read_fleet's own arguments for q, in its order ($1 to $7): NULL for a filter
// that is not set. Pass them to the rendered statement's Query.Args.
func (q FleetQuery) Args() ([]any, error) {
	if q.Offset < 0 || q.Limit < 0 || q.LeaseOffset < 0 || q.LeaseLimit < 0 {
		return nil, ErrNegativePage
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
	return []any{service, id, q.Offset, q.Limit, lease, q.LeaseOffset, q.LeaseLimit}, nil
}

// Fleet is read_fleet's answer, decoded: the whole fleet as one statement saw it, the
// states of every instance evaluated once, so that the counts, the page of instances and
// the lease holders' states agree with each other.
type Fleet struct {
	Meta      FleetMeta
	Services  []FleetService // every service, by name
	Instances []InstanceRow  // the page, in its order
	Leases    []FleetLease   // the page, in its order
}

// FleetService counts one service's instances by state.
type FleetService struct {
	Service   string
	Counts    map[string]int // by state; states without instances are absent
	Dead      int            // the instances whose state is dead by the verdict
	OldestAge float64        // the oldest heartbeat's age, in seconds
}

// CollectFleet reads read_fleet's rows (FleetRow) and closes them.
func CollectFleet(rows pgx.Rows) (Fleet, error) {
	var (
		f                 Fleet
		services          = map[string]*FleetService{}
		instOrd, leaseOrd []int64
	)
	defer rows.Close()
	for rows.Next() {
		row, err := pgx.RowToStructByName[FleetRow](rows)
		if err != nil {
			return Fleet{}, err
		}
		var into any
		switch row.Kind {
		case "meta":
			into = &f.Meta
		case "count":
			var c FleetCount
			if err := json.Unmarshal(row.Object, &c); err != nil {
				return Fleet{}, fmt.Errorf("read_fleet's %s object: %w", row.Kind, err)
			}
			s := services[c.Service]
			if s == nil {
				s = &FleetService{Service: c.Service, Counts: map[string]int{}}
				services[c.Service] = s
			}
			s.Counts[c.State] += c.Count
			if !c.Alive {
				s.Dead += c.Count
			}
			s.OldestAge = max(s.OldestAge, c.OldestAge)
			continue
		case "instance":
			f.Instances = append(f.Instances, InstanceRow{})
			into, instOrd = &f.Instances[len(f.Instances)-1], append(instOrd, row.Ord)
		case "lease":
			f.Leases = append(f.Leases, FleetLease{})
			into, leaseOrd = &f.Leases[len(f.Leases)-1], append(leaseOrd, row.Ord)
		default:
			return Fleet{}, fmt.Errorf("read_fleet returned a row of kind %q", row.Kind)
		}
		if err := json.Unmarshal(row.Object, into); err != nil {
			return Fleet{}, fmt.Errorf("read_fleet's %s object: %w", row.Kind, err)
		}
	}
	if err := rows.Err(); err != nil {
		return Fleet{}, err
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
