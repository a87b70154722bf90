package liveness_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/whizbangtest"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// A Reader on a Whizbang database reads Whizbang's instances by the one rule, as a role
// that may only SELECT from Whizbang's table, in read-only sessions.
func TestReaderOnWhizbang(t *testing.T) {
	t.Parallel()
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
	// Zero fields: Whizbang's defaults, which the fixture's table and locks follow.
	r, err := liveness.NewReader(liveness.ReaderConfig{DB: f.Observer, Whizbang: &liveness.WhizbangSource{}})
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
	r, err = liveness.NewReader(liveness.ReaderConfig{DB: f.Observer, Whizbang: &liveness.WhizbangSource{NoPrefix: true}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Instances(ctx, "orders"); err == nil || !strings.Contains(err.Error(), `"public.service_instances" does not exist`) {
		t.Fatalf("NoPrefix: %v, want the missing public.service_instances", err)
	}
	// Every other field reaches the verdict: another lock key prefix finds no lock (the
	// lock holder is heartbeat_only), a longer stale threshold keeps the two-minute-old
	// heartbeat alive, and the timing is the one given, the rest Whizbang's.
	timing := liveness.Timing{HeartbeatInterval: 40 * time.Second, HeartbeatSlowInterval: 80 * time.Second,
		StaleThreshold: 3 * time.Minute, DefinitiveDeadCutoff: 10 * time.Minute}
	r, err = liveness.NewReader(liveness.ReaderConfig{DB: f.Observer, Whizbang: &liveness.WhizbangSource{
		Schema: "public", Prefix: "wh_", LockKeyPrefix: "other_key:", Timing: timing}})
	if err != nil {
		t.Fatal(err)
	}
	got, err = r.Instances(ctx, "orders")
	if err != nil || len(got) != 2 {
		t.Fatalf("orders with other fields: %v, %v; want 2 instances", got, err)
	}
	for _, s := range got {
		if s.State != liveness.StateHeartbeatOnly || s.LockHeld || s.Timing != timing {
			t.Errorf("%s with another key prefix and stale threshold: state %s, lock held %t, timing %+v; want heartbeat_only, "+
				"no lock, %+v", s.InstanceID, s.State, s.LockHeld, s.Timing, timing)
		}
	}
}

// A ReaderConfig the library refuses is a *ConfigError naming the ReaderConfig field at
// fault, in the field and in the reason, and never the data layer's names.
func TestReaderConfigErrorsNameTheField(t *testing.T) {
	var db *pgxpool.Pool // never queried: NewReader only checks its configuration
	whizbang := func(w liveness.WhizbangSource) liveness.ReaderConfig {
		return liveness.ReaderConfig{DB: db, Whizbang: &w}
	}
	slow := func(t liveness.Timing) liveness.WhizbangSource { return liveness.WhizbangSource{Timing: t} }
	for _, tc := range []struct {
		field, mentions string
		cfg             liveness.ReaderConfig
	}{
		{"ReaderConfig.DB", "", liveness.ReaderConfig{}},
		{"ReaderConfig.Schema", "", liveness.ReaderConfig{DB: db, Schema: "pg_jobs"}},
		{"ReaderConfig.Fallback.StaleThreshold", "", liveness.ReaderConfig{DB: db, Fallback: liveness.Timing{StaleThreshold: -time.Second}}},
		{"ReaderConfig.Fallback.DefinitiveDeadCutoff", "ReaderConfig.Fallback.StaleThreshold",
			liveness.ReaderConfig{DB: db, Fallback: liveness.Timing{StaleThreshold: time.Hour}}},
		{"ReaderConfig.Whizbang.Schema", "", whizbang(liveness.WhizbangSource{Schema: "pg_x"})},
		{"ReaderConfig.Whizbang.Prefix", "", whizbang(liveness.WhizbangSource{Prefix: strings.Repeat("p", 60)})},
		{"ReaderConfig.Whizbang.NoPrefix", "ReaderConfig.Whizbang.Prefix", whizbang(liveness.WhizbangSource{Prefix: "x_", NoPrefix: true})},
		{"ReaderConfig.Whizbang.LockKeyPrefix", "", whizbang(liveness.WhizbangSource{LockKeyPrefix: "a\x00b"})},
		{"ReaderConfig.Whizbang.Timing.HeartbeatInterval", "", whizbang(slow(liveness.Timing{HeartbeatInterval: -time.Second}))},
		{"ReaderConfig.Whizbang.Timing.HeartbeatSlowInterval", "ReaderConfig.Whizbang.Timing.HeartbeatInterval",
			whizbang(slow(liveness.Timing{HeartbeatSlowInterval: time.Second}))},
		{"ReaderConfig.Whizbang.Timing.StaleThreshold", "ReaderConfig.Whizbang.Timing.HeartbeatSlowInterval",
			whizbang(slow(liveness.Timing{StaleThreshold: time.Minute}))},
		{"ReaderConfig.Whizbang.Timing.DefinitiveDeadCutoff", "ReaderConfig.Whizbang.Timing.StaleThreshold",
			whizbang(slow(liveness.Timing{DefinitiveDeadCutoff: time.Minute}))},
		{"ReaderConfig.Whizbang.Timing.LockGrace", "", whizbang(slow(liveness.Timing{LockGrace: time.Second}))},
	} {
		_, err := liveness.NewReader(tc.cfg)
		var ce *liveness.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(ce.Reason, tc.mentions) ||
			strings.Contains(err.Error(), "SourceConfig") {
			t.Errorf("%s out of range: got %v, want a *liveness.ConfigError for %s that mentions %q", tc.field, err, tc.field, tc.mentions)
		}
	}
	for _, cfg := range []liveness.ReaderConfig{{DB: db}, whizbang(liveness.WhizbangSource{}), whizbang(liveness.WhizbangSource{NoPrefix: true})} {
		if _, err := liveness.NewReader(cfg); err != nil {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}
