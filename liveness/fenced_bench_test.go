package liveness

// The cost of a fenced write, against BenchmarkSelect1 (lease_bench_test.go) and the same
// write unfenced, serially on one connection. Report them as ratios from the same run.

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const benchInsert = `INSERT INTO bench_writes (epoch) VALUES ($1)`

func benchFenced(b *testing.B) (context.Context, *pgxpool.Pool, *Lease) {
	b.Helper()
	ctx, pool, l := benchLeases(b, 1)
	if _, err := pool.Exec(ctx, `CREATE TABLE bench_writes (id bigserial PRIMARY KEY, epoch bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	le, err := l.TryAcquire(ctx, "bench", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = le.Release(context.Background()) })
	return ctx, pool, le
}

// BenchmarkFencedWrite: one insert, unfenced and fenced each way.
//
//   - autocommit: the insert alone, one round trip.
//   - hand-written: the insert carrying lease_is_held and the deadline in its WHERE, one
//     round trip, checked when it runs, not at COMMIT.
//   - exec: Lease.Exec, two round trips (BEGIN, fence and insert; the deadline and COMMIT)
//     and the check at commit.
//   - tx: pgx.BeginFunc with the insert, three round trips.
//   - tx+fence: the same with Lease.Fence first, four.
//   - begin-func: Lease.BeginFunc with the insert, four.
func BenchmarkFencedWrite(b *testing.B) {
	cases := []struct {
		name  string
		write func(ctx context.Context, pool *pgxpool.Pool, le *Lease) error
	}{
		{"autocommit", func(ctx context.Context, pool *pgxpool.Pool, le *Lease) error {
			_, err := pool.Exec(ctx, benchInsert, le.Epoch)
			return err
		}},
		{"hand-written", func(ctx context.Context, pool *pgxpool.Pool, le *Lease) error {
			_, err := pool.Exec(ctx, `INSERT INTO bench_writes (epoch) SELECT $1
				WHERE liveness.lease_is_held('bench', $1) AND clock_timestamp() < $2`, le.Epoch, le.FenceDeadline())
			return err
		}},
		{"exec", func(ctx context.Context, pool *pgxpool.Pool, le *Lease) error {
			_, err := le.Exec(ctx, pool, benchInsert, le.Epoch)
			return err
		}},
		{"tx", func(ctx context.Context, pool *pgxpool.Pool, le *Lease) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, benchInsert, le.Epoch)
				return err
			})
		}},
		{"tx+fence", func(ctx context.Context, pool *pgxpool.Pool, le *Lease) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if err := le.Fence(ctx, tx); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, benchInsert, le.Epoch)
				return err
			})
		}},
		{"begin-func", func(ctx context.Context, pool *pgxpool.Pool, le *Lease) error {
			return le.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, benchInsert, le.Epoch)
				return err
			})
		}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			ctx, pool, le := benchFenced(b)
			for range 100 { // warm the statement caches
				if err := c.write(ctx, pool, le); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for b.Loop() {
				if err := c.write(ctx, pool, le); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
