package lease

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Group renews many leases of one holder, with one ttl, in one statement
// (lease_renew_many): a shard set's member lease and every shard its member owns. Each
// lease keeps its own trust window, fence deadline and context, exactly as when it
// renews itself; a lease missing from a renewal's answer is lost (taken), and a renewal
// that fails or goes unanswered is retried, the windows running out as they would.
type Group struct {
	leases *Leases
	ttl    time.Duration
	// statName is what its leases count under in Leases.Stats ("<set>/*"): one entry,
	// and one label value, for a set's thousand shards.
	statName string

	mu      sync.Mutex
	members map[*Lease]struct{}
}

// NewGroup is a group of l's leases of ttl, counted in Stats under statName.
func NewGroup(l *Leases, ttl time.Duration, statName string) *Group {
	return &Group{leases: l, ttl: ttl, statName: statName, members: map[*Lease]struct{}{}}
}

func (g *Group) add(le *Lease) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.members[le] = struct{}{}
}

func (g *Group) remove(le *Lease) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.members, le)
}

// Run renews every ttl/4, and ttl/16 after a failed attempt, until ctx ends.
func (g *Group) Run(ctx context.Context) {
	every, retry := g.ttl/4, g.ttl/16
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if g.renew(ctx) {
			t.Reset(every)
		} else {
			t.Reset(retry)
		}
	}
}

// renew sends one renewal of every member and reports whether it was answered.
func (g *Group) renew(ctx context.Context) bool {
	g.mu.Lock()
	members := make([]*Lease, 0, len(g.members))
	for le := range g.members {
		members = append(members, le)
	}
	g.mu.Unlock()
	if len(members) == 0 {
		return true
	}
	names, holders, epochs := make([]string, len(members)), make([]string, len(members)), make([]int64, len(members))
	sent := time.Now()
	deadline := sent.Add(max(g.ttl/5, minRenewAttempt))
	until := deadline
	for i, le := range members {
		names[i], holders[i], epochs[i] = le.Name, le.Holder, le.Epoch
		le.mu.Lock()
		if le.trustUntil.Before(until) {
			until = le.trustUntil
		}
		le.lastErr = nil // an unanswered attempt counts as "expired", not "error"
		le.mu.Unlock()
	}
	// One attempt waits at most a fifth of the ttl (an answer past a lease's window is no
	// answer for that lease: renewFailed and the window see to it).
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	rows, err := g.leases.pool.Query(rctx, g.leases.stmts.renewMany, names, holders, epochs, g.ttl.Seconds())
	renewed := map[string]time.Time{}
	if err == nil {
		var name string
		var expiresAt time.Time
		_, err = pgx.ForEachRow(rows, []any{&name, &expiresAt}, func() error {
			renewed[name] = expiresAt
			return nil
		})
	}
	if err != nil {
		if ctx.Err() == nil && rctx.Err() == nil {
			for _, le := range members {
				le.renewFailed(err, until)
			}
		}
		return false
	}
	for _, le := range members {
		if expiresAt, ok := renewed[le.Name]; ok {
			le.extend(expiresAt, sent)
		} else {
			le.lose(ReasonTaken, nil)
		}
	}
	return true
}
