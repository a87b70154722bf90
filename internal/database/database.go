// Package database opens the exporter's connection pool and applies migrations in the
// background. It never connects eagerly: an unreachable database must not stop the
// exporter from serving.
package database

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/dsn"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// PoolConfig is what the pool needs.
type PoolConfig struct {
	DSN             string
	MaxConns        int32
	ApplicationName string        // unless the DSN sets one
	ConnectTimeout  time.Duration // per connection attempt, unless the DSN sets one
}

// NewPool builds a pool for short statements. Errors carry no password.
func NewPool(cfg PoolConfig) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, dsn.RedactError(err)
	}
	if cfg.MaxConns < 1 {
		return nil, fmt.Errorf("--db.max-conns must be at least 1, got %d", cfg.MaxConns)
	}
	pc.MaxConns = cfg.MaxConns
	pc.MinConns = 0
	if _, ok := pc.ConnConfig.RuntimeParams["application_name"]; !ok && cfg.ApplicationName != "" {
		pc.ConnConfig.RuntimeParams["application_name"] = cfg.ApplicationName
	}
	if pc.ConnConfig.ConnectTimeout == 0 {
		pc.ConnConfig.ConnectTimeout = cfg.ConnectTimeout
	}
	// Keep the client side of pool connections from hanging on a dead peer.
	pc.ConnConfig.DialFunc = (&net.Dialer{KeepAlive: 15 * time.Second, Timeout: pc.ConnConfig.ConnectTimeout}).DialContext
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, dsn.RedactError(err)
	}
	return pool, nil
}

// ApplyMigrations applies the migrations, retrying with backoff and jitter while the
// database is unreachable or failing. It returns nil once the schema is current, the
// context's error when it ends first, and at once for a database newer than this binary.
func ApplyMigrations(ctx context.Context, pool *pgxpool.Pool, schema string, logger *slog.Logger) error {
	backoff := 500 * time.Millisecond
	for {
		attempt, cancel := context.WithTimeout(ctx, 60*time.Second)
		applied, err := migrations.Apply(attempt, pool, schema)
		cancel()
		if err == nil {
			if len(applied) > 0 {
				logger.Info("applied migrations", "schema", schema, "versions", applied)
			} else {
				logger.Debug("migrations are current", "schema", schema, "version", migrations.Latest())
			}
			return nil
		}
		if errors.Is(err, migrations.ErrDatabaseNewer) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		logger.Warn("cannot apply migrations yet; retrying", "err", dsn.RedactError(err), "retry_in", backoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff + rand.N(backoff/2)):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}
