package faults

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

// failoverAgents is how many instances follow the primary to its replica.
const failoverAgents = 5

// TestPrimaryFailover stops the primary under agents with a multi-host DSN and promotes
// its streaming replica. Advisory locks do not replicate: every agent must claim its lock
// again on the new primary, bounded from the promotion. Once the new primary answers,
// nothing may call them dead.
func TestPrimaryFailover(t *testing.T) {
	sc := newScenario(t, 11, "Primary failover (stop the primary, promote the replica)",
		fmt.Sprintf("default agent flags; %d instances; DSN host=primary,replica target_session_attrs=read-write", failoverAgents))
	const window = 60 * time.Second
	for range trials() {
		t.Run("trial", func(t *testing.T) {
			primary := pgtest.NewServer(t, pgtest.WithSetting("synchronous_commit", "on"))
			db := pgtest.NewDBOn(t, primary)
			prepare(t, db.DSN)
			replica, err := pgtest.StartReplica(primary)
			if err != nil {
				t.Fatalf("replica: %v", err)
			}
			t.Cleanup(replica.Close)
			dsn := fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=%s password=%s dbname=%s sslmode=disable target_session_attrs=read-write connect_timeout=2",
				primary.Port, replica.Port, pgtest.Superuser, primary.Password, db.Name)
			e := &env{srv: primary, db: db, dsn: dsn}
			s, fleet := startWatchedAgent(t, e, agentOpts{service: "failover", instances: failoverAgents})
			waitHealthy(t, s, fleet, true)

			t0 := time.Now()
			primary.Stop()
			ctx, cancel := context.WithTimeout(context.Background(), window)
			defer cancel()
			if err := replica.Promote(ctx); err != nil {
				t.Fatalf("promote: %v", err)
			}
			promoted := time.Now()
			sc.observeRelock(s, fleet, "every lock held on the new primary", "the promotion", window, t0, promoted)
			sc.watchFalseDead(s, promoted, falseDeadWatch, fleet)
		})
	}
	sc.bound("every lock held on the new primary, from the promotion", 0, relockBound)
	sc.s.Trials = trials()
	sc.note("Each trial builds a new primary and replica (pg_basebackup). False-dead verdicts are counted on the new primary from its promotion until %s after every lock is held there.", falseDeadWatch)
	sc.note("The lock is bounded from the promotion at the alive lock's reconnect backoff ceiling (10 s) plus a second.")
}
