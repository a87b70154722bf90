package liveness_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// fleetFixture writes one instance in each state, their states fixed by their own timing
// and by sessions that hold their alive locks, and leases with live, dead, unknown and
// no recorded holders. It returns the ids by state.
func fleetFixture(t *testing.T, ctx context.Context, pool *pgxpool.Pool, dsn string) map[liveness.InstanceState]uuid.UUID {
	t.Helper()
	ids := map[liveness.InstanceState]uuid.UUID{}
	for _, s := range []liveness.InstanceState{liveness.StateAlive, liveness.StateLockOnly, liveness.StateLockLost,
		liveness.StateHeartbeatOnly, liveness.StateStale, liveness.StateZombie} {
		ids[s] = uuid.New()
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%.60s: %v", sql, err)
		}
	}
	// Own timing: stale after 20 s, definitive-dead after 60 s, one hour of grace.
	insert := func(id uuid.UUID, service string, age int, holds bool) {
		exec(`INSERT INTO liveness.instances (instance_id, service_name, host_name, process_id, last_heartbeat_at,
		          heartbeat_interval, heartbeat_slow_interval, stale_threshold, definitive_dead_cutoff, lock_grace,
		          holds_alive_lock, metadata)
		      VALUES ($1, $2, 'host-' || $2, 4242, now() - make_interval(secs => $3), '5 s', '10 s', '20 s', '60 s', '1 hour',
		              $4, '{"zone": "<b>z</b>"}')`, id, service, age, holds)
	}
	insert(ids[liveness.StateAlive], "a", 0, true)
	insert(ids[liveness.StateLockOnly], "a", 25, true)
	insert(ids[liveness.StateLockLost], "a", 0, true)
	insert(ids[liveness.StateHeartbeatOnly], "b", 0, false)
	insert(ids[liveness.StateStale], "b", 25, false)
	insert(ids[liveness.StateZombie], "a", 61, true)
	for _, s := range []liveness.InstanceState{liveness.StateAlive, liveness.StateLockOnly, liveness.StateZombie} {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		if _, err := c.Exec(ctx, `SELECT liveness.claim_instance_alive_lock($1)`, ids[s]); err != nil {
			t.Fatal(err)
		}
	}
	lease := func(name string, holder *uuid.UUID, host *string, expiresIn int) {
		exec(`INSERT INTO liveness.leases (name, holder, holder_instance_id, holder_host, taken_at, expires_at)
		      VALUES ($1, 'legacy-host:77:00ff', $2, $3, now() - interval '90 seconds', now() + make_interval(secs => $4))`,
			name, holder, host, expiresIn)
	}
	host := "host-a"
	alive, stale, gone := ids[liveness.StateAlive], ids[liveness.StateStale], uuid.New()
	lease("Cleanup", &alive, &host, 600)
	lease("mail", &stale, &host, 600) // holder dead: free before it expires
	lease("gone", &gone, &host, 600)  // holder's row reaped: free as well
	lease("expired", &alive, &host, -30)
	lease("legacy", nil, nil, 600) // older software: no instance, host from the holder token
	return ids
}

func TestReaderFleet(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ids := fleetFixture(t, ctx, pool, db.DSN)
	reader, err := liveness.NewReader(liveness.ReaderConfig{DB: pool})
	if err != nil {
		t.Fatal(err)
	}

	// Problems first, three to a page; every state as instance_states says.
	var states []liveness.InstanceState
	for off := 0; off < 9; off += 3 {
		f, err := reader.Fleet(ctx, liveness.FleetQuery{Offset: off, Limit: 3})
		if err != nil {
			t.Fatal(err)
		}
		if f.InstancesTotal != 6 || f.LeasesTotal != 5 || f.Database != db.Name || f.Now.IsZero() {
			t.Fatalf("totals %d/%d, database %q, now %v", f.InstancesTotal, f.LeasesTotal, f.Database, f.Now)
		}
		for _, i := range f.Instances {
			if ids[i.State] != i.InstanceID {
				t.Errorf("instance %s shown as %s", i.InstanceID, i.State)
			}
			states = append(states, i.State)
		}
	}
	want := []liveness.InstanceState{liveness.StateZombie, liveness.StateStale, liveness.StateLockLost, liveness.StateLockOnly,
		liveness.StateAlive, liveness.StateHeartbeatOnly}
	if len(states) != len(want) {
		t.Fatalf("pages gave %v, want %v", states, want)
	}
	for i := range want {
		if states[i] != want[i] {
			t.Fatalf("pages gave %v, want %v", states, want)
		}
	}

	f, err := reader.Fleet(ctx, liveness.FleetQuery{Service: "b", Limit: 10, LeaseName: "CLEAN", LeaseLimit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if f.InstancesTotal != 2 || len(f.Instances) != 2 || f.Instances[0].State != liveness.StateStale {
		t.Fatalf("service b: %d of %d, first %+v", len(f.Instances), f.InstancesTotal, f.Instances)
	}
	if len(f.Services) != 2 || f.Services[0].Service != "a" || f.Services[0].Counts[liveness.StateZombie] != 1 ||
		f.Services[1].Counts[liveness.StateStale] != 1 || f.Services[0].OldestHeartbeatAge < 61*time.Second {
		t.Fatalf("services %+v", f.Services)
	}
	if f.LeasesTotal != 1 || len(f.Leases) != 1 || f.Leases[0].Name != "Cleanup" {
		t.Fatalf("leases named like CLEAN: %+v", f.Leases)
	}
	l := f.Leases[0]
	if l.HolderInstanceID != ids[liveness.StateAlive] || l.HolderService != "a" || l.HolderState != liveness.StateAlive ||
		!l.Held || l.Epoch == 0 || l.ExpiresIn < 500*time.Second || l.HeldFor < 80*time.Second {
		t.Fatalf("Cleanup: %+v", l)
	}

	// The one instance, with what the row records.
	f, err = reader.Fleet(ctx, liveness.FleetQuery{InstanceID: ids[liveness.StateZombie], Limit: 10, LeaseLimit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Instances) != 1 || f.InstancesTotal != 1 {
		t.Fatalf("one instance: %+v", f.Instances)
	}
	z := f.Instances[0]
	var meta map[string]string
	if err := json.Unmarshal(z.Metadata, &meta); err != nil || meta["zone"] != "<b>z</b>" {
		t.Fatalf("metadata %s: %v", z.Metadata, err)
	}
	wantTiming := liveness.Timing{HeartbeatInterval: 5 * time.Second, HeartbeatSlowInterval: 10 * time.Second,
		StaleThreshold: 20 * time.Second, DefinitiveDeadCutoff: time.Minute, LockGrace: time.Hour}
	if z.Timing != wantTiming || !z.LockHeld || z.HostName != "host-a" || z.ProcessID != 4242 ||
		z.Mode != liveness.ModeAdvisoryLockWhenAvailable || z.HeartbeatAge < 61*time.Second || z.StartedAt.IsZero() {
		t.Fatalf("zombie: %+v", z)
	}
	one, err := reader.Instance(ctx, z.InstanceID)
	if err != nil || one.Timing != wantTiming || string(one.Metadata) != string(z.Metadata) || one.HeartbeatAge < 61*time.Second {
		t.Fatalf("Reader.Instance: %+v, %v", one, err)
	}

	// Leases: a dead or vanished holder's first (free before they expire), then the
	// expired one, then those held; "held" is lease_is_free's answer, negated.
	f, err = reader.Fleet(ctx, liveness.FleetQuery{LeaseLimit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range f.Leases {
		names = append(names, l.Name)
		var free bool
		if err := pool.QueryRow(ctx, `SELECT liveness.lease_is_free($1)`, l.Name).Scan(&free); err != nil {
			t.Fatal(err)
		}
		if l.Held == free {
			t.Errorf("lease %s: held %v, but lease_is_free says %v", l.Name, l.Held, free)
		}
	}
	if got, want := join(names), "gone mail expired Cleanup legacy"; got != want {
		t.Fatalf("lease order %q, want %q", got, want)
	}
	for _, l := range f.Leases {
		switch l.Name {
		case "legacy":
			if l.HolderHost != "legacy-host" || l.HolderInstanceID != uuid.Nil || l.HolderState != "" {
				t.Errorf("legacy: %+v", l)
			}
		case "gone":
			if l.HolderState != "" || l.HolderService != "" {
				t.Errorf("gone: %+v", l)
			}
		case "mail":
			if l.HolderState != liveness.StateStale {
				t.Errorf("mail: %+v", l)
			}
		}
	}
	if _, err := reader.Fleet(ctx, liveness.FleetQuery{Limit: -1}); err == nil {
		t.Fatal("a negative limit was accepted")
	}
}

func join(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x
	}
	return out
}
