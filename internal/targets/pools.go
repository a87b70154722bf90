package targets

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
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
	MaxConns          int           // across all targets, each server an equal share; at least MaxConnsPerTarget
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
	servers map[string]string // of open: each pool's server (serverOf)
	closing sync.WaitGroup    // pools of replaced targets, closing while their last statements end

	entryServers map[string]string // by discover entry: its server (serverOf), as first asked
	turns        map[string]*turns // by server: its databases' scrapes (Turn)
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
	p := &Pools{opts: opts, cfg: cfg, open: map[string]*pgxpool.Pool{}, servers: map[string]string{},
		entryServers: map[string]string{}, turns: map[string]*turns{}}
	p.limit = newConnLimit(opts.MaxConns, p.evictIdle)
	p.limit.setShare(servers(cfg))
	return p, nil
}

// servers counts the servers (host and port) that cfg's targets and discover entries are
// on: each may hold an equal share of the cap.
func servers(cfg *Config) int {
	seen := map[string]bool{}
	for _, t := range cfg.targets {
		seen[serverOf(t.dsn)] = true
	}
	for _, s := range cfg.discover {
		seen[serverOf(s.dsn(s.Maintenance))] = true
	}
	return len(seen)
}

// serverOf is the server a DSN connects to: its (first) host and port.
func serverOf(dsn string) string {
	c, err := pgconn.ParseConfig(dsn)
	if err != nil { // validated when the file was loaded
		return "?"
	}
	return net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port)))
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
	return p.openLocked(name, t.dsn, p.opts.MaxConnsPerTarget)
}

// openLocked opens the pool of key (a target's name, or discoveredKey) on dsn, of at most
// conns connections, without connecting. p.mu is held.
func (p *Pools) openLocked(key, dsn string, conns int32) (*pgxpool.Pool, bool, error) {
	server := serverOf(dsn)
	pool, err := database.NewPool(database.PoolConfig{
		DSN: dsn, MaxConns: conns, ApplicationName: p.opts.ApplicationName,
		ConnectTimeout: p.opts.ConnectTimeout, Logger: p.opts.Logger, MaxConnIdleTime: p.opts.IdleTimeout,
		WrapDial: p.limit.wrapFor(server),
	})
	if err != nil {
		return nil, true, err
	}
	p.open[key], p.servers[key] = pool, server
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
	// One connection: a server's databases are many, and their scrapes take turns
	// (Turn); a database's collectors take turns on its connection.
	return p.openLocked(key, srv.dsn(db), 1)
}

// Turn waits, within ctx, for a turn to scrape a database of discover entry entry, whose
// scrape has databases of the entry's server. Each server gives at most turnsOf(its share
// of the cap) at once, so that its databases' scrapes do not each dial for a connection
// the cap cannot give (closing one another's), and leave a little of the share to the
// entry's maintenance database and re-checks. A turn held longer than its share of the
// scrape's time while others wait is taken back (turns). It returns the scrape's context
// and the function that ends the turn; the error is ctx's, or says the entry is gone.
func (p *Pools) Turn(ctx context.Context, entry string, databases int) (context.Context, func(), error) {
	p.mu.Lock()
	srv, ok := p.cfg.discover[entry]
	var t *turns
	if ok {
		server := p.entryServers[entry]
		if server == "" {
			server = serverOf(srv.dsn(srv.Maintenance))
			p.entryServers[entry] = server
		}
		n := turnsOf(p.limit.shareOf())
		if t = p.turns[server]; t == nil || t.size != n { // new, or the share changed: later turns count anew
			t = newTurns(n)
			p.turns[server] = t
		}
	}
	p.mu.Unlock()
	if !ok {
		return nil, nil, errors.New("the discover entry was removed")
	}
	scrape, release, err := t.take(ctx, databases)
	if err != nil {
		return nil, nil, err
	}
	return scrape, func() {
		release()
		p.limit.poke() // the database's connection turned idle
	}, nil
}

// turnsOf is how many databases of one server are scraped at once with a share of n
// connections: all but two (one for the maintenance database's shared read of pg_locks,
// one for a re-check), at least one.
func turnsOf(n int) int { return max(1, n-2) }

// ForgetDiscovered closes the pool of a discovered database that is gone or no longer
// holds the source, in the background once its statements in flight end.
func (p *Pools) ForgetDiscovered(server, db string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := discoveredKey(server, db)
	if pool := p.open[key]; pool != nil {
		delete(p.open, key)
		delete(p.servers, key)
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
		delete(p.servers, name)
		p.closing.Go(pool.Close)
	}
	p.cfg = cfg
	clear(p.entryServers) // an entry's host or port may have changed
	p.limit.setShare(servers(cfg))
}

// Conns is how many connections the targets' pools hold together (dialled and not yet
// closed).
func (p *Pools) Conns() int { return p.limit.held() }

// Files is Config.Files of the configuration in force.
func (p *Pools) Files() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg.Files()
}

// Close closes every pool and waits for them.
func (p *Pools) Close() {
	p.mu.Lock()
	for name, pool := range p.open {
		delete(p.open, name)
		delete(p.servers, name)
		p.closing.Go(pool.Close)
	}
	p.mu.Unlock()
	p.closing.Wait()
}

// evictIdle closes one idle connection of a pool on server (of any pool for ""), to make
// room under the cap. It reports whether it closed one.
func (p *Pools) evictIdle(server string) bool {
	p.mu.Lock()
	pools := make([]*pgxpool.Pool, 0, len(p.open))
	for key, pool := range p.open {
		if server == "" || p.servers[key] == server {
			pools = append(pools, pool)
		}
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
