package liveness

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
)

func TestReaperRespectsLocksAndItsLease(t *testing.T) {
	t.Parallel()
	db, pool := testdb.MigratedPool(t, 4)
	leases, err := NewLeases(LeasesConfig{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	reaper, err := newReaper(reaperConfig{
		Pool: pool, Leases: leases, Schema: defaults.Schema,
		Interval: time.Second, LeaseTTL: 2 * time.Second,
		StaleThreshold: 90 * time.Second, DefinitiveDeadCutoff: 5 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	stale, lockedStale, zombie, fresh := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, last_heartbeat_at) VALUES
		($1, 's', now() - interval '2 minutes'), ($2, 's', now() - interval '2 minutes'),
		($3, 's', now() - interval '10 minutes'), ($4, 's', now())`, stale, lockedStale, zombie, fresh)
	holder := db.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, id := range []uuid.UUID{lockedStale, zombie} {
		if _, err := holder.Exec(ctx, `SELECT liveness.claim_instance_alive_lock($1)`, id); err != nil {
			t.Fatal(err)
		}
	}

	// Another agent holds the reaper lease: this one skips the round.
	other, err := NewLeases(LeasesConfig{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	held, err := other.TryAcquire(ctx, defaults.ReaperLease, 10*time.Second)
	if err != nil || held == nil {
		t.Fatalf("TryAcquire: %v, %v", held, err)
	}
	if ids, err := reaper.RunOnce(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("reaped %v (%v) while another agent held the lease", ids, err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}

	ids, err := reaper.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[uuid.UUID]bool{}
	for _, id := range ids {
		got[id] = true
	}
	if len(ids) != 2 || !got[stale] || !got[zombie] {
		t.Fatalf("reaped %v, want exactly the stale %s and the zombie %s", ids, stale, zombie)
	}
	if reaper.Reaped() != 2 {
		t.Fatalf("Reaped() = %d, want 2", reaper.Reaped())
	}
	// The round prunes the history past its retention (the default, a week), and keeps
	// the rest: the reaps it just recorded among them.
	// Rows written eight days ago come first by id (the pruning counts on ids following
	// time: it reads the oldest first).
	db.Exec(t, `INSERT INTO liveness.history (id, at, kind, lease_name) OVERRIDING SYSTEM VALUE
		SELECT -g, now() - interval '8 days', 'acquired', 'old' FROM generate_series(1, 3) g`)
	if _, err := reaper.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := db.QueryInt(t, `SELECT count(*) FROM liveness.history WHERE lease_name = 'old'`); n != 0 || reaper.pruned.Load() != 3 {
		t.Fatalf("%d history rows past the retention left, %d pruned; want none left, 3 pruned", n, reaper.pruned.Load())
	}
	if n := db.QueryInt(t, `SELECT count(*) FROM liveness.history WHERE kind = 'reaped'`); n != 2 {
		t.Fatalf("%d reaps in the history; want the 2 reaped instances'", n)
	}
}

func TestReaperConfigErrors(t *testing.T) {
	t.Parallel()
	_, pool := testdb.MigratedPool(t, 4)
	leases, _ := NewLeases(LeasesConfig{Pool: pool})
	base := reaperConfig{Pool: pool, Leases: leases, Interval: time.Second, LeaseTTL: time.Minute,
		StaleThreshold: 90 * time.Second, DefinitiveDeadCutoff: 5 * time.Minute}
	if _, err := newReaper(base); err != nil {
		t.Fatalf("the base config is refused: %v", err)
	}
	for field, mutate := range map[string]func(*reaperConfig){
		"reaperConfig.Pool":                 func(c *reaperConfig) { c.Pool = nil },
		"reaperConfig.Leases":               func(c *reaperConfig) { c.Leases = nil },
		"reaperConfig.Interval":             func(c *reaperConfig) { c.Interval = 0 },
		"reaperConfig.LeaseTTL":             func(c *reaperConfig) { c.LeaseTTL = 3 * time.Nanosecond },
		"reaperConfig.DefinitiveDeadCutoff": func(c *reaperConfig) { c.DefinitiveDeadCutoff = c.StaleThreshold },
		"reaperConfig.StaleThreshold":       func(c *reaperConfig) { c.StaleThreshold = 0 },
		"reaperConfig.HistoryRetention":     func(c *reaperConfig) { c.HistoryRetention = time.Second },
	} {
		cfg := base
		mutate(&cfg)
		if _, err := newReaper(cfg); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("want error naming %s, got %v", field, err)
		}
	}
	// The empty config is refused for its first missing field, as a *ConfigError.
	var ce *ConfigError
	if _, err := newReaper(reaperConfig{}); !errors.As(err, &ce) || ce.Field != "reaperConfig.Pool" {
		t.Errorf("empty config: error %v, want a *ConfigError for ReaperConfig.Pool", err)
	}
}
