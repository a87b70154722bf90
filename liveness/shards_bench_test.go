package liveness_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/benchdata"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// BenchmarkShardMemberStatements is what a member of a shard set costs the database at
// 64 and 1,024 shards over four members: the statements its pool sends a second once
// the shards are spread (15 s measured), in all and by tag (statements/s/member/<tag>).
// The alive lock's proofs (four a second while it owns anything, on its own session) are
// not the pool's and are the same at any number of shards.
func BenchmarkShardMemberStatements(b *testing.B) {
	counts := []int{64, 1024}
	if benchdata.Small() {
		counts = []int{16}
	}
	for _, shards := range counts {
		b.Run(fmt.Sprintf("shards=%d", shards), func(b *testing.B) {
			for range b.N {
				benchmarkShardMember(b, shards)
			}
		})
	}
}

func benchmarkShardMember(b *testing.B, shards int) {
	quiet, measured := 5*time.Second, 15*time.Second
	if benchdata.Small() {
		quiet, measured = time.Second, time.Second
	}
	db, _ := testdb.MigratedPool(b, 2)
	own := &ownership{owner: map[string]uuid.UUID{}}
	counters := make([]*statementCounter, 4)
	var stops []context.CancelFunc
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	for i := range counters {
		var pool *pgxpool.Pool
		pool, counters[i] = countingPool(b, db.DSN, 4)
		a := newAgent(b, liveness.AgentConfig{Pool: pool, DirectDSN: db.DSN, InstanceID: uuid.New(), ServiceName: "bench"})
		runAgent(b, a)
		id := a.Snapshot().InstanceID
		ctx, stop := context.WithCancel(context.Background())
		stops = append(stops, stop)
		go func() {
			_ = a.Shards(ctx, liveness.ShardsConfig{Set: "bench", Count: shards, OnStartedOwning: func(ctx context.Context, s liveness.Shard) {
				own.start(s.Name, id)
				defer own.stop(s.Name, id)
				<-ctx.Done()
			}})
		}()
	}
	testutil.Eventually(b, 5*time.Minute, "every shard owned", func() bool {
		by, owned := own.byOwner()
		return owned == shards && len(by) == len(counters)
	})
	// The moves of the start settle: no member tries a shard for 5 s.
	tries := func() (n int) {
		for _, c := range counters {
			for tag, v := range c.snapshot() {
				if strings.HasPrefix(tag, "lease_acquire:bench/") {
					n += v
				}
			}
		}
		return n
	}
	last, quietSince := tries(), time.Now()
	testutil.Eventually(b, 5*time.Minute, "no shard tried for a while", func() bool {
		if n := tries(); n != last {
			last, quietSince = n, time.Now()
		}
		return time.Since(quietSince) >= quiet
	})
	before := make([]map[string]int, len(counters))
	for i, c := range counters {
		before[i] = c.snapshot()
	}
	time.Sleep(measured)
	total, byTag := 0.0, map[string]float64{}
	for i, c := range counters {
		for key, n := range c.snapshot() {
			d := float64(n - before[i][key])
			tag, _, _ := strings.Cut(key, ":") // the tag, whatever lease
			byTag[tag] += d / measured.Seconds() / float64(len(counters))
			total += d
		}
	}
	b.ReportMetric(total/measured.Seconds()/float64(len(counters)), "statements/s/member")
	for tag, rate := range byTag {
		b.ReportMetric(rate, "statements/s/member/"+tag)
	}
}

// snapshot copies the counts, by tag and lease.
func (c *statementCounter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}
