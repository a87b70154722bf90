package liveness

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// FleetQuery selects what Reader.Fleet returns besides the per-service counts: one page
// of instances, problems first, and one page of leases, as the exporter's status page
// asks for them too. Offsets and limits must not be negative.
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
	args, err := store.FleetQuery(q).Args() // the same fields: one definition of the arguments
	if err != nil {
		return Fleet{}, fmt.Errorf("liveness: %w", err)
	}
	rows, err := r.db.Query(ctx, r.fleet.SQL, r.fleet.Args(args...)...)
	if err != nil {
		return Fleet{}, fmt.Errorf("liveness: read fleet: %w", err)
	}
	sf, err := store.CollectFleet(rows)
	if err != nil {
		return Fleet{}, fmt.Errorf("liveness: read fleet: %w", err)
	}
	m := sf.Meta
	f := Fleet{Now: m.Now, Database: m.Database, InRecovery: m.InRecovery, InstancesTotal: m.Instances, LeasesTotal: m.Leases}
	for _, s := range sf.Services {
		ss := ServiceStates{Service: s.Service, Counts: map[InstanceState]int{}, OldestHeartbeatAge: seconds(&s.OldestAge)}
		for state, n := range s.Counts {
			ss.Counts[InstanceState(state)] = n
		}
		f.Services = append(f.Services, ss)
	}
	for _, i := range sf.Instances {
		f.Instances = append(f.Instances, instanceStatus(i))
	}
	for _, l := range sf.Leases {
		f.Leases = append(f.Leases, fleetLease(l))
	}
	return f, nil
}

// instanceStatus is the library's form of an instance row.
func instanceStatus(i store.InstanceRow) InstanceStatus {
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
