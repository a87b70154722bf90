package liveness_test

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/liveness"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// Example_service embeds the package in a Go service: the alive lock on a direct DSN, the
// heartbeat on the service's pool with the lock as its source, and a singleton job under
// a lease. It needs a database, so it is compiled but not run; the package's tests run
// the same parts against a real server.
func Example_service() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.Default()

	// The pool may go through PgBouncer; the direct DSN must reach PostgreSQL itself.
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		logger.Error("open pool", "err", err)
		return
	}
	defer pool.Close()
	setup, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = migrations.Apply(setup, pool, liveness.DefaultSchema)
	cancel()
	if err != nil {
		logger.Error("apply migrations", "err", err)
		return
	}

	id := uuid.New()
	lock, err := liveness.NewAliveLock(liveness.AliveLockConfig{
		DSN:         os.Getenv("DATABASE_DIRECT_URL"),
		InstanceID:  id,
		ServiceName: "billing",
		Logger:      logger,
	})
	if err != nil {
		logger.Error("alive lock", "err", err)
		return
	}
	heartbeat, err := liveness.NewHeartbeatWorker(liveness.HeartbeatConfig{
		Pool:           pool,
		InstanceID:     id,
		ServiceName:    "billing",
		Interval:       liveness.DefaultHeartbeatInterval,
		SlowInterval:   liveness.DefaultHeartbeatSlowInterval,
		StaleThreshold: liveness.DefaultStaleThreshold,
		Lock:           lock, // without it the heartbeat never slows down
		Metadata:       map[string]any{"version": "1.4.2"},
		Logger:         logger,
	})
	if err != nil {
		logger.Error("heartbeat", "err", err)
		return
	}
	leases, err := liveness.NewLeases(liveness.LeasesConfig{Pool: pool, Logger: logger})
	if err != nil {
		logger.Error("leases", "err", err)
		return
	}

	// The lock outlives the heartbeat, so that the row is deleted while the lock holds.
	lockCtx, stopLock := context.WithCancel(context.WithoutCancel(ctx))
	var lockDone, work sync.WaitGroup
	lockDone.Go(func() { _ = lock.Run(lockCtx) })
	work.Go(func() { _ = heartbeat.Run(ctx) })
	work.Go(func() {
		for ctx.Err() == nil {
			// One instance at a time runs the cleanup; the others skip the round.
			_, err := leases.Run(ctx, "cleanup", 2*time.Minute, func(ctx context.Context, lease *liveness.Lease) error {
				return cleanup(ctx, pool, lease)
			})
			if err != nil {
				logger.Warn("cleanup round", "err", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Minute):
			}
		}
	})

	<-ctx.Done()
	work.Wait() // Run returns, and a running lease is released, when ctx ends
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := heartbeat.Remove(shutdown); err != nil {
		logger.Warn("remove instance row", "err", err)
	}
	stopLock()
	lockDone.Wait()
}

// cleanup is the service's singleton job; it fences its writes with the lease's epoch.
func cleanup(ctx context.Context, pool *pgxpool.Pool, lease *liveness.Lease) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := pool.Exec(ctx, `DELETE FROM sessions
	                           WHERE expires_at < now() AND liveness.lease_is_held($1, $2)`, lease.Name, lease.Epoch)
	return err
}
