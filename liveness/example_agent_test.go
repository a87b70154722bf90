package liveness_test

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// ExampleAgent runs the whole participation (alive lock, heartbeat, reaper) in one value
// and asks the database whether the instance is alive while it runs and after it stops.
// In a service, the DSN comes from its configuration; here a throwaway server supplies it.
func ExampleAgent() {
	dsn, err := pgtest.FreshDSN()
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if _, err := migrations.Apply(ctx, pool, liveness.DefaultSchema); err != nil {
		fmt.Println(err)
		return
	}

	id := uuid.New()
	agent, err := liveness.NewAgent(liveness.AgentConfig{
		Pool: pool, DirectDSN: dsn, InstanceID: id, ServiceName: "billing",
		Mode:              liveness.ModeAdvisoryLockWhenAvailable,
		HeartbeatInterval: 30 * time.Second, HeartbeatSlowInterval: 60 * time.Second,
		StaleThreshold: 90 * time.Second, DefinitiveDeadCutoff: 5 * time.Minute,
		Reaper: true, ReaperInterval: 30 * time.Second, ReaperLeaseTTL: 2 * time.Minute,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agent.Run(runCtx) }()

	for !agent.Snapshot().AliveLock.Held {
		time.Sleep(10 * time.Millisecond)
	}
	alive := func() bool {
		var ok bool
		_ = pool.QueryRow(ctx, `SELECT liveness.is_instance_alive($1, 90)`, id).Scan(&ok)
		return ok
	}
	fmt.Println("alive while running:", alive())

	stop() // as on SIGTERM: the row is deleted and the lock's session closed
	if err := <-done; err != nil {
		fmt.Println(err)
	}
	for i := 0; i < 500 && alive(); i++ {
		time.Sleep(20 * time.Millisecond) // the backend exits just after the client hangs up
	}
	fmt.Println("alive after shutdown:", alive())
	// Output:
	// alive while running: true
	// alive after shutdown: false
}
