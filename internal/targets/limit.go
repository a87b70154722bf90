package targets

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// connLimit is the cap on connections across the targets' and discovered databases'
// pools: a token per dialled socket, given back when the socket closes. Each server (host
// and port) of the configuration in force may hold an equal share of the cap, so that a
// server that does not answer, whose connections hold their tokens until their
// statements' deadlines, costs only its own targets and databases: the others' shares
// stay free for them. A dial that waits is served in turn (the first waiter that fits
// gets the next token given back) and meanwhile closes an idle connection to make room:
// one of its own server's when the server is at its share, of any other when the cap is
// reached.
type connLimit struct {
	max   int
	evict func(server string) bool // closes one idle connection of server's pools ("": any pool's)

	mu      sync.Mutex
	share   int            // the most tokens one server holds
	total   int            // tokens held
	by      map[string]int // tokens held, by server
	waiters []*waiter      // in the order they came
	idle    chan struct{}  // closed and replaced when a connection may have turned idle (poke)
}

// waiter is a dial waiting for a token of server; ready is closed when it has one.
type waiter struct {
	server string
	ready  chan struct{}
}

func newConnLimit(max int, evict func(string) bool) *connLimit {
	return &connLimit{max: max, evict: evict, share: max, by: map[string]int{}, idle: make(chan struct{})}
}

// poke tells the dials waiting that a connection may have turned idle (a scrape's turn
// ended): they look for one to close at once rather than at their next evictRetry.
func (l *connLimit) poke() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.waiters) > 0 {
		close(l.idle)
		l.idle = make(chan struct{})
	}
}

// setShare divides the cap among n servers (at least one token each).
func (l *connLimit) setShare(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.share = max(1, l.max/max(n, 1))
	l.grantLocked()
}

// shareOf is the most tokens one server holds.
func (l *connLimit) shareOf() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.share
}

// held is how many tokens are held.
func (l *connLimit) held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// fitsLocked reports whether server may take a token now. l.mu is held.
func (l *connLimit) fitsLocked(server string) bool {
	return l.total < l.max && l.by[server] < l.share
}

// grantLocked gives free tokens to the waiters that fit, in turn. l.mu is held.
func (l *connLimit) grantLocked() {
	for i := 0; i < len(l.waiters); {
		w := l.waiters[i]
		if !l.fitsLocked(w.server) {
			i++
			continue
		}
		l.total++
		l.by[w.server]++
		close(w.ready)
		l.waiters = slices.Delete(l.waiters, i, i+1)
	}
}

func (l *connLimit) release(server string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(server)
}

// releaseLocked gives server's token back to the next waiter that fits. l.mu is held.
func (l *connLimit) releaseLocked(server string) {
	l.total--
	if l.by[server]--; l.by[server] == 0 {
		delete(l.by, server)
	}
	l.grantLocked()
}

// evictRetry is how often a dial waiting for a token looks again for an idle connection
// to close: a connection may have become idle meanwhile.
const evictRetry = 50 * time.Millisecond

// acquire takes a token for a connection to server, waiting in turn within ctx.
func (l *connLimit) acquire(ctx context.Context, server string) error {
	w := &waiter{server: server, ready: make(chan struct{})}
	l.mu.Lock()
	l.waiters = append(l.waiters, w)
	l.grantLocked() // at once when it fits, even behind waiters that do not
	l.mu.Unlock()
	for {
		select {
		case <-w.ready:
			return nil
		default:
		}
		l.mu.Lock()
		own := l.by[server] >= l.share
		idle := l.idle
		l.mu.Unlock()
		victim := "" // the cap is reached: any pool's idle connection
		if own {     // the server is at its share: one of its own
			victim = server
		}
		if l.evict(victim) { // its token goes to the first waiter that fits
			continue
		}
		t := time.NewTimer(evictRetry)
		select {
		case <-w.ready:
			t.Stop()
			return nil
		case <-idle:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			l.abandon(w)
			if own {
				return fmt.Errorf("the server's share of the targets' connection cap is taken and no connection became free in time: %w", ctx.Err())
			}
			return fmt.Errorf("the targets' connection cap is reached and no connection became free in time: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// abandon takes w out of the turn; a token it was given meanwhile goes back.
func (l *connLimit) abandon(w *waiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i := slices.Index(l.waiters, w); i >= 0 {
		l.waiters = slices.Delete(l.waiters, i, i+1)
		return
	}
	l.releaseLocked(w.server)
}

// closeGrace bounds what a connection on its way out still waits for: its cancel request
// and the server's goodbye. pgx allows 15 s for each, which a server that does not
// answer (its processes stopped, its host gone) takes whole, and the connection kept its
// token that long after the scrape that gave it up had answered.
const closeGrace = time.Second

// wrap is each connection's dialer (database.PoolConfig.WrapDial): its first dial takes
// a token, given back when the socket closes. A dial while that socket is still open is
// the cancel request pgx sends as it closes a connection whose statement was given up
// (its default context handling sends one at no other time): the connection is then
// bounded to closeGrace, and the cancel request, which opens no session, rides on its
// token for at most as long.
func (l *connLimit) wrapFor(server string) func(pgconn.DialFunc) pgconn.DialFunc {
	return func(next pgconn.DialFunc) pgconn.DialFunc { return l.wrap(server, next) }
}

func (l *connLimit) wrap(server string, next pgconn.DialFunc) pgconn.DialFunc {
	var mu sync.Mutex
	var open *limitedConn // this connection's socket, once dialled
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		c := open
		mu.Unlock()
		if c != nil && !c.isClosed() {
			c.leaving()
			return dialCancel(ctx, next, network, addr)
		}
		if err := l.acquire(ctx, server); err != nil {
			return nil, err
		}
		nc, err := next(ctx, network, addr)
		if err != nil {
			l.release(server)
			return nil, err
		}
		c = &limitedConn{Conn: nc, release: func() { l.release(server) }}
		mu.Lock()
		open = c
		mu.Unlock()
		return c, nil
	}
}

// dialCancel dials a cancel request's connection, bounded to closeGrace from now.
func dialCancel(ctx context.Context, next pgconn.DialFunc, network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, closeGrace)
	defer cancel()
	nc, err := next(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c := &limitedConn{Conn: nc, release: func() {}}
	c.leaving()
	return c, nil
}

// limitedConn gives its token back once, on Close. Once leaving, no deadline set on it
// is later than closeGrace after that moment.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()

	mu     sync.Mutex
	closed bool
	until  time.Time // the latest deadline while leaving; zero before
}

// Close waits (at most closeGrace) for the server to close its end first, as it does
// once it has the Terminate pgx writes before closing a session, so that a token given
// back is a session ended on the server too, not one still in pg_stat_activity beside
// its replacement; then it closes the socket and gives the token back.
func (c *limitedConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	_ = c.SetReadDeadline(time.Now().Add(closeGrace))
	_, _ = io.Copy(io.Discard, c.Conn)
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

func (c *limitedConn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// leaving bounds every wait on the connection to closeGrace from now.
func (c *limitedConn) leaving() {
	c.mu.Lock()
	if c.until.IsZero() {
		c.until = time.Now().Add(closeGrace)
	}
	until := c.until
	c.mu.Unlock()
	_ = c.Conn.SetDeadline(until)
}

// bound is t, or the leaving connection's latest deadline when t is later (or none).
func (c *limitedConn) bound(t time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.until.IsZero() && (t.IsZero() || t.After(c.until)) {
		return c.until
	}
	return t
}

func (c *limitedConn) SetDeadline(t time.Time) error      { return c.Conn.SetDeadline(c.bound(t)) }
func (c *limitedConn) SetReadDeadline(t time.Time) error  { return c.Conn.SetReadDeadline(c.bound(t)) }
func (c *limitedConn) SetWriteDeadline(t time.Time) error { return c.Conn.SetWriteDeadline(c.bound(t)) }
