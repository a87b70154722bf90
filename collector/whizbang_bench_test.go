package collector

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/benchdata"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/latency"
)

// BenchmarkWhizbangInstancesCost runs the instances collector's statement for our schema
// and for a Whizbang source alternately, on the same database: the budget's data set,
// with its 10,000 instances copied into a Whizbang table and the same 1,500 of them
// holding Whizbang's alive lock on 50 sessions of their own. It reports both medians and
// their ratio (whizbang / ours). Each iteration is one pair.
func BenchmarkWhizbangInstancesCost(b *testing.B) {
	dsn := benchdata.Build(b)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	setup := exporterPool(b, dsn, 2, nil)
	if _, err := setup.Exec(ctx, `CREATE TABLE public.wh_service_instances AS
		SELECT instance_id, service_name, coalesce(host_name, 'h') AS host_name, coalesce(process_id, 1) AS process_id,
		       started_at, last_heartbeat_at, metadata FROM liveness.instances;
		ALTER TABLE public.wh_service_instances ADD PRIMARY KEY (instance_id)`); err != nil {
		b.Fatal(err)
	}
	// The instances whose our alive lock is held hold Whizbang's too, 30 to a session.
	rows, err := setup.Query(ctx, `SELECT instance_id::text FROM liveness.instance_states() WHERE lock_held`)
	if err != nil {
		b.Fatal(err)
	}
	held, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		b.Fatal(err)
	}
	for chunk := range slices.Chunk(held, 30) {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, `SELECT pg_advisory_lock(hashtext('wh_instance_alive:' || id)) FROM unnest($1::text[]) id`, chunk); err != nil {
			b.Fatal(err)
		}
	}
	pool := exporterPool(b, dsn, 2, nil)
	ours := store.Instances.For(nil)
	whSource, err := store.NewSource(store.SourceConfig{Kind: store.SourceWhizbang})
	if err != nil {
		b.Fatal(err)
	}
	wh := store.Instances.For(whSource)
	run := func(q store.Query) func() time.Duration {
		return func() time.Duration {
			d, n := timeQuery(b, pool, q.SQL, q.Args(100)...)
			if n < benchdata.Services {
				b.Fatalf("%d rows", n)
			}
			return d
		}
	}
	latency.SideBySide(b, "ours", run(ours), "whizbang", run(wh))
}
