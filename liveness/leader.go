// Who leads a lease: Leader, read from the database, and the changes of it a campaign
// reports to OnNewLeader.

package liveness

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// Leader is who holds a lease, as the database says.
type Leader struct {
	Lease      string
	InstanceID uuid.UUID // uuid.Nil when the holder recorded none (older software, or none leads)
	Host       string
	Epoch      int64 // the fencing token of this leadership; 0 when none leads
	TakenAt    time.Time
	ExpiresAt  time.Time
}

// observe reads who leads and reports a change, when OnNewLeader is set.
func (e *campaign) observe(ctx context.Context) {
	if e.cfg.OnNewLeader != nil {
		e.readLeader(ctx)
	}
}

// readLeader reads who leads, reports a change, and returns the leader (the zero Leader,
// but its name, when nobody leads); ok is false when it could not be read.
func (e *campaign) readLeader(ctx context.Context) (leader Leader, ok bool) {
	qctx, cancel := context.WithTimeout(ctx, e.cfg.RetryPeriod)
	defer cancel()
	leader, err := readLeader(qctx, e.leases.pool, e.leases.stmts.leader, e.cfg.Lease)
	if err != nil && !errors.Is(err, ErrNoLeader) {
		if ctx.Err() == nil {
			e.leases.log.Debug("campaign: cannot read the leader", "lease", e.cfg.Lease, "err", err)
		}
		return leader, false
	}
	e.report(leader)
	return leader, true
}

// observeAfter reports who leads once this process's leadership self has ended: the
// next leader if the lease has one already, otherwise nobody.
func (e *campaign) observeAfter(ctx context.Context, self Leader) {
	if e.cfg.OnNewLeader == nil {
		return
	}
	none := Leader{Lease: self.Lease}
	if ctx.Err() != nil {
		e.report(none)
		return
	}
	qctx, cancel := context.WithTimeout(ctx, e.cfg.RetryPeriod)
	defer cancel()
	leader, err := readLeader(qctx, e.leases.pool, e.leases.stmts.leader, e.cfg.Lease)
	if err != nil || leader.Epoch == self.Epoch {
		leader = none // this process knows it no longer leads, whatever the row still says
	}
	e.report(leader)
}

func (e *campaign) report(l Leader) {
	if e.cfg.OnNewLeader == nil || (l.Epoch == e.seen.Epoch && l.InstanceID == e.seen.InstanceID) {
		return
	}
	e.seen = l
	e.cfg.OnNewLeader(l)
}

// ErrNoLeader is returned by Reader.Leader when nobody holds the lease: no row, an
// expired one, or a holder that is dead by the one verdict.
var ErrNoLeader = errors.New("liveness: no leader")

// readLeader returns the lease's live holder, or ErrNoLeader with the zero Leader (but
// its name).
func readLeader(ctx context.Context, db Querier, sql, name string) (Leader, error) {
	rows, err := db.Query(ctx, sql, name)
	if err != nil {
		return Leader{Lease: name}, fmt.Errorf("liveness: read leader of %q: %w", name, err)
	}
	row, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[store.LeaderRow])
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Leader{Lease: name}, ErrNoLeader
	case err != nil:
		return Leader{Lease: name}, fmt.Errorf("liveness: read leader of %q: %w", name, err)
	case !row.Held || !row.HolderAlive:
		return Leader{Lease: name}, ErrNoLeader
	}
	l := Leader{Lease: name, Host: row.HolderHost, Epoch: row.Epoch, TakenAt: row.TakenAt, ExpiresAt: row.ExpiresAt}
	if row.HolderInstanceID != nil {
		l.InstanceID = *row.HolderInstanceID
	}
	return l, nil
}
