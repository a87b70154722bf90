package liveness

// The cost of a fenced write, against BenchmarkSelect1 (lease_bench_test.go) and the same
// write unfenced, serially on one connection. Report them as ratios from the same run.
// Each also reports server-us/op: the CPU time of the server's backend per write (from
// /proc: the test server runs on this machine), the server time that round trips and the
// client's own time leave out.

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	benchInsert = `INSERT INTO bench_writes (epoch) VALUES ($1)`
	// benchUpdate is a write of more usual weight: one row of 100,000, found by its key,
	// updated in two indexed columns.
	benchUpdate   = `UPDATE bench_accounts SET balance = balance + 1, updated_at = now() WHERE id = $1`
	benchAccounts = `CREATE TABLE bench_accounts (id bigint PRIMARY KEY, owner text NOT NULL, balance numeric NOT NULL,
		note text, updated_at timestamptz NOT NULL);
	CREATE INDEX ON bench_accounts (owner, updated_at);
	INSERT INTO bench_accounts SELECT g, 'owner-' || g % 1000, g, repeat('x', 100), now() FROM generate_series(1, 100000) g;
	ANALYZE bench_accounts`
)

// backendCPU is the CPU time the server process pid has used: utime and stime of
// /proc/pid/stat, in clock ticks of 10 ms.
func backendCPU(b *testing.B, pid uint32) time.Duration {
	b.Helper()
	raw, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/stat")
	if err != nil {
		b.Fatalf("the server's CPU time (the benchmark's server runs on this machine): %v", err)
	}
	stat := string(raw)
	fields := strings.Fields(stat[strings.LastIndexByte(stat, ')')+1:]) // after the command's name
	var ticks int64
	for _, f := range fields[11:13] { // utime, stime
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			b.Fatalf("/proc/%d/stat: %v", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

func benchFenced(b *testing.B) (context.Context, *pgxpool.Pool, *Lease) {
	b.Helper()
	ctx, pool, l := benchLeases(b, 1)
	if _, err := pool.Exec(ctx, `CREATE TABLE bench_writes (id bigserial PRIMARY KEY, epoch bigint NOT NULL); `+benchAccounts); err != nil {
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
//   - exec: Lease.Exec, one round trip (the fence and the insert, one implicit
//     transaction) and the check at commit.
//   - tx: pgx.BeginFunc with the insert, three round trips.
//   - tx+fence: the same with Lease.Fence first, four.
//   - begin-func: Lease.BeginFunc with the insert, four.
//   - update/autocommit and update/exec: benchUpdate alone and under Lease.Exec.
func BenchmarkFencedWrite(b *testing.B) {
	var key int64 // the next account benchUpdate updates
	nextKey := func() int64 { key = key%100000 + 1; return key }
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
		{"update/autocommit", func(ctx context.Context, pool *pgxpool.Pool, le *Lease) error {
			_, err := pool.Exec(ctx, benchUpdate, nextKey())
			return err
		}},
		{"update/exec", func(ctx context.Context, pool *pgxpool.Pool, le *Lease) error {
			_, err := le.Exec(ctx, pool, benchUpdate, nextKey())
			return err
		}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			ctx, pool, le := benchFenced(b)
			var pid uint32 // the pool's one connection's server process
			if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				b.Fatal(err)
			}
			for range 100 { // warm the statement caches
				if err := c.write(ctx, pool, le); err != nil {
					b.Fatal(err)
				}
			}
			cpu := backendCPU(b, pid)
			b.ResetTimer()
			for b.Loop() {
				if err := c.write(ctx, pool, le); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((backendCPU(b, pid)-cpu).Microseconds())/float64(b.N), "server-us/op")
		})
	}
}
