package status

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// The page shares the pool with /metrics, and a scrape must keep its latency whatever
// people do on the page: 100 clients refreshing it used to take every pool connection,
// and the median scrape went from milliseconds to seconds. So:
//
//   - One evaluation serves every identical request for dataTTL (singleflight, then a
//     cache), and so does each form it was rendered in: a refresh storm of one URL
//     costs one read and one rendering a second.
//   - One evaluation reads the database at a time, so the page holds at most one pool
//     connection and a scrape always finds the others (with --db.max-conns=1 it waits at
//     most for one page's two statements).
//   - One page is rendered at a time, and the page answers at most pagesPerSecond
//     requests a second (bursts of pageBurst), so that serving it cannot crowd out a
//     scrape's CPU; at most maxAdmitted requests wait for a turn. Beyond that, or when a
//     request waited maxWait for its turn, the answer is 429 with Retry-After: the
//     database was not asked, so nothing reads as an outage.
//
// A connection reserved for scrapes was the other way, and is not possible here: the
// pool is the connection budget (--db.max-conns, which must work at 1), pgxpool has no
// reservation, and a connection held idle is what the advisory-lock incident was about.
const (
	dataTTL        = time.Second
	pagesPerSecond = 20 // a wall of 100 screens reloading every 5 s
	pageBurst      = 100
	maxAdmitted    = 64
	maxWait        = 3 * time.Second
	maxCached      = 64 // distinct queries kept for dataTTL; beyond, evaluations are not kept
	maxBodiesKept  = 4  // renderings kept per evaluation (JSON, HTML at a few refresh values)
	retryAfter     = "1"
)

// errBusy: the page had too much to do to answer now.
var errBusy = errors.New("the status page is busy with other requests; retry in a second (the database was not asked)")

// limiter bounds the page's cost; see above.
type limiter struct {
	rate     *rate.Limiter
	admitted atomic.Int64
	db       chan struct{} // held while an evaluation reads the database
	render   chan struct{} // held while a page is rendered

	mu      sync.Mutex
	entries map[query]*evaluation // in flight, or finished less than dataTTL ago
}

func newLimiter() *limiter {
	return &limiter{rate: rate.NewLimiter(pagesPerSecond, pageBurst), db: make(chan struct{}, 1), render: make(chan struct{}, 1), entries: map[query]*evaluation{}}
}

// evaluation is one read of the page's data, shared by identical requests, with the
// forms it was rendered in.
type evaluation struct {
	done     chan struct{} // closed when page, dbErr and err are set
	finished time.Time     // set under limiter.mu before done is closed
	page     Page          // never changed once done
	dbErr    bool
	err      error // errBusy: it never got the database

	mu     sync.Mutex
	bodies map[bodyKey]*body
}

// bodyKey is what a rendering depends on besides the page.
type bodyKey struct {
	json    bool
	refresh time.Duration // HTML only
}

type body struct {
	done chan struct{} // closed when b and err are set
	b    []byte
	err  error
}

// admit counts a request in; it must call leave when it returns. False: too many.
func (l *limiter) admit() bool {
	if !l.rate.Allow() {
		return false
	}
	if l.admitted.Add(1) > maxAdmitted {
		l.admitted.Add(-1)
		return false
	}
	return true
}

func (l *limiter) leave() { l.admitted.Add(-1) }

// evaluate returns the evaluation for q: one in flight or finished less than dataTTL
// ago, or a new one by read, in the database slot. The error is errBusy when it waited
// too long.
func (l *limiter) evaluate(ctx context.Context, q query, read func(context.Context, query) (Page, bool)) (*evaluation, error) {
	key := q
	key.refresh = 0 // the same data, whatever the page's reload interval
	now := time.Now()
	l.mu.Lock()
	for k, e := range l.entries {
		if !e.finished.IsZero() && now.Sub(e.finished) >= dataTTL {
			delete(l.entries, k)
		}
	}
	if e := l.entries[key]; e != nil {
		l.mu.Unlock()
		select {
		case <-e.done:
			return e, e.err
		case <-ctx.Done():
			return nil, errBusy
		}
	}
	e := &evaluation{done: make(chan struct{}), bodies: map[bodyKey]*body{}}
	l.entries[key] = e
	l.mu.Unlock()

	finish := func(keep bool) {
		l.mu.Lock()
		e.finished = time.Now()
		if !keep || len(l.entries) > maxCached {
			delete(l.entries, key)
		}
		l.mu.Unlock()
		close(e.done)
	}
	if !take(ctx, l.db) {
		e.err = errBusy
		finish(false)
		return nil, e.err
	}
	// The requests sharing it must not lose it when this one's client goes away.
	readCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), queryTimeout)
	e.page, e.dbErr = read(readCtx, q)
	cancel()
	<-l.db
	finish(true)
	return e, nil
}

// body returns the evaluation rendered by render as k: rendered once, in the render
// slot, for every request that asks for it while the evaluation is kept.
func (l *limiter) body(ctx context.Context, e *evaluation, k bodyKey, render func() ([]byte, error)) ([]byte, error) {
	e.mu.Lock()
	if b := e.bodies[k]; b != nil {
		e.mu.Unlock()
		select {
		case <-b.done:
			return b.b, b.err
		case <-ctx.Done():
			return nil, errBusy
		}
	}
	b := &body{done: make(chan struct{})}
	keep := len(e.bodies) < maxBodiesKept
	if keep {
		e.bodies[k] = b
	}
	e.mu.Unlock()
	if take(ctx, l.render) {
		b.b, b.err = render()
		<-l.render
	} else {
		b.err = errBusy
	}
	if b.err != nil && keep { // the next request tries again
		e.mu.Lock()
		delete(e.bodies, k)
		e.mu.Unlock()
	}
	close(b.done)
	return b.b, b.err
}

// take takes a slot of sem, waiting at most maxWait.
func take(ctx context.Context, sem chan struct{}) bool {
	wait, cancel := context.WithTimeout(ctx, maxWait)
	defer cancel()
	select {
	case sem <- struct{}{}:
		return true
	case <-wait.Done():
		return false
	}
}
