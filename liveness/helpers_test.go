package liveness_test

// The helpers that more than one file of the tests in package liveness_test uses.

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

func agentConfig(db *pgtest.DB, pool *pgxpool.Pool) liveness.AgentConfig {
	return liveness.AgentConfig{
		Pool: pool, DirectDSN: db.DSN, Schema: liveness.DefaultSchema,
		InstanceID: uuid.New(), ServiceName: "agent-test", Mode: liveness.ModeAdvisoryLockWhenAvailable,
		Timing: liveness.Timing{HeartbeatInterval: 200 * time.Millisecond, HeartbeatSlowInterval: 400 * time.Millisecond,
			StaleThreshold: time.Second, DefinitiveDeadCutoff: 3 * time.Second},
		Reaper: true, ReaperInterval: 200 * time.Millisecond, ReaperLeaseTTL: 2 * time.Second,
	}
}

// newAgent is liveness.NewAgent for a configuration the test says is valid.
func newAgent(t testing.TB, cfg liveness.AgentConfig) *liveness.Agent {
	t.Helper()
	a, err := liveness.NewAgent(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// runAgent runs the agent until stop; done yields Run's error once it has returned.
func runAgent(t testing.TB, a *liveness.Agent) (stop context.CancelFunc, done <-chan error) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	out := make(chan error, 1)
	finished := make(chan struct{})
	go func() { defer close(finished); out <- a.Run(ctx) }()
	t.Cleanup(func() { stop(); <-finished })
	testutil.Eventually(t, 10*time.Second, "the agent beats (and holds its lock if it has one)", func() bool {
		s := a.Snapshot()
		return s.Heartbeat.Beats > 0 && (s.Mode == liveness.ModeHeartbeatTableOnly || s.AliveLock.Held)
	})
	return stop, out
}

func newTestLeases(t *testing.T, pool *pgxpool.Pool) *liveness.Leases {
	t.Helper()
	l, err := liveness.NewLeases(liveness.LeasesConfig{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// mustAcquire takes a lease that must be free and releases it when the test ends.
// fencedTx begins a transaction on pool that le fences; it is rolled back when the test
// ends, unless committed before.
func fencedTx(t *testing.T, ctx context.Context, pool *pgxpool.Pool, le *liveness.Lease) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if err := le.Fence(ctx, tx); err != nil {
		t.Fatalf("Fence: %v", err)
	}
	return tx
}

func mustAcquire(t *testing.T, ctx context.Context, l *liveness.Leases, name string, ttl time.Duration) *liveness.Lease {
	t.Helper()
	le, err := l.TryAcquire(ctx, name, ttl)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", name, err)
	}
	releaseAtEnd(t, le)
	return le
}

// releaseAtEnd releases le when the test ends.
func releaseAtEnd(t *testing.T, le *liveness.Lease) {
	t.Cleanup(func() {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = le.Release(rctx)
	})
}

// freezingProxy relays TCP to a server, each answer from the server delayed by a fixed
// time, until frozen; then it stops relaying without closing anything, as a network
// partition does, and holds what it read until thawed, when it delivers it, in order, as
// TCP retransmits what was in flight once a partition heals. With holdCloses, a side's
// close (its FIN) is held too, so that a session the server ends while frozen is seen to
// end only at the thaw; otherwise a close goes through at once. It only relays bytes to a
// real server; it fakes nothing.
type freezingProxy struct {
	ln              net.Listener
	upstream        string // the DSN it relays for
	holdCloses      bool
	delay           time.Duration
	network, target string
	done            chan struct{} // closed by close

	gateMu sync.Mutex
	thawed chan struct{} // nil while relaying; while frozen, closed by thaw
	once   sync.Once
	wg     sync.WaitGroup

	mu         sync.Mutex
	conns      []net.Conn
	refuseTill time.Time // new connections are closed at once until then
}

// refuseNewUntil closes every connection accepted before t at once, as a link that is up
// for what is established but refuses new connections.
func (p *freezingProxy) refuseNewUntil(t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuseTill = t
}

func newFreezingProxy(t *testing.T, dsn string, delay time.Duration) *freezingProxy {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	host, port := cfg.Host, cfg.Port
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezingProxy{ln: ln, upstream: dsn, delay: delay, network: "tcp", target: net.JoinHostPort(host, fmt.Sprint(port)),
		done: make(chan struct{})}
	if strings.HasPrefix(host, "/") { // a socket folder, when the tests use an existing server
		p.network, p.target = "unix", fmt.Sprintf("%s/.s.PGSQL.%d", host, port)
	}
	p.wg.Go(p.accept)
	return p
}

// dsn is the upstream DSN pointed at the proxy (a later keyword wins).
func (p *freezingProxy) dsn() string {
	return p.upstream + fmt.Sprintf(" host=127.0.0.1 port=%d", p.ln.Addr().(*net.TCPAddr).Port)
}

// freeze stops relaying: what is read from now on is held.
func (p *freezingProxy) freeze() {
	p.gateMu.Lock()
	defer p.gateMu.Unlock()
	if p.thawed == nil {
		p.thawed = make(chan struct{})
	}
}

// thaw delivers what was held, and relays again.
func (p *freezingProxy) thaw() {
	p.gateMu.Lock()
	defer p.gateMu.Unlock()
	if p.thawed != nil {
		close(p.thawed)
		p.thawed = nil
	}
}

// pass waits while the proxy is frozen. It returns false once the proxy is closed.
func (p *freezingProxy) pass() bool {
	p.gateMu.Lock()
	thawed := p.thawed
	p.gateMu.Unlock()
	if thawed == nil {
		return true
	}
	select {
	case <-thawed:
		return true
	case <-p.done:
		return false
	}
}

func (p *freezingProxy) close() {
	p.once.Do(func() {
		close(p.done)
		_ = p.ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
}

func (p *freezingProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		_ = c.Close()
		return false
	default:
	}
	p.conns = append(p.conns, c)
	return true
}

func (p *freezingProxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(client) {
			return
		}
		p.mu.Lock()
		refuse := time.Now().Before(p.refuseTill)
		p.mu.Unlock()
		if refuse {
			_ = client.Close()
			continue
		}
		server, err := net.DialTimeout(p.network, p.target, 5*time.Second)
		if err != nil {
			_ = client.Close()
			continue
		}
		if !p.track(server) {
			return
		}
		p.wg.Go(func() { p.relay(server, client, 0) })
		p.wg.Go(func() { p.relay(client, server, p.delay) })
	}
}

// relay copies until either side closes, each chunk delay late; while frozen it holds
// what it read.
func (p *freezingProxy) relay(dst, src net.Conn, delay time.Duration) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && delay > 0 {
			select {
			case <-time.After(delay):
			case <-p.done:
				return
			}
		}
		if n > 0 {
			if !p.pass() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !p.holdCloses || p.pass() { // a held close comes in order, after what was held
				_ = dst.Close()
			}
			return
		}
	}
}
