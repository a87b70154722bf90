package soak

import (
	"net"
	"sync"
	"testing"
	"time"
)

// lockProxy relays a faultagent's alive-lock session (its --direct-dsn) to the current
// primary. Frozen, it holds whatever either side sends, the server's close included, and
// delivers it all, in order, when thawed: the late loss notice of a FIN delayed by
// retransmission, or of a process paused right after reading it (late_close). The same
// design as the library's tests' freezingProxy with held closes.
type lockProxy struct {
	ln     net.Listener
	target func() string // the current primary's address
	done   chan struct{}

	gateMu sync.Mutex
	thawed chan struct{} // nil while relaying; while frozen, closed by thaw
	once   sync.Once
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns []net.Conn
}

func newLockProxy(t *testing.T, target func() string) *lockProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lockProxy{ln: ln, target: target, done: make(chan struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// port is the proxy's port on 127.0.0.1.
func (p *lockProxy) port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// freeze stops relaying: what is read from now on is held.
func (p *lockProxy) freeze() {
	p.gateMu.Lock()
	defer p.gateMu.Unlock()
	if p.thawed == nil {
		p.thawed = make(chan struct{})
	}
}

// thaw delivers what was held, and relays again.
func (p *lockProxy) thaw() {
	p.gateMu.Lock()
	defer p.gateMu.Unlock()
	if p.thawed != nil {
		close(p.thawed)
		p.thawed = nil
	}
}

// pass waits while the proxy is frozen; false once it is closed.
func (p *lockProxy) pass() bool {
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

func (p *lockProxy) close() {
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

func (p *lockProxy) track(c net.Conn) bool {
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

// untrack forgets closed connections, so that the list stays short.
func (p *lockProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		for i, d := range p.conns {
			if d == c {
				p.conns = append(p.conns[:i], p.conns[i+1:]...)
				break
			}
		}
	}
}

func (p *lockProxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(client) {
			return
		}
		server, err := net.DialTimeout("tcp", p.target(), 5*time.Second)
		if err != nil {
			_ = client.Close()
			p.untrack(client)
			continue
		}
		if !p.track(server) {
			return
		}
		var pair sync.WaitGroup
		pair.Go(func() { p.relay(server, client) })
		pair.Go(func() { p.relay(client, server) })
		p.wg.Go(func() { pair.Wait(); p.untrack(client, server) })
	}
}

// relay copies from src to dst until src closes, then closes dst; while frozen it holds
// what it read, and the close after it.
func (p *lockProxy) relay(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				_ = src.Close()
				return
			}
		}
		if err != nil {
			if p.pass() {
				_ = dst.Close()
			}
			return
		}
	}
}
