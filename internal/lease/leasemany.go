// Many leases of one group at once: a shard set member's shards taken, released and left
// to expire in one statement each, however many there are.

package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
)

// AcquireMany takes, in one statement, those of names that are free, each with a holder
// token of its own, as Acquire takes one: group (whose ttl they get) renews them, and
// they are trusted, as one lease is, only once the alive lock has been proved held by a
// proof sent after the statement was answered: one proof for the whole batch, whose
// leases then follow one leadership. It returns the leases taken; a name it leaves out
// is held by another. A lease of the batch ends when it is released, lost (a renewal
// that misses it, its window, a fence) or when the leadership ends (all of them then).
func (l *Leases) AcquireMany(ctx context.Context, names []string, group *Group) ([]*Lease, error) {
	if len(names) == 0 {
		return nil, nil
	}
	ttl := group.ttl
	margin, err := l.marginFor(names[0], ttl)
	if err != nil {
		return nil, err
	}
	holders := make([]string, len(names))
	for i := range holders {
		if holders[i], err = l.holderID(); err != nil {
			return nil, err
		}
	}
	if l.gate != nil && !l.gate.Alive() {
		return nil, ErrNotAlive
	}
	var mark HoldMark
	if l.gate != nil {
		mark = l.gate.Hold()
	}
	start := time.Now()
	trustUntil := start.Add(ttl - margin)
	actx, cancel := context.WithDeadline(ctx, trustUntil)
	defer cancel()
	type taken struct {
		name             string
		epoch            int64
		takenAt, expires time.Time
	}
	var got []taken
	l.abandonUnanswered(ctx)
	err = l.sendAcquire(actx, trustUntil, func(ctx context.Context, conn *pgxpool.Conn) error {
		got = got[:0]
		rows, err := conn.Query(ctx, l.stmts.acquireMany, names, holders, ttl.Seconds(), l.id, l.host)
		if err != nil {
			return err
		}
		var r taken
		_, err = pgx.ForEachRow(rows, []any{&r.name, &r.epoch, &r.takenAt, &r.expires}, func() error {
			got = append(got, r)
			return nil
		})
		return err
	})
	roundTrip := time.Since(start)
	if err != nil || actx.Err() != nil {
		// Taken as the caller gave up, or the answer was lost with the statement perhaps
		// committed (the connection cut, the server restarting): give back whatever this
		// batch may hold at once, or before the next acquisition of its names.
		l.giveBack(ctx, names, holders, ttl)
		if err == nil {
			err = context.Cause(actx)
		}
		return nil, fmt.Errorf("liveness: acquire %d leases (%q, ...): %w", len(names), names[0], logging.RedactError(err))
	}
	if len(got) == 0 {
		return nil, nil
	}
	holderOf := make(map[string]string, len(names))
	for i, n := range names {
		holderOf[n] = holders[i]
	}
	var life Leadership
	if l.gate != nil {
		if life, err = l.gate.Lead(actx, mark, time.Now()); err != nil {
			gave, tokens := make([]string, len(got)), make([]string, len(got))
			for i, r := range got {
				gave[i], tokens[i] = r.name, holderOf[r.name]
			}
			l.giveBack(ctx, gave, tokens, ttl)
			l.log.Debug("leases given back: the alive lock was not proved held in time", "leases", len(got), "err", err)
			return nil, ErrNotAlive
		}
	}
	shares := new(atomic.Int64) // a batch's leases have no renewLoop, with or without life
	shares.Store(int64(len(got)))
	out := make([]*Lease, len(got))
	for i, r := range got {
		out[i] = l.newLease(context.Background(), r.name, holderOf[r.name], r.epoch, r.takenAt, r.expires, trustUntil,
			fenceUntil(r.expires, roundTrip, margin), ttl, margin, life, shares, group)
	}
	if life != nil {
		// One watch for the batch: when the leadership is over, so is every lease of it.
		// It ends too once the last lease has (which stops the leadership).
		go func() {
			<-life.Over()
			for _, le := range out {
				le.lose(ReasonNotAlive, nil)
			}
		}()
	}
	return out, nil
}

// giveBack deletes what acquisitions (names and their holder tokens) may hold that this
// process will not lead: their answer was lost, with the statement perhaps committed, or
// they were taken when nobody wanted them any more. What it cannot delete now (the
// server restarting, out of reach) is deleted before this process's next acquisition of
// any lease, until their ttl has passed: the holder, alive again as soon as the server
// answers, would otherwise keep the lease from everyone, itself included, for its ttl.
// It runs even when ctx has ended (the caller gave up), within ReleaseTimeout.
func (l *Leases) giveBack(ctx context.Context, names, holders []string, ttl time.Duration) {
	now := time.Now()
	l.mu.Lock()
	if l.unanswered == nil {
		l.unanswered = map[string][]unansweredTake{}
	}
	for i, n := range names {
		l.unanswered[n] = append(l.unanswered[n], unansweredTake{holder: holders[i], expires: now.Add(ttl)})
	}
	l.mu.Unlock()
	l.abandonUnanswered(context.WithoutCancel(ctx))
}

// abandonUnanswered deletes, by their holder tokens (so nothing else), the rows that the
// given-back acquisitions may hold, whatever their names (the lease may be another
// process's to take now), under ctx and within ReleaseTimeout; those it cannot delete
// now are kept for this process's next acquisition. With nothing given back, it sends
// nothing.
func (l *Leases) abandonUnanswered(ctx context.Context) {
	var ns, hs []string
	now := time.Now()
	l.mu.Lock()
	for n, takes := range l.unanswered {
		takes = slices.DeleteFunc(takes, func(u unansweredTake) bool { return !now.Before(u.expires) })
		for _, u := range takes {
			ns, hs = append(ns, n), append(hs, u.holder)
		}
		if len(takes) == 0 {
			delete(l.unanswered, n)
		} else {
			l.unanswered[n] = takes
		}
	}
	l.mu.Unlock()
	if len(ns) == 0 {
		return
	}
	dctx, cancel := context.WithTimeout(ctx, ReleaseTimeout)
	defer cancel()
	var err error
	if len(ns) == 1 {
		_, err = l.pool.Exec(dctx, l.stmts.abandon, ns[0], hs[0])
	} else {
		_, err = l.pool.Exec(dctx, l.stmts.abandonMany, ns, hs)
	}
	if err != nil {
		return // kept for the next try
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, n := range ns {
		l.unanswered[n] = slices.DeleteFunc(l.unanswered[n], func(u unansweredTake) bool { return u.holder == hs[i] })
		if len(l.unanswered[n]) == 0 {
			delete(l.unanswered, n)
		}
	}
}

// manyBatch is the most leases one statement releases or leaves to expire: the server
// spends a fraction of a millisecond on each (its lease function, and the notification
// of a release), so that a statement for many thousands would outlast its deadline and
// give back nothing at all.
const manyBatch = 5_000

// ReleaseMany is Release for many leases, in one statement for up to manyBatch of them,
// each within ReleaseTimeout: each lease ends, and its row goes if it still belongs to
// its acquisition. A lease
// released before is left out. No other Release of these leases may run meanwhile.
func (l *Leases) ReleaseMany(ctx context.Context, les []*Lease) error {
	mine := make([]*Lease, 0, len(les))
	for _, le := range les {
		le.releaseOnce.Do(func() { mine = append(mine, le) })
	}
	for _, le := range mine {
		le.end(l.errs.Released)
	}
	for _, le := range mine {
		<-le.renewerDone
	}
	err := l.DeleteRows(ctx, mine)
	for _, le := range mine {
		le.mu.Lock()
		le.releaseErr = err
		le.mu.Unlock()
	}
	return err
}

// DeleteRows sends the release statement of many leases, one for each manyBatch, each
// within ReleaseTimeout: each row goes if it still belongs to its acquisition. It may
// be sent again after a failure.
func (l *Leases) DeleteRows(ctx context.Context, les []*Lease) error {
	var errs []error
	for batch := range slices.Chunk(les, manyBatch) {
		names, holders, epochs := leaseKeys(batch)
		bctx, cancel := context.WithTimeout(ctx, ReleaseTimeout)
		_, err := l.pool.Exec(bctx, l.stmts.releaseMany, names, holders, epochs)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("liveness: release %d leases (%q, ...): %w", len(batch), batch[0].Name,
				logging.RedactError(err)))
		}
	}
	return errors.Join(errs...)
}

// LeaveManyToExpire is LeaveToExpire for many leases, in one statement for up to
// manyBatch of them, each within ReleaseTimeout.
func (l *Leases) LeaveManyToExpire(ctx context.Context, les []*Lease) error {
	for _, le := range les {
		le.end(errLeftToExpire)
	}
	for _, le := range les {
		<-le.renewerDone
	}
	if l.id == nil {
		return nil
	}
	var errs []error
	for batch := range slices.Chunk(les, manyBatch) {
		names, holders, epochs := leaseKeys(batch)
		bctx, cancel := context.WithTimeout(ctx, ReleaseTimeout)
		_, err := l.pool.Exec(bctx, l.stmts.detachMany, names, holders, epochs)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("liveness: leave %d leases (%q, ...) to expire: %w", len(batch), batch[0].Name,
				logging.RedactError(err)))
		}
	}
	return errors.Join(errs...)
}

func leaseKeys(les []*Lease) (names, holders []string, epochs []int64) {
	names, holders, epochs = make([]string, len(les)), make([]string, len(les)), make([]int64, len(les))
	for i, le := range les {
		names[i], holders[i], epochs[i] = le.Name, le.Holder, le.Epoch
	}
	return names, holders, epochs
}
