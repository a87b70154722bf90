// Command order-shards is a service that splits its work into shards over its live
// instances with the liveness package (Agent.Shards): each of --shards shards is owned by
// one instance at a time, which processes the shard's orders and writes its results
// fenced by the shard's lease. Run several instances against one PostgreSQL: they share
// the shards, a new instance takes its share from the others (each shard's old owner
// stops before the new one starts), and a crashed instance's shards move within about a
// second, a hung one's once their leases expire.
//
//	DATABASE_URL=postgres://… order-shards --shards=64
//
// DATABASE_URL is the pool's DSN (it may go through PgBouncer); DIRECT_DATABASE_URL, when
// set, is the alive lock's, which must reach PostgreSQL itself; NODE_AGENT_SOCKET, when
// set, holds the lock through the node's agent instead: its unix socket's path, or
// tcp://host:port with the token in the file NODE_AGENT_TOKEN_FILE (in Kubernetes, a
// Secret's). The program imports nothing
// internal to this repository, so it can be copied as it is.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/liveness"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

type config struct {
	dsn, directDSN, nodeAgent string
	nodeAgentToken            string
	name                      string
	shards                    int
	every                     time.Duration
}

func main() {
	host, _ := os.Hostname()
	var c config
	flag.StringVar(&c.name, "name", fmt.Sprintf("%s:%d", host, os.Getpid()), "this instance's name in the results and the logs")
	flag.IntVar(&c.shards, "shards", 64, "the number of shards")
	flag.DurationVar(&c.every, "write-every", 100*time.Millisecond, "pause between two writes of a shard's owner")
	flag.Parse()
	c.dsn = os.Getenv("DATABASE_URL")
	c.directDSN = cmp.Or(os.Getenv("DIRECT_DATABASE_URL"), c.dsn)
	c.nodeAgent = os.Getenv("NODE_AGENT_SOCKET")
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("instance", c.name)
	if c.dsn == "" {
		log.Error("DATABASE_URL is not set")
		os.Exit(2)
	}
	if f := os.Getenv("NODE_AGENT_TOKEN_FILE"); f != "" {
		token, err := os.ReadFile(f)
		if err != nil {
			log.Error("NODE_AGENT_TOKEN_FILE", "err", err)
			os.Exit(2)
		}
		c.nodeAgentToken = strings.TrimSpace(string(token))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, c, log); err != nil {
		log.Error("stopped", "err", err)
		os.Exit(1)
	}
	log.Info("stopped")
}

func run(ctx context.Context, c config, log *slog.Logger) error {
	pool, err := pgxpool.New(ctx, c.dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrations.Apply(ctx, pool, migrations.DefaultSchema); err != nil {
		return err
	}
	if err := createResults(ctx, pool); err != nil {
		return err
	}
	agent, err := liveness.NewAgent(liveness.AgentConfig{
		Pool: pool, DirectDSN: c.directDSN, NodeAgentSocket: c.nodeAgent, NodeAgentToken: c.nodeAgentToken,
		InstanceID:  uuid.New(),
		ServiceName: "order-shards", Metadata: map[string]any{"name": c.name}, Logger: log,
	})
	if err != nil {
		return err
	}
	// One context ends everything on SIGTERM: Shards lets every shard go once its work
	// has returned, and Run keeps the instance alive until then.
	var wg sync.WaitGroup
	var runErr error
	wg.Go(func() { runErr = agent.Run(ctx) })
	wg.Go(func() {
		err := agent.Shards(ctx, liveness.ShardsConfig{Set: "orders", Count: c.shards,
			OnStartedOwning: func(ctx context.Context, shard liveness.Shard) { processShard(ctx, c, pool, shard, log) },
			OnStoppedOwning: func(shard string, reason error) { log.Debug("shard given up", "shard", shard, "reason", reason) },
		})
		if err != nil {
			log.Error("shards ended", "err", err)
		}
	})
	wg.Wait()
	return runErr
}

// processShard is one shard's work, for as long as this instance owns it: a write every
// --write-every, fenced by the shard's lease, so that no write lands once another
// instance may own the shard.
func processShard(ctx context.Context, c config, pool *pgxpool.Pool, shard liveness.Shard, log *slog.Logger) {
	log.Info("owning shard", "shard", shard.Name, "epoch", shard.Epoch)
	for ctx.Err() == nil {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := shard.Exec(wctx, pool, `INSERT INTO order_results (shard, epoch, instance) VALUES ($1, $2, $3)`,
			shard.Name, shard.Epoch, c.name)
		cancel()
		switch {
		case errors.Is(err, liveness.ErrLeaseLost):
			log.Warn("the fence refused a write: this instance no longer owns the shard", "shard", shard.Name, "err", err)
			return
		case err != nil && ctx.Err() == nil:
			log.Warn("write failed", "shard", shard.Name, "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(c.every):
		}
	}
}

// createResults creates the results table once, whichever instance starts first.
func createResults(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('order-shards:results', 0))`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS order_results (
			id         bigserial   PRIMARY KEY,
			shard      text        NOT NULL,
			epoch      bigint      NOT NULL,
			instance   text        NOT NULL,
			written_at timestamptz NOT NULL DEFAULT clock_timestamp())`)
		return err
	})
}
