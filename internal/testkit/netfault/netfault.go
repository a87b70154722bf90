// Package netfault makes the network faults the tests need, for real: a TCP proxy in
// front of a PostgreSQL server that can be frozen as a partition freezes a link, and thawed
// as it heals. It relays bytes to a real server; it fakes no answer.
package netfault

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Proxy relays TCP to a server, each answer from the server delayed by a fixed
// time, until frozen; then it stops relaying without closing anything, as a network
// partition does, and holds what it read until thawed, when it delivers it, in order, as
// TCP retransmits what was in flight once a partition heals. With HoldCloses, a side's
// close (its FIN) is held too, so that a session the server ends while frozen is seen to
// end only at the thaw; otherwise a close goes through at once. It only relays bytes to a
// real server; it fakes nothing.
type Proxy struct {
	ln              net.Listener
	upstream        string // the DSN it relays for
	HoldCloses      bool
	delay           time.Duration
	network, target string
	done            chan struct{} // closed by Close

	all  gate // every connection's, and those to come
	once sync.Once
	wg   sync.WaitGroup

	mu         sync.Mutex
	conns      []net.Conn
	links      []*gate   // each connection's own
	refuseTill time.Time // new connections are closed at once until then
}

// gate holds what a relay reads while frozen.
type gate struct {
	mu     sync.Mutex
	thawed chan struct{} // nil while relaying; while frozen, closed by thaw
}

func (g *gate) freeze() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.thawed == nil {
		g.thawed = make(chan struct{})
	}
}

func (g *gate) thaw() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.thawed != nil {
		close(g.thawed)
		g.thawed = nil
	}
}

// pass waits while the gate is frozen. It returns false once done is closed.
func (g *gate) pass(done <-chan struct{}) bool {
	g.mu.Lock()
	thawed := g.thawed
	g.mu.Unlock()
	if thawed == nil {
		return true
	}
	select {
	case <-thawed:
		return true
	case <-done:
		return false
	}
}

// RefuseNewUntil closes every connection accepted before t at once, as a link that is up
// for what is established but refuses new connections.
func (p *Proxy) RefuseNewUntil(t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuseTill = t
}

// NewProxy listens on a loopback port and relays to the server of dsn, every answer
// delay late. Close it when the test ends.
func NewProxy(t *testing.T, dsn string, delay time.Duration) *Proxy {
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
	p := &Proxy{ln: ln, upstream: dsn, delay: delay, network: "tcp", target: net.JoinHostPort(host, fmt.Sprint(port)),
		done: make(chan struct{})}
	if strings.HasPrefix(host, "/") { // a socket folder, when the tests use an existing server
		p.network, p.target = "unix", fmt.Sprintf("%s/.s.PGSQL.%d", host, port)
	}
	p.wg.Go(p.accept)
	return p
}

// DSN is the upstream DSN pointed at the proxy (a later keyword wins).
func (p *Proxy) DSN() string {
	return p.upstream + fmt.Sprintf(" host=127.0.0.1 port=%d", p.ln.Addr().(*net.TCPAddr).Port)
}

// Freeze stops relaying: what is read from now on is held.
func (p *Proxy) Freeze() { p.all.freeze() }

// FreezeEstablished stops relaying on the connections open now, as a cut whose old
// connections are stuck in the kernel's retransmission back-off after it healed, while a
// new connection gets through at once.
func (p *Proxy) FreezeEstablished() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, g := range p.links {
		g.freeze()
	}
}

// CutEstablished closes the connections open now, both of their sides, and goes on
// accepting new ones: the client learns that its session is gone, while the server's
// backend notices only when it next reads or writes (one waiting for a lock goes on,
// and commits).
func (p *Proxy) CutEstablished() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// Thaw delivers what was held, and relays again.
func (p *Proxy) Thaw() {
	p.all.thaw()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, g := range p.links {
		g.thaw()
	}
}

// pass waits while the proxy or the link is frozen. It returns false once the proxy is
// closed.
func (p *Proxy) pass(link *gate) bool {
	return p.all.pass(p.done) && link.pass(p.done)
}

func (p *Proxy) Close() {
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

func (p *Proxy) track(c net.Conn) bool {
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

func (p *Proxy) accept() {
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
		link := &gate{}
		p.mu.Lock()
		p.links = append(p.links, link)
		p.mu.Unlock()
		p.wg.Go(func() { p.relay(server, client, 0, link) })
		p.wg.Go(func() { p.relay(client, server, p.delay, link) })
	}
}

// relay copies until either side closes, each chunk delay late; while frozen it holds
// what it read.
func (p *Proxy) relay(dst, src net.Conn, delay time.Duration, link *gate) {
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
			if !p.pass(link) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !p.HoldCloses || p.pass(link) { // a held close comes in order, after what was held
				_ = dst.Close()
			}
			return
		}
	}
}
