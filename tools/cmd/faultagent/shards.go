package main

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// ownShards takes part in --shards.set until ctx ends: each shard it owns writes to the
// fencing log every --shards.write-every under the shard's fence (Shard.Exec; with
// --lease.tx-every, every n-th write is a transaction of two inserts, Shard.BeginFunc),
// and its ownership is told as events, each with the shard's lease name and epoch:
// shard_owned, shard_cancelled (the moment its callback's context ended, with the cause,
// and lost: whether the cause is the loss of the shard's own lease), fence_refused (lost:
// whether the refusal says the lease is lost; the callback then returns) and
// shard_released (the callback has returned).
func (in *instance) ownShards(ctx context.Context) {
	every := cmp.Or(in.c.shardWriteEvery, in.c.writeEvery)
	err := in.parts.agent.Shards(ctx, liveness.ShardsConfig{Set: in.c.shardSet, Count: in.c.shardCount,
		OnStartedOwning: func(sctx context.Context, shard liveness.Shard) {
			emit("shard_owned", in.id, "lease", shard.Lease.Name, "epoch", shard.Epoch)
			defer emit("shard_released", in.id, "lease", shard.Lease.Name, "epoch", shard.Epoch, "cause", causeOf(sctx))
			// Told at once, from the cancellation itself rather than when the loop next
			// looks, and before shard_released.
			told := make(chan struct{})
			stopTelling := context.AfterFunc(sctx, func() {
				defer close(told)
				emit("shard_cancelled", in.id, "lease", shard.Lease.Name, "epoch", shard.Epoch, "cause", causeOf(sctx),
					"lost", lostLease(sctx, shard.Lease.Name))
			})
			defer func() {
				if !stopTelling() {
					<-told
				}
			}()
			t := time.NewTicker(every)
			defer t.Stop()
			for writes := 1; ; writes++ {
				tx := in.c.txEvery > 0 && writes%in.c.txEvery == 0
				wctx, cancel := context.WithTimeout(sctx, 5*time.Second)
				var err error
				if tx {
					err = shard.BeginFunc(wctx, in.pool, func(tx pgx.Tx) error {
						for range 2 {
							if _, err := tx.Exec(wctx, in.txInsert, shard.Lease.Name, shard.Epoch, in.id.String()); err != nil {
								return err
							}
						}
						return nil
					})
				} else {
					_, err = shard.Exec(wctx, in.pool, in.txInsert, shard.Lease.Name, shard.Epoch, in.id.String())
				}
				cancel()
				if errors.Is(err, liveness.ErrFenced) {
					lost := errors.Is(err, liveness.ErrLeaseLost)
					emit("fence_refused", in.id, "lease", shard.Lease.Name, "epoch", shard.Epoch, "lost", lost, "tx", tx)
					if lost {
						return
					}
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

// lostLease reports whether ctx ended because the lease named name was lost (not because
// the shard moved, the set's member lease was lost, or the process is stopping: the
// shard's lease is then still held until its callback returns).
func lostLease(ctx context.Context, name string) bool {
	var lost *liveness.LeaseLostError
	return errors.As(context.Cause(ctx), &lost) && lost.Name == name
}

// causeOf names why a context ended, for the events; "" while it has not.
func causeOf(ctx context.Context) string {
	if err := context.Cause(ctx); err != nil {
		return err.Error()
	}
	return ""
}
