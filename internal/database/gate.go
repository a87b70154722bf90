package database

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Backoff of connection attempts after an authentication failure.
const (
	authBackoffMin = time.Second
	authBackoffMax = 5 * time.Minute
)

// connectGate sits in front of every connection attempt of a pool. While the pool has no
// proven connection (at start, after a failure), it lets one attempt through at a time and
// the others wait for its outcome, so concurrent scrapes share one attempt. After an
// authentication failure (SQLSTATE class 28) it refuses attempts for a backoff that
// doubles up to 5 minutes, returning the failure at once: a wrong password costs a few
// failed logins, not a few per scrape. A success, or Reset (a reloaded DSN), ends it.
type connectGate struct {
	mu       sync.Mutex
	healthy  bool          // the last attempt succeeded: no gating
	inFlight chan struct{} // closed when the gated attempt ends
	authErr  error         // the last authentication failure, while backing off
	until    time.Time
	backoff  time.Duration
}

// before is the pool's BeforeConnect: nil lets the attempt go ahead.
func (g *connectGate) before(ctx context.Context) error {
	for {
		g.mu.Lock()
		switch {
		case g.healthy:
			g.mu.Unlock()
			return nil
		case g.authErr != nil && time.Now().Before(g.until):
			err := &backoffError{err: g.authErr, retryIn: time.Until(g.until).Round(time.Second)}
			g.mu.Unlock()
			return err
		case g.inFlight == nil:
			g.inFlight = make(chan struct{})
			g.mu.Unlock()
			return nil
		}
		wait := g.inFlight
		g.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// after records an attempt's outcome.
func (g *connectGate) after(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inFlight != nil {
		close(g.inFlight)
		g.inFlight = nil
	}
	switch {
	case err == nil:
		g.healthy, g.authErr, g.backoff = true, nil, 0
	case IsAuthError(err):
		g.healthy = false
		g.backoff = min(max(g.backoff*2, authBackoffMin), authBackoffMax)
		g.authErr, g.until = err, time.Now().Add(g.backoff)
	default:
		g.healthy, g.authErr = false, nil
	}
}

// Reset forgets an authentication failure: the next attempt goes ahead.
func (g *connectGate) Reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.authErr, g.backoff = nil, 0
}

// IsAuthError reports whether PostgreSQL refused the login (SQLSTATE class 28: a wrong
// password, no pg_hba.conf entry, an unknown role).
func IsAuthError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "28")
}

// backoffError is returned instead of a login attempt while backing off; it wraps the
// last failure so that callers classify it the same way.
type backoffError struct {
	err     error
	retryIn time.Duration
}

func (e *backoffError) Error() string {
	return fmt.Sprintf("not logging in again for %s after: %v", e.retryIn, e.err)
}

func (e *backoffError) Unwrap() error { return e.err }

// gateTracer tells the gate how each attempt ended; it chains to an existing tracer.
type gateTracer struct {
	gate *connectGate
	next pgx.QueryTracer
}

func (t gateTracer) TraceConnectStart(ctx context.Context, _ pgx.TraceConnectStartData) context.Context {
	return ctx
}

func (t gateTracer) TraceConnectEnd(_ context.Context, data pgx.TraceConnectEndData) {
	t.gate.after(data.Err)
}

func (t gateTracer) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if t.next != nil {
		return t.next.TraceQueryStart(ctx, c, d)
	}
	return ctx
}

func (t gateTracer) TraceQueryEnd(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryEndData) {
	if t.next != nil {
		t.next.TraceQueryEnd(ctx, c, d)
	}
}
