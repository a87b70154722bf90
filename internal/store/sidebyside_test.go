package store_test

import (
	"flag"
	"os"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/whizbangtest"
)

// update rewrites the generated files the tests check: scripts/whizbang-side-by-side.sql
// and internal/store/schema.sql (on its major).
var update = flag.Bool("update", false, "rewrite the generated files: scripts/whizbang-side-by-side.sql and internal/store/schema.sql")

const scriptPath = "../../scripts/whizbang-side-by-side.sql"

func TestSideBySideScriptIsUpToDate(t *testing.T) {
	src, err := store.NewSource(store.SourceConfig{Kind: store.SourceWhizbang})
	if err != nil {
		t.Fatal(err)
	}
	want, err := src.SideBySideScript(store.DefaultSchema)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(scriptPath, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(scriptPath)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s is stale: run go test ./store -run SideBySideScriptIsUpToDate -update", scriptPath)
	}
}

// During the move both fleets are readable: is_fleet_instance_alive answers for an
// instance of either, and whizbang_instance_states judges Whizbang's rows exactly as the
// exporter's Whizbang source does.
func TestSideBySideScript(t *testing.T) {
	db, admin := testdb.MigratedPool(t, 2)
	f := whizbangtest.NewFixture(t, db)
	script, err := os.ReadFile(scriptPath)
	if err != nil {
		t.Fatal(err)
	}
	db.Exec(t, string(script))

	whAlive, whStale, whGone := uuid.New(), uuid.New(), uuid.New()
	f.Register(t, whAlive, "orders", time.Second)
	f.Register(t, whStale, "orders", f.Source.Timing.StaleThreshold+time.Second)
	if !f.Claim(t, whAlive) {
		t.Fatal("claim failed")
	}
	ours, oursDead := uuid.New(), uuid.New()
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, last_heartbeat_at)
		VALUES ($1, 'orders', now()), ($2, 'orders', now() - interval '1 hour')`, ours, oursDead)

	for id, want := range map[uuid.UUID]bool{whAlive: true, whStale: false, whGone: false, ours: true, oursDead: false} {
		var alive bool
		if err := admin.QueryRow(testutil.Context(t, 30*time.Second), `SELECT liveness.is_fleet_instance_alive($1)`, id).Scan(&alive); err != nil {
			t.Fatal(err)
		}
		if alive != want {
			t.Errorf("is_fleet_instance_alive(%s) = %v, want %v", id, alive, want)
		}
	}
	var liv, wh int
	if err := admin.QueryRow(testutil.Context(t, 30*time.Second), `SELECT count(*) FILTER (WHERE source = 'liveness'), count(*) FILTER (WHERE source = 'whizbang')
		FROM liveness.fleet_instance_states()`).Scan(&liv, &wh); err != nil {
		t.Fatal(err)
	}
	if liv != 2 || wh != 2 {
		t.Errorf("fleet_instance_states: %d of ours and %d of Whizbang's, want 2 and 2", liv, wh)
	}
	fromSource := verdicts(f, t)
	rows, err := admin.Query(testutil.Context(t, 30*time.Second), `SELECT instance_id, state FROM liveness.whizbang_instance_states()`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id uuid.UUID
		var state string
		if err := rows.Scan(&id, &state); err != nil {
			t.Fatal(err)
		}
		if fromSource[id].State != state {
			t.Errorf("%s: whizbang_instance_states says %s, the exporter's source %s", id, state, fromSource[id].State)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}
