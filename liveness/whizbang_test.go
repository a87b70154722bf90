package liveness_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/whizbangtest"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// A Reader on a Whizbang database reads Whizbang's instances by the one rule, as a role
// that may only SELECT from Whizbang's table, in read-only sessions.
func TestReaderOnWhizbang(t *testing.T) {
	f := whizbangtest.NewFixture(t, pgtest.NewDB(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	alive, stale, hb := uuid.New(), uuid.New(), uuid.New()
	f.Register(t, alive, "orders", 0)
	f.Register(t, stale, "orders", 2*time.Minute)
	f.Register(t, hb, "billing", time.Second)
	if !f.Claim(t, alive) {
		t.Fatal("claim failed")
	}
	r, err := liveness.NewReader(liveness.ReaderConfig{DB: f.Observer, Source: f.Reads(t)})
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.Instances(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("orders: %d instances, want 2", len(got))
	}
	for _, s := range got {
		want := map[uuid.UUID]liveness.InstanceState{alive: liveness.StateAlive, stale: liveness.StateStale}[s.InstanceID]
		if s.State != want || s.HostName != "host-a" || s.Timing.StaleThreshold != 90*time.Second {
			t.Errorf("%s: state %s, host %q, stale threshold %s; want %s, host-a, 90s", s.InstanceID, s.State, s.HostName,
				s.Timing.StaleThreshold, want)
		}
	}
	one, err := r.Instance(ctx, hb)
	if err != nil || one.State != liveness.StateHeartbeatOnly || one.LockHeld || !strings.Contains(string(one.Metadata), "1.2.3") {
		t.Fatalf("Instance(%s): %+v, %v; want heartbeat_only with its metadata", hb, one, err)
	}
	if _, err := r.Instance(ctx, uuid.New()); !errors.Is(err, liveness.ErrInstanceNotFound) {
		t.Fatalf("an unknown id: %v, want ErrInstanceNotFound", err)
	}
	fleet, err := r.Fleet(ctx, liveness.FleetQuery{Limit: 10, LeaseLimit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if fleet.InstancesTotal != 3 || len(fleet.Instances) != 3 || fleet.Instances[0].InstanceID != stale || fleet.LeasesTotal != 0 {
		t.Fatalf("Fleet: %d instances (%d on the page, first %v), %d leases; want 3, the stale one first, no leases",
			fleet.InstancesTotal, len(fleet.Instances), fleet.Instances, fleet.LeasesTotal)
	}
	if _, err := r.Leader(ctx, "cleanup"); !errors.Is(err, liveness.ErrNoLeases) {
		t.Fatalf("Leader: %v, want ErrNoLeases", err)
	}
	// Without a prefix the table is service_instances, which this database lacks.
	bare, err := store.NewSource(store.SourceConfig{Kind: store.SourceWhizbang, Whizbang: store.Whizbang{NoPrefix: true}})
	if err != nil {
		t.Fatal(err)
	}
	r, err = liveness.NewReader(liveness.ReaderConfig{DB: f.Observer, Source: bare})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Instances(ctx, "orders"); err == nil || !strings.Contains(err.Error(), `"public.service_instances" does not exist`) {
		t.Fatalf("NoPrefix: %v, want the missing public.service_instances", err)
	}
}
