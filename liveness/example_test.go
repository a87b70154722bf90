package liveness_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/liveness"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// open connects the service's pool and applies the migrations. In a service the pool may
// go through PgBouncer, while the agent's direct DSN must reach PostgreSQL itself; here
// both are DATABASE_URL.
func open(ctx context.Context) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return nil, err
	}
	if _, err := migrations.Apply(ctx, pool, migrations.DefaultSchema); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// withPool runs an example's body with a context of a minute and the service's pool
// (open), and prints the error the body returns. In a service both are the service's
// own: the context ends on SIGTERM.
func withPool(body func(ctx context.Context, pool *pgxpool.Pool) error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := open(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if err := body(ctx, pool); err != nil {
		fmt.Println(err)
	}
}

// ExampleAgent takes part in the fleet: one Agent holds the alive lock, beats and
// (optionally) reaps dead instances. Zero timings take the defaults. Run returns after
// the clean-up: the row deleted and the lock's session closed, so the others see the
// instance gone at once.
func ExampleAgent() {
	withPool(func(ctx context.Context, pool *pgxpool.Pool) error {
		agent, err := liveness.NewAgent(liveness.AgentConfig{
			Pool: pool, DirectDSN: os.Getenv("DATABASE_URL"),
			InstanceID: uuid.New(), ServiceName: "billing", Reaper: true,
		})
		if err != nil {
			return err
		}
		runCtx, stop := context.WithCancel(ctx) // in a service: the SIGTERM context
		done := make(chan error, 1)
		go func() { done <- agent.Run(runCtx) }()

		// Wait for the lock and the first beat, no longer than ctx allows.
		poll := time.NewTicker(10 * time.Millisecond)
		defer poll.Stop()
		for !agent.Snapshot().AliveLock.Held || agent.Snapshot().Heartbeat.Beats == 0 {
			select {
			case err := <-done:
				stop()
				return fmt.Errorf("the agent stopped before it was alive: %w", err)
			case <-ctx.Done():
				stop()
				<-done
				return fmt.Errorf("not alive in time: %w", ctx.Err())
			case <-poll.C:
			}
		}
		fmt.Println("holds its alive lock")
		stop()
		fmt.Println("stopped:", <-done)
		return nil
	})
	// Output:
	// holds its alive lock
	// stopped: <nil>
}

// ExampleAgent_Elect runs a singleton job on one instance at a time. The callback runs
// while this instance leads; its context ends when leadership is to end (the campaign
// over, the lease lost, the instance unable to prove life), and the lease is released
// only once it has returned. Its writes are fenced: Exec refuses them, at the fence or
// at COMMIT, once this process may have been told it lost the lease, before another
// process could lead.
func ExampleAgent_Elect() {
	withPool(func(ctx context.Context, pool *pgxpool.Pool) error {
		if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS alert_runs (epoch bigint, at timestamptz DEFAULT now())`); err != nil {
			return err
		}
		agent, err := liveness.NewAgent(liveness.AgentConfig{
			Pool: pool, DirectDSN: os.Getenv("DATABASE_URL"), InstanceID: uuid.New(), ServiceName: "alerts",
		})
		if err != nil {
			return err
		}
		runCtx, stopAgent := context.WithCancel(ctx)
		agentDone := make(chan error, 1)
		go func() { agentDone <- agent.Run(runCtx) }()
		defer func() { stopAgent(); <-agentDone }()

		campaign, endCampaign := context.WithCancel(ctx)
		err = agent.Elect(campaign, liveness.ElectorConfig{
			Lease: "alert-evaluation",
			OnStartedLeading: func(ctx context.Context, self *liveness.Lease) {
				// One fenced statement; self.BeginFunc fences a transaction of several.
				_, err := self.Exec(ctx, pool, `INSERT INTO alert_runs (epoch) VALUES ($1)`, self.Epoch)
				// A refused write is errors.Is(err, liveness.ErrFenced), never 0 rows.
				fmt.Println("leading; fenced write:", err)
				endCampaign() // a real job would work until ctx ends
				<-ctx.Done()
			},
			OnStoppedLeading: func(reason error) {
				// The campaign ended, so the lease was released once the callback returned:
				// the reason is the campaign's context's cause. A lost lease would be
				// errors.Is(reason, liveness.ErrLeaseLost).
				fmt.Println("stopped leading:", reason, errors.Is(reason, liveness.ErrLeaseLost))
			},
		})
		fmt.Println("campaign over:", err)
		return nil
	})
	// Output:
	// leading; fenced write: <nil>
	// stopped leading: context canceled false
	// campaign over: <nil>
}

// ExampleLeases_Run runs one round of a job under a lease, without an Agent: leases
// without an alive lock. Another holder's lease is
// free only once it expires.
func ExampleLeases_Run() {
	withPool(func(ctx context.Context, pool *pgxpool.Pool) error {
		leases, err := liveness.NewLeases(liveness.LeasesConfig{Pool: pool})
		if err != nil {
			return err
		}
		ran, err := leases.Run(ctx, "hourly-cleanup", 2*time.Minute, func(ctx context.Context, lease *liveness.Lease) error {
			// Held by this process alone until fn returns; released then.
			_, err := leases.TryAcquire(ctx, "hourly-cleanup", 2*time.Minute)
			fmt.Println("a second holder:", errors.Is(err, liveness.ErrLeaseHeld))
			return nil
		})
		fmt.Println("ran:", ran, err)
		return nil
	})
	// Output:
	// a second holder: true
	// ran: true <nil>
}

// ExampleReader asks the one verdict: is an instance alive, which instances of a
// service are, who leads a job. The exporter, is_instance_alive and the reaper read the
// same SQL definition, so they all agree with it.
func ExampleReader() {
	withPool(func(ctx context.Context, pool *pgxpool.Pool) error {
		reader, err := liveness.NewReader(liveness.ReaderConfig{DB: pool})
		if err != nil {
			return err
		}

		// An instance whose process died an hour ago without cleaning up.
		gone := uuid.New()
		if _, err := pool.Exec(ctx, `INSERT INTO liveness.instances (instance_id, service_name, last_heartbeat_at)
			VALUES ($1, 'search', now() - interval '1 hour')`, gone); err != nil {
			return err
		}
		st, err := reader.Instance(ctx, gone)
		fmt.Println(st.State, st.State.Alive(), err)

		_, err = reader.Instance(ctx, uuid.New())
		fmt.Println(errors.Is(err, liveness.ErrInstanceNotFound))

		all, err := reader.Instances(ctx, "search")
		fmt.Println(len(all), err)

		_, err = reader.Leader(ctx, "nightly-report")
		fmt.Println(errors.Is(err, liveness.ErrNoLeader))
		return nil
	})
	// Output:
	// stale false <nil>
	// true
	// 1 <nil>
	// true
}

// ExampleReaderConfig_whizbang reads a Whizbang database as it is, read only, by the
// same rule as this package's schema: the role needs only SELECT on Whizbang's table and
// pg_read_all_stats. Zero fields take Whizbang's documented defaults; here its services
// beat more slowly than Whizbang's default, so they are stale later. (It is not run: it
// needs a Whizbang database.)
func ExampleReaderConfig_whizbang() {
	ctx := context.Background()
	observer, err := pgxpool.New(ctx, os.Getenv("WHIZBANG_DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer observer.Close()
	reader, err := liveness.NewReader(liveness.ReaderConfig{DB: observer, Whizbang: &liveness.WhizbangSource{
		Prefix: "wh_", // the default: public.wh_service_instances
		Timing: liveness.Timing{HeartbeatInterval: time.Minute, HeartbeatSlowInterval: 2 * time.Minute,
			StaleThreshold: 3 * time.Minute, DefinitiveDeadCutoff: 10 * time.Minute},
	}})
	if err != nil {
		fmt.Println(err) // a *liveness.ConfigError naming the field: ReaderConfig.Whizbang.Timing.StaleThreshold
		return
	}
	orders, err := reader.Instances(ctx, "orders")
	fmt.Println(len(orders), err)
	_, err = reader.Leader(ctx, "nightly-report")
	fmt.Println(errors.Is(err, liveness.ErrNoLeases)) // Whizbang has no leases
}

// ExampleAgent_WatchAlive shards work over the alive instances of a service: fn gets the
// whole alive set at the start and after every change (an instance joined, stopped, or
// died by the verdict), woken by the schema's notifications and polled as a fallback.
func ExampleAgent_WatchAlive() {
	withPool(func(ctx context.Context, pool *pgxpool.Pool) error {
		newAgent := func() (*liveness.Agent, error) {
			return liveness.NewAgent(liveness.AgentConfig{
				Pool: pool, DirectDSN: os.Getenv("DATABASE_URL"), InstanceID: uuid.New(), ServiceName: "shards",
			})
		}
		self, err := newAgent()
		if err != nil {
			return err
		}
		runCtx, stop := context.WithCancel(ctx) // in a service: the SIGTERM context
		defer stop()
		go func() { _ = self.Run(runCtx) }()

		sizes := make(chan int, 8)
		go func() {
			_ = self.WatchAlive(runCtx, "shards", 0, func(alive []liveness.InstanceStatus) {
				sizes <- len(alive) // in a service: take the shards that hash to this instance
			})
		}()
		next := func() int {
			for {
				select {
				case n := <-sizes:
					if n > 0 {
						return n
					}
					// 0: the watch began before this agent's first beat.
				case <-ctx.Done():
					return -1
				}
			}
		}
		fmt.Println("alive:", next())

		other, err := newAgent()
		if err != nil {
			return err
		}
		otherCtx, stopOther := context.WithCancel(ctx)
		otherDone := make(chan error, 1)
		go func() { otherDone <- other.Run(otherCtx) }()
		fmt.Println("alive:", next())
		stopOther()
		<-otherDone
		fmt.Println("alive:", next())
		return nil
	})
	// Output:
	// alive: 1
	// alive: 2
	// alive: 1
}
