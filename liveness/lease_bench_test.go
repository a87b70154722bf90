package liveness

// Report the lease figures as ratios against BenchmarkSelect1 from the same run.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

func benchLeases(b *testing.B, maxConns int32) (context.Context, *pgxpool.Pool, *Leases) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	b.Cleanup(cancel)
	pool := pgtest.NewDB(b).Pool(b, maxConns)
	if _, err := migrations.Apply(ctx, pool, defaults.Schema); err != nil {
		b.Fatal(err)
	}
	l, err := NewLeases(LeasesConfig{Pool: pool})
	if err != nil {
		b.Fatal(err)
	}
	return ctx, pool, l
}

// BenchmarkSelect1 is the baseline: one pool round trip, serially and from 8 and 32
// goroutines at once (for the contention ratios).
func BenchmarkSelect1(b *testing.B) {
	for _, n := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("goroutines=%d", n), func(b *testing.B) {
			ctx, pool, _ := benchLeases(b, int32(n))
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for range n {
				wg.Go(func() {
					var one int
					for next.Add(1) <= int64(b.N) {
						if err := pool.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
		})
	}
}

// BenchmarkLeaseAcquireRelease: TryAcquire of a free lease plus its Release (two
// statements, a renewer goroutine and a timer).
func BenchmarkLeaseAcquireRelease(b *testing.B) {
	ctx, _, l := benchLeases(b, 1)
	b.ResetTimer()
	for b.Loop() {
		le, err := l.TryAcquire(ctx, "bench", time.Minute)
		if err != nil || le == nil {
			b.Fatalf("TryAcquire = %v, %v", le, err)
		}
		if err := le.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLeaseRenew: the renewal statement of a held lease, as its renewer sends it
// every ttl/4 (the renewer's own bookkeeping, a timer reset under a mutex, is left out).
func BenchmarkLeaseRenew(b *testing.B) {
	ctx, pool, l := benchLeases(b, 1)
	le, err := l.TryAcquire(ctx, "bench", time.Hour) // the renewer's own tick is 15 min away
	if err != nil || le == nil {
		b.Fatalf("TryAcquire = %v, %v", le, err)
	}
	defer func() { _ = le.Release(ctx) }()
	renew := store.LeaseRenew.In(defaults.Schema).SQL
	b.ResetTimer()
	for b.Loop() {
		var expiresAt time.Time
		if err := pool.QueryRow(ctx, renew, le.Name, le.Holder, le.Epoch, time.Hour.Seconds()).Scan(&expiresAt); err != nil {
			b.Fatalf("renewal failed: %v", err)
		}
	}
}

// BenchmarkLeaseContention: n contenders (each with a connection of its own, like n
// processes) try to take one name and release it at once when they win. ns/op is per
// attempt; rounds/s counts the attempts that won.
func BenchmarkLeaseContention(b *testing.B) {
	for _, n := range []int{8, 32} {
		b.Run(fmt.Sprintf("contenders=%d", n), func(b *testing.B) {
			ctx, _, l := benchLeases(b, int32(n))
			var next, won atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for range n {
				wg.Go(func() {
					for next.Add(1) <= int64(b.N) {
						le, err := l.TryAcquire(ctx, "bench", time.Minute)
						if errors.Is(err, ErrLeaseHeld) {
							continue
						}
						if err != nil {
							b.Error(err)
							return
						}
						won.Add(1)
						if err := le.Release(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(won.Load())/b.Elapsed().Seconds(), "rounds/s")
			b.ReportMetric(float64(won.Load())/float64(b.N), "won/op")
		})
	}
}
