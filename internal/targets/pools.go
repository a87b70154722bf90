package targets

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/database"
)

// Defaults of Options, the binary's flags' defaults.
const (
	DefaultMaxConns          = 20
	DefaultMaxConnsPerTarget = 2
	DefaultIdleTimeout       = time.Minute
)

// Options bound the targets' pools.
type Options struct {
	MaxConns          int           // across all targets; at least MaxConnsPerTarget
	MaxConnsPerTarget int32         // per target's pool, 1 to database.MaxMaxConns
	IdleTimeout       time.Duration // a connection idle this long is closed; above zero
	ConnectTimeout    time.Duration // per connection attempt, unless a DSN sets one
	ApplicationName   string        // unless a DSN sets one
	Logger            *slog.Logger  // the pools' (database version warnings)
}

// Pools keeps one pool per target of the configuration in force, opened on first use.
type Pools struct {
	opts  Options
	limit *connLimit

	mu      sync.Mutex
	cfg     *Config
	open    map[string]*pgxpool.Pool
	closing sync.WaitGroup // pools of replaced targets, closing while their last statements end
}

// NewPools checks opts and returns the pools of cfg's targets; none is opened yet.
// Errors name the Options field.
func NewPools(cfg *Config, opts Options) (*Pools, error) {
	switch {
	case opts.MaxConnsPerTarget < 1 || opts.MaxConnsPerTarget > database.MaxMaxConns:
		return nil, errors.New("Options.MaxConnsPerTarget must be between 1 and 1000")
	case opts.MaxConns < int(opts.MaxConnsPerTarget):
		return nil, errors.New("Options.MaxConns must be at least Options.MaxConnsPerTarget")
	case opts.IdleTimeout <= 0:
		return nil, errors.New("Options.IdleTimeout must be above zero")
	case opts.ConnectTimeout <= 0:
		return nil, errors.New("Options.ConnectTimeout must be above zero")
	}
	p := &Pools{opts: opts, cfg: cfg, open: map[string]*pgxpool.Pool{}}
	p.limit = &connLimit{tokens: make(chan struct{}, opts.MaxConns), evict: p.evictIdle}
	return p, nil
}

// Config is the configuration in force.
func (p *Pools) Config() *Config {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg
}

// Pool returns the named target's pool, opening it (without connecting) on first use.
// ok is false for a name the configuration does not hold.
func (p *Pools) Pool(name string) (pool *pgxpool.Pool, ok bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pool := p.open[name]; pool != nil {
		return pool, true, nil
	}
	t, ok := p.cfg.Target(name)
	if !ok {
		return nil, false, nil
	}
	return p.openLocked(name, t.dsn)
}

// openLocked opens the pool of key (a target's name, or discoveredKey) on dsn, without
// connecting. p.mu is held.
func (p *Pools) openLocked(key, dsn string) (*pgxpool.Pool, bool, error) {
	pool, err := database.NewPool(database.PoolConfig{
		DSN: dsn, MaxConns: p.opts.MaxConnsPerTarget, ApplicationName: p.opts.ApplicationName,
		ConnectTimeout: p.opts.ConnectTimeout, Logger: p.opts.Logger, MaxConnIdleTime: p.opts.IdleTimeout,
		WrapDial: p.limit.wrap,
	})
	if err != nil {
		return nil, true, err
	}
	p.open[key] = pool
	return pool, true, nil
}

// discoveredKey is the key of a discovered database's pool: a target's name holds no
// ':' or '/', so it is never one.
func discoveredKey(server, db string) string { return "discover:" + server + "/" + db }

// DiscoveredPool returns the pool of database db of the discover entry named server,
// opening it (without connecting) on first use, under the same cap as the targets'.
// ok is false for a server the configuration does not hold.
func (p *Pools) DiscoveredPool(server, db string) (pool *pgxpool.Pool, ok bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := discoveredKey(server, db)
	if pool := p.open[key]; pool != nil {
		return pool, true, nil
	}
	srv, ok := p.cfg.discover[server]
	if !ok {
		return nil, false, nil
	}
	return p.openLocked(key, srv.dsn(db))
}

// ForgetDiscovered closes the pool of a discovered database that is gone or no longer
// holds the source, in the background once its statements in flight end.
func (p *Pools) ForgetDiscovered(server, db string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := discoveredKey(server, db)
	if pool := p.open[key]; pool != nil {
		delete(p.open, key)
		p.closing.Go(pool.Close)
	}
}

// sameDSN reports whether key's pool connects the same way under cfg as under the
// configuration in force. p.mu is held.
func (p *Pools) sameDSN(key string, cfg *Config) bool {
	if rest, ok := strings.CutPrefix(key, "discover:"); ok {
		server, db, _ := strings.Cut(rest, "/")
		old, had := p.cfg.discover[server]
		srv, has := cfg.discover[server]
		return had && has && old.dsn(db) == srv.dsn(db)
	}
	t, ok := cfg.Target(key)
	return ok && t.dsn == p.cfg.targets[key].dsn
}

// Replace puts cfg in force: the pools of targets that are gone, or whose DSN changed,
// are closed (in the background, once their statements in flight end); the others are
// kept, with their connections.
func (p *Pools) Replace(cfg *Config) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, pool := range p.open {
		if p.sameDSN(name, cfg) {
			continue
		}
		delete(p.open, name)
		p.closing.Go(pool.Close)
	}
	p.cfg = cfg
}

// Conns is how many connections the targets' pools hold together (dialled and not yet
// closed).
func (p *Pools) Conns() int { return len(p.limit.tokens) }

// Close closes every pool and waits for them.
func (p *Pools) Close() {
	p.mu.Lock()
	for name, pool := range p.open {
		delete(p.open, name)
		p.closing.Go(pool.Close)
	}
	p.mu.Unlock()
	p.closing.Wait()
}

// evictIdle closes one idle connection of any target, to make room under the cap. It
// reports whether it closed one.
func (p *Pools) evictIdle() bool {
	p.mu.Lock()
	pools := make([]*pgxpool.Pool, 0, len(p.open))
	for _, pool := range p.open {
		pools = append(pools, pool)
	}
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, pool := range pools {
		if pool.Stat().IdleConns() == 0 {
			continue
		}
		idle := pool.AcquireAllIdle(ctx)
		if len(idle) == 0 {
			continue
		}
		conn := idle[0].Hijack()
		for _, c := range idle[1:] {
			c.Release()
		}
		_ = conn.Close(ctx) // closes the socket, which gives its token back
		return true
	}
	return false
}

// connLimit is the cap on connections across the targets' pools: a token per dialled
// socket, given back when the socket closes.
type connLimit struct {
	tokens chan struct{}
	evict  func() bool // closes one idle connection of any pool
}

// evictRetry is how often a dial waiting at the cap looks again for an idle connection
// to close: another target's connection may have become idle meanwhile.
const evictRetry = 50 * time.Millisecond

func (l *connLimit) acquire(ctx context.Context) error {
	for {
		select {
		case l.tokens <- struct{}{}:
			return nil
		default:
		}
		if l.evict() {
			continue
		}
		t := time.NewTimer(evictRetry)
		select {
		case l.tokens <- struct{}{}:
			t.Stop()
			return nil
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("the targets' connection cap is reached and no connection became free in time: %w", ctx.Err())
		case <-t.C:
		}
	}
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
func (l *connLimit) wrap(next pgconn.DialFunc) pgconn.DialFunc {
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
		if err := l.acquire(ctx); err != nil {
			return nil, err
		}
		nc, err := next(ctx, network, addr)
		if err != nil {
			<-l.tokens
			return nil, err
		}
		c = &limitedConn{Conn: nc, release: func() { <-l.tokens }}
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

func (c *limitedConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
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
