package status

import (
	"context"
	"errors"
	"fmt"
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
//     most for one page's three statements; the history's, the least urgent, within
//     historyTimeout).
//   - One page is rendered at a time, and the page answers at most pagesPerSecond
//     requests a second (bursts of pageBurst), so that serving it cannot crowd out a
//     scrape's CPU; at most maxAdmitted requests wait for a turn. Beyond that, or when a
//     request waited maxWait for its turn to render, the answer is 429 with Retry-After:
//     the page's own limit, and the database was not asked, so nothing reads as an
//     outage.
//   - A request that waited maxWait for the database slot while one read, started before
//     it began to wait, kept waiting on the database (a lock on the instances table, an
//     overloaded server) is answered 503 with Retry-After and that reason (errSlow): the
//     database is what does not answer. Several reads in turn ahead of it are the page's
//     own load: 429. A read that times out itself is a 503 with the page and its error.
//
// A request waits for an evaluation already in flight until it ends (its read is bounded
// by queryTimeout), not by a deadline of its own, and renders after it with a wait of its
// own: a read that took its whole queryTimeout is answered, never turned into a 429
// because the request's time ran out meanwhile.
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

// errBusy: the page had too much to do to answer now (429).
var errBusy = errors.New("the status page is busy with other requests; retry in a second (the database was not asked)")

// errSlow: another read of the page has been waiting on the database for longer than
// this request may wait for its turn (503).
var errSlow = fmt.Errorf("the database is slow to answer the page: the read ahead of this request did not end within %s "+
	"(a lock on the instances table, or an overloaded server); it was not asked again: retry later", maxWait)

// errGone: the client went away while waiting; nobody reads the answer.
var errGone = errors.New("the client went away")

// limiter bounds the page's cost; see above.
type limiter struct {
	rate     *rate.Limiter
	admitted atomic.Int64
	db       chan struct{} // held while an evaluation reads the database
	render   chan struct{} // held while a page is rendered
	// reading is when the read holding db started (Unix nanoseconds; 0 when none does).
	reading atomic.Int64

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
	err      error // errSlow: it never got the database

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
// ago, or a new one by read, in the database slot. The error is errSlow when it waited
// maxWait for the slot, errGone when ctx (the client's) ended first.
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
			return nil, errGone
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
	waitFrom := time.Now().UnixNano()
	if !take(ctx, l.db) {
		// One read kept the slot for the whole wait: the database is what is slow.
		// Several in turn: the page's own load.
		since := l.reading.Load()
		switch {
		case ctx.Err() != nil:
			e.err = errGone
		case since != 0 && since <= waitFrom:
			e.err = errSlow
		default:
			e.err = errBusy
		}
		finish(false)
		return nil, e.err
	}
	l.reading.Store(time.Now().UnixNano())
	// The requests sharing it must not lose it when this one's client goes away.
	readCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), queryTimeout)
	e.page, e.dbErr = read(readCtx, q)
	cancel()
	l.reading.Store(0)
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
			return nil, errGone
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
