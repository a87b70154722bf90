package migrations

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

// A database at an older version, with rows and a held alive lock, upgrades in place:
// later migrations see existing data, and the lock still counts afterwards.
func TestUpgradeFromEachVersionKeepsData(t *testing.T) {
	for from := 1; from < Latest(); from++ {
		db := pgtest.NewDB(t)
		pool := db.Pool(t, 2)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		for _, m := range all[:from] {
			if _, err := applyOne(ctx, pool, DefaultSchema, m); err != nil {
				t.Fatal(err)
			}
		}
		id := uuid.New()
		db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name) VALUES ($1, 'svc')`, id)
		holder := db.Conn(t)
		if _, err := holder.Exec(ctx, `SELECT liveness.claim_instance_alive_lock($1)`, id); err != nil {
			t.Fatal(err)
		}
		applied, err := Apply(ctx, pool, DefaultSchema)
		if err != nil {
			t.Fatalf("upgrade from %d: %v", from, err)
		}
		if len(applied) != Latest()-from {
			t.Fatalf("upgrade from %d applied %v", from, applied)
		}
		var locked int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM liveness.instance_alive_locks WHERE instance_id = $1`, id).Scan(&locked); err != nil || locked != 1 {
			t.Fatalf("after upgrade from %d the held lock shows %d times in instance_alive_locks (%v)", from, locked, err)
		}
	}
}
