package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
	"github.com/pg-liveness/pg_liveness_exporter/store"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// migrated is a database of its own with every migration applied in the default schema.
func migrated(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.NewDB(t).Pool(t, 2)
	if _, err := migrations.Apply(ctxT(t), pool, store.DefaultSchema); err != nil {
		t.Fatal(err)
	}
	return pool
}
