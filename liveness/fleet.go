package liveness

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/store"
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
	rows, err := r.db.Query(ctx, r.fleet.SQL, r.fleet.Args(service, id, q.Offset, q.Limit, lease, q.LeaseOffset, q.LeaseLimit)...)
	if err != nil {
		return Fleet{}, fmt.Errorf("liveness: read fleet: %w", err)
	}
	var (
		f                 Fleet
		services          = map[string]*ServiceStates{}
		instOrd, leaseOrd []int64
		row               store.FleetRow
	)
	_, err = pgx.ForEachRow(rows, []any{&row.Kind, &row.Ord, &row.Object}, func() error {
		switch row.Kind {
		case "meta":
			var m store.FleetMeta
			if err := json.Unmarshal(row.Object, &m); err != nil {
				return err
			}
			f.Now, f.Database, f.InRecovery, f.InstancesTotal, f.LeasesTotal = m.Now, m.Database, m.InRecovery, m.Instances, m.Leases
		case "count":
			var c store.FleetCount
			if err := json.Unmarshal(row.Object, &c); err != nil {
				return err
			}
			s := services[c.Service]
			if s == nil {
				s = &ServiceStates{Service: c.Service, Counts: map[InstanceState]int{}}
				services[c.Service] = s
			}
			s.Counts[InstanceState(c.State)] += c.Count
			s.OldestHeartbeatAge = max(s.OldestHeartbeatAge, seconds(&c.OldestAge))
		case "instance":
			var i store.FleetInstance
			if err := json.Unmarshal(row.Object, &i); err != nil {
				return err
			}
			f.Instances = append(f.Instances, fleetInstance(i))
			instOrd = append(instOrd, row.Ord)
		case "lease":
			var l store.FleetLease
			if err := json.Unmarshal(row.Object, &l); err != nil {
				return err
			}
			f.Leases = append(f.Leases, fleetLease(l))
			leaseOrd = append(leaseOrd, row.Ord)
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

func fleetInstance(i store.FleetInstance) InstanceStatus {
	return InstanceStatus{
		InstanceID: i.InstanceID, ServiceName: i.ServiceName, HostName: i.HostName, ProcessID: i.ProcessID,
		State: InstanceState(i.State), LockHeld: i.LockHeld, LastHeartbeat: i.LastHeartbeatAt,
		HeartbeatAge: seconds(&i.HeartbeatAge), StartedAt: i.StartedAt, Mode: Mode(i.LivenessMode), Metadata: i.Metadata,
		Timing: recordedTiming(i.HeartbeatInterval, i.HeartbeatSlowInterval, i.StaleThreshold, i.DefinitiveDeadCutoff, i.LockGrace),
	}
}

func fleetLease(l store.FleetLease) LeaseStatus {
	s := LeaseStatus{Name: l.Name, Epoch: l.Epoch, TakenAt: l.TakenAt, ExpiresAt: l.ExpiresAt, HolderState: InstanceState(l.HolderState),
		ExpiresIn: seconds(&l.ExpiresIn), HeldFor: seconds(&l.HeldFor), Held: l.Held}
	if l.HolderInstanceID != nil {
		s.HolderInstanceID = *l.HolderInstanceID
	}
	if l.HolderHost != nil {
		s.HolderHost = *l.HolderHost
	}
	if l.HolderService != nil {
		s.HolderService = *l.HolderService
	}
	return s
}
