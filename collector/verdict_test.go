package collector

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// TestOneVerdict walks one instance through every state and asserts that every consumer
// of the verdict agrees at every step: the exporter's pg_liveness_instances, both forms
// of is_instance_alive, the reaper's cleanup_stale_instances (run in a transaction that
// is rolled back) and the Go reader. The instance's session and row are driven by hand,
// so each step is exact; the timing is the row's own, not the observers' defaults.
func TestOneVerdict(t *testing.T) {
	db := testdb.Migrated(t)
	pool := exporterPool(t, db.DSN, 2, nil)
	cfg := DefaultConfig()
	exp := newExporter(t, cfg, pool, nil, discard())
	reader, err := liveness.NewReader(liveness.ReaderConfig{DB: pool})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t, 2*time.Minute)
	id := uuid.New()
	admin := db.ConnAs(t, "walker")

	// The instance's own timing: stale after 20 s, definitive-dead after 60 s, 2 s grace.
	// The observers' defaults (90 s / 5 min) would give other answers at several steps.
	exec(t, admin, `INSERT INTO liveness.instances (instance_id, service_name, stale_threshold,
	                    definitive_dead_cutoff, lock_grace, holds_alive_lock)
	                 VALUES ($1, 'walk', interval '20 seconds', interval '60 seconds', interval '2 seconds', true)`, id)
	var session *pgx.Conn
	claim := func() {
		session = db.ConnAs(t, "walk:alive-lock")
		var ok bool
		if err := session.QueryRow(ctx, `SELECT liveness.claim_instance_alive_lock($1)`, id).Scan(&ok); err != nil || !ok {
			t.Fatalf("claim: %v %v", ok, err)
		}
	}
	endSession := func() {
		if err := session.Close(ctx); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 10*time.Second, "the closed session's lock to go", func() bool {
			return db.QueryInt(t, `SELECT count(*) FROM liveness.instance_alive_locks WHERE instance_id = $1`, id) == 0
		})
	}
	beatAged := func(ageSeconds int, holds bool) {
		exec(t, admin, `UPDATE liveness.instances SET last_heartbeat_at = now() - make_interval(secs => $2),
		                    holds_alive_lock = $3 WHERE instance_id = $1`, id, ageSeconds, holds)
	}

	steps := []struct {
		name  string
		do    func()
		state string // "" once the row is gone
	}{
		{"alive: lock held, fresh heartbeat", claim, "alive"},
		{"lock lost, proving life within the grace", endSession, "lock_lost"},
		{"proof of life: a beat that says the lock is not held", func() { beatAged(0, false) }, "heartbeat_only"},
		{"stale: no lock, heartbeat past its own 20 s", func() { beatAged(25, false) }, "stale"},
		{"lock held but silent", func() { claim(); beatAged(25, true) }, "lock_only"},
		{"zombie: lock held, heartbeat past its own 60 s", func() { beatAged(61, true) }, "zombie"},
		{"back to alive", func() { beatAged(0, true) }, "alive"},
		{"lock lost again, first seen now", endSession, "lock_lost"},
		{"no proof of life within the grace", func() {
			exec(t, admin, `UPDATE liveness.alive_lock_absences SET missing_since = now() - interval '3 seconds'
			                 WHERE instance_id = $1`, id)
		}, "stale"},
		{"reaped", func() {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM liveness.cleanup_stale_instances(now() - interval '90 seconds', now() - interval '5 minutes')`).Scan(&n); err != nil || n != 1 {
				t.Fatalf("cleanup deleted %d rows (%v), want 1", n, err)
			}
		}, ""},
		{"registered again and alive", func() {
			exec(t, admin, `INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock) VALUES ($1, 'walk', true)`, id)
			claim()
		}, "alive"},
	}
	for _, st := range steps {
		st.do()
		wantAlive := liveness.InstanceState(st.state).Alive()

		// The exporter first: as an observer it also stamps a vanished lock.
		mfs := scrapeFamilies(t, exp)
		got := ""
		for _, s := range instanceStates {
			switch v := value(mfs, "pg_liveness_instances", "service", "walk", "state", s); v {
			case 0:
			case 1:
				got = s
			default:
				if !(v != v && st.state == "") { // NaN: no series, the service is gone
					t.Fatalf("%s: pg_liveness_instances{state=%q} = %v", st.name, s, v)
				}
			}
		}
		if got != st.state {
			t.Fatalf("%s: the exporter says %q, want %q", st.name, got, st.state)
		}

		for _, sql := range []string{`SELECT liveness.is_instance_alive($1)`, `SELECT liveness.is_instance_alive($1, 90)`} {
			var alive bool
			if err := pool.QueryRow(ctx, sql, id).Scan(&alive); err != nil {
				t.Fatal(err)
			}
			if alive != wantAlive {
				t.Fatalf("%s: %s = %v, want %v", st.name, sql, alive, wantAlive)
			}
		}

		status, err := reader.Instance(ctx, id)
		switch {
		case st.state == "":
			if !errors.Is(err, liveness.ErrInstanceNotFound) {
				t.Fatalf("%s: reader says %+v, %v; want ErrInstanceNotFound", st.name, status, err)
			}
		case err != nil:
			t.Fatalf("%s: reader: %v", st.name, err)
		case string(status.State) != st.state || status.State.Alive() != wantAlive:
			t.Fatalf("%s: reader says %q (alive %v), want %q", st.name, status.State, status.State.Alive(), st.state)
		}

		if st.state != "" {
			if reaped := wouldReap(t, ctx, pool, id); reaped == wantAlive {
				t.Fatalf("%s: the reaper would delete it: %v, want %v", st.name, reaped, !wantAlive)
			}
		}
	}
}

// wouldReap runs the reaper's function with the observer defaults in a transaction that
// is rolled back, and reports whether it deleted id.
func wouldReap(t *testing.T, ctx context.Context, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, id uuid.UUID) bool {
	t.Helper()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var n int
	err = tx.QueryRow(ctx, `SELECT count(*) FROM liveness.cleanup_stale_instances(now() - interval '90 seconds',
	                            now() - interval '5 minutes') AS d(id) WHERE d.id = $1`, id).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// TestExporterAloneStampsVanishedLocks: with no other consumer of the verdict, the
// exporter's own scrapes stamp a vanished lock, so the instance's grace runs out and it
// turns stale; without the stamp it would stay lock_lost for ever.
func TestExporterAloneStampsVanishedLocks(t *testing.T) {
	db := testdb.Migrated(t)
	cfg := DefaultConfig()
	exp := newExporter(t, cfg, exporterPool(t, db.DSN, 2, nil), nil, discard())
	admin := db.ConnAs(t, "walker")
	// The row says it holds its lock, but no session does: the lock has vanished.
	exec(t, admin, `INSERT INTO liveness.instances (instance_id, service_name, lock_grace, holds_alive_lock)
	                 VALUES ($1, 'walk', interval '1 second', true)`, uuid.New())
	if v := value(scrapeFamilies(t, exp), "pg_liveness_instances", "service", "walk", "state", "lock_lost"); v != 1 {
		t.Fatalf("first scrape: %v lock_lost, want 1", v)
	}
	testutil.Eventually(t, 30*time.Second, "the grace to run out by the exporter's own stamp", func() bool {
		return value(scrapeFamilies(t, exp), "pg_liveness_instances", "service", "walk", "state", "stale") == 1
	})
}
