package targets

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// minTurnBudget is the least of a scrape's time that a database's turn is given before
// it may be taken back for others waiting.
const minTurnBudget = time.Second

// turns are one server's turns to scrape its discovered databases: at most size at
// once, given first come, first served. A turn held past its budget (its database's
// share of the scrape's time) while others wait is taken back, its scrape's context
// ended, so that slow databases (a locked table, say) cost the others of their server at
// most their share, never the whole deadline; with nobody waiting it runs on.
type turns struct {
	size int

	mu   sync.Mutex
	held []*turn // in the order they were given
	wait []*turn // in the order they came
}

// turn is one database's turn in one scrape.
type turn struct {
	ready  chan struct{} // closed when given
	end    context.CancelCauseFunc
	reason error       // why it was taken back, if it is
	timer  *time.Timer // its budget, once given
	over   bool        // past its budget: taken back as soon as someone waits
	ended  bool        // taken back
}

func newTurns(size int) *turns { return &turns{size: size} }

// take waits within ctx for a turn and returns the scrape's context (ctx, ended early if
// the turn is taken back) and the function that gives the turn back. databases is how
// many databases of the server the scrape has: the turn's budget is their share of
// ctx's remaining time (size turns over that many), at least minTurnBudget.
func (t *turns) take(ctx context.Context, databases int) (context.Context, func(), error) {
	budget := minTurnBudget
	if deadline, ok := ctx.Deadline(); ok {
		budget = max(budget, time.Until(deadline)*time.Duration(t.size)/time.Duration(max(databases, 1)))
	}
	scrape, end := context.WithCancelCause(ctx)
	tn := &turn{ready: make(chan struct{}), end: end,
		reason: fmt.Errorf("its turn was taken back: it took longer than its share of the scrape's time (%s) while other databases of its server waited",
			budget.Round(time.Millisecond))}
	t.mu.Lock()
	t.wait = append(t.wait, tn)
	t.grantLocked()
	t.preemptLocked()
	t.mu.Unlock()
	select {
	case <-tn.ready:
	case <-ctx.Done():
		t.mu.Lock()
		i := slices.Index(t.wait, tn)
		if i >= 0 {
			t.wait = slices.Delete(t.wait, i, i+1)
		}
		t.mu.Unlock()
		if i < 0 { // given meanwhile
			t.release(tn)
		}
		end(nil)
		return nil, nil, ctx.Err()
	}
	t.mu.Lock()
	tn.timer = time.AfterFunc(budget, func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		tn.over = true
		t.preemptLocked()
	})
	t.mu.Unlock()
	return scrape, func() {
		end(nil)
		t.release(tn)
	}, nil
}

// release gives tn back.
func (t *turns) release(tn *turn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tn.timer != nil {
		tn.timer.Stop()
	}
	if i := slices.Index(t.held, tn); i >= 0 {
		t.held = slices.Delete(t.held, i, i+1)
	}
	t.grantLocked()
}

// grantLocked gives the free turns to those waiting, in turn. t.mu is held.
func (t *turns) grantLocked() {
	for len(t.held) < t.size && len(t.wait) > 0 {
		tn := t.wait[0]
		t.wait = t.wait[1:]
		t.held = append(t.held, tn)
		close(tn.ready)
	}
}

// preemptLocked takes back, oldest first, turns past their budget: one for each turn
// asked for and not already being given back. t.mu is held.
func (t *turns) preemptLocked() {
	ending := 0
	for _, h := range t.held {
		if h.ended {
			ending++
		}
	}
	for _, h := range t.held {
		if ending >= len(t.wait) {
			return
		}
		if h.over && !h.ended {
			h.ended = true
			h.end(h.reason)
			ending++
		}
	}
}
