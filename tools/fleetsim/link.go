package fleetsim

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
)

// link is one network path of a simulated instance to PostgreSQL: a TCP relay on
// 127.0.0.1 that the fleet can freeze or cut, so that a fault is a real condition of
// the instance's sockets rather than a flag inside its code.
//
//   - Frozen: every connection stays open and nothing moves through it, in either
//     direction, closes included; new connections are accepted and never reach the
//     server. From the server's side this is a stopped process (SIGSTOP): its sessions,
//     and so its alive lock, stay.
//   - Cut: every connection is closed and new ones are closed as soon as they are
//     accepted. From the server's side this is a dead process: its sessions end, which
//     releases its alive lock at once.
//
// A cut link stays cut; a frozen one can be thawed.
type link struct {
	ln              net.Listener
	network, target string

	mu     sync.Mutex
	cut    bool
	thawed chan struct{} // closed while the link is not frozen
	conns  map[net.Conn]struct{}
	closed chan struct{} // closed by cutAll: wakes every relay held by a freeze
	wg     sync.WaitGroup
}

// newLink listens on 127.0.0.1 and relays to the server that dsnString names (its first
// host).
func newLink(dsnString string) (*link, error) {
	cfg, err := pgconn.ParseConfig(dsnString)
	if err != nil {
		return nil, logging.RedactError(err)
	}
	network, target := "tcp", net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port))
	if strings.HasPrefix(cfg.Host, "/") {
		network, target = "unix", fmt.Sprintf("%s/.s.PGSQL.%d", cfg.Host, cfg.Port)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	thawed := make(chan struct{})
	close(thawed)
	l := &link{ln: ln, network: network, target: target, thawed: thawed,
		conns: map[net.Conn]struct{}{}, closed: make(chan struct{})}
	l.wg.Go(l.accept)
	return l, nil
}

func (l *link) port() int { return l.ln.Addr().(*net.TCPAddr).Port }

// dsn returns s pointed at the link: the same user, password, database and options,
// with 127.0.0.1 and the link's port as the only host.
func (l *link) dsn(s string) (string, error) {
	if strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://") {
		u, err := url.Parse(s)
		if err != nil {
			return "", logging.RedactError(err)
		}
		u.Host = fmt.Sprintf("127.0.0.1:%d", l.port())
		q := u.Query()
		q.Del("host")
		q.Del("port")
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	// In a keyword/value DSN a later keyword wins.
	return fmt.Sprintf("%s host=127.0.0.1 port=%d", s, l.port()), nil
}

// freeze holds every byte and close from now on, until thaw.
func (l *link) freeze() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.thawed:
		l.thawed = make(chan struct{})
	default: // already frozen
	}
}

// thaw lets what a freeze held through, in order.
func (l *link) thaw() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.thawed:
	default:
		close(l.thawed)
	}
}

// cutAll closes every connection, and every later one as soon as it is accepted.
func (l *link) cutAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut {
		return
	}
	l.cut = true
	close(l.closed)
	for c := range l.conns {
		_ = c.Close()
	}
	clear(l.conns)
}

// close cuts the link, stops listening and waits for every relay.
func (l *link) close() {
	l.cutAll()
	_ = l.ln.Close()
	l.wg.Wait()
}

// gate returns a channel that is closed while the link lets data through, and false
// once the link is cut.
func (l *link) gate() (<-chan struct{}, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.thawed, !l.cut
}

// pass waits until data may go through; false when the link was cut meanwhile.
func (l *link) pass() bool {
	thawed, ok := l.gate()
	if !ok {
		return false
	}
	select {
	case <-thawed:
		_, ok = l.gate()
		return ok
	case <-l.closed:
		return false
	}
}

func (l *link) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut {
		_ = c.Close()
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *link) untrack(c net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.conns, c)
	_ = c.Close()
}

func (l *link) accept() {
	for {
		client, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if !l.track(client) {
			continue // cut: refused at once
		}
		l.wg.Go(func() { l.serve(client) })
	}
}

// serve connects client to the server once the link lets it, then relays both ways.
func (l *link) serve(client net.Conn) {
	defer l.untrack(client)
	if !l.pass() {
		return
	}
	server, err := net.DialTimeout(l.network, l.target, 5*time.Second)
	if err != nil {
		return
	}
	if !l.track(server) {
		return
	}
	defer l.untrack(server)
	done := make(chan struct{}, 2)
	go func() { l.relay(server, client); done <- struct{}{} }()
	go func() { l.relay(client, server); done <- struct{}{} }()
	<-done
	// One side ended (and the other was told, unless the link was cut or frozen since):
	// close both, which ends the other relay.
	if l.pass() {
		_ = client.Close()
		_ = server.Close()
	}
	<-done
}

// relay copies src to dst, each chunk and the final close only when the link lets it.
func (l *link) relay(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !l.pass() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if l.pass() {
				_ = dst.Close()
			}
			return
		}
	}
}
