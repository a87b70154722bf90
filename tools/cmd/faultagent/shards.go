package main

import (
	"context"
	"errors"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// ownShards takes part in --shards.set until ctx ends: each shard it owns writes to the
// fencing log every --lease.write-every under the shard's fence (Shard.Exec), and its
// ownership is told as events: shard_owned and shard_released, with the shard's lease
// name and epoch.
func (in *instance) ownShards(ctx context.Context) {
	err := in.parts.agent.Shards(ctx, liveness.ShardsConfig{Set: in.c.shardSet, Count: in.c.shardCount,
		OnStartedOwning: func(sctx context.Context, shard liveness.Shard) {
			emit("shard_owned", in.id, "lease", shard.Lease, "epoch", shard.Epoch)
			defer emit("shard_released", in.id, "lease", shard.Lease, "epoch", shard.Epoch, "cause", causeOf(sctx))
			t := time.NewTicker(in.c.writeEvery)
			defer t.Stop()
			for {
				wctx, cancel := context.WithTimeout(sctx, 5*time.Second)
				_, err := shard.Exec(wctx, in.pool, in.txInsert, shard.Lease, shard.Epoch, in.id.String())
				cancel()
				if errors.Is(err, liveness.ErrLeaseLost) {
					emit("fence_refused", in.id, "lease", shard.Lease, "epoch", shard.Epoch)
					return
				}
				select {
				case <-sctx.Done():
					return
				case <-t.C:
				}
			}
		}})
	if err != nil && ctx.Err() == nil {
		emit("shards_stopped", in.id, "cause", err.Error())
	}
}

// causeOf names why a context ended, for the events; "" while it has not.
func causeOf(ctx context.Context) string {
	if err := context.Cause(ctx); err != nil {
		return err.Error()
	}
	return ""
}
