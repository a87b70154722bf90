package fleetsim

import (
	"bufio"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// echoServer answers every line with the same line until the client closes.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func testLink(t *testing.T) *link {
	t.Helper()
	host, port, _ := net.SplitHostPort(echoServer(t))
	l, err := newLink("host=" + host + " port=" + port + " user=u password=secret dbname=d")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.close)
	return l
}

func dial(t *testing.T, l *link) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", l.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// readLine reads one line from r, waiting at most d.
func readLine(c net.Conn, r *bufio.Reader, d time.Duration) (string, error) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	return r.ReadString('\n')
}

// openLink returns a link and a connection through it that was seen to echo.
func openLink(t *testing.T) (*link, net.Conn, *bufio.Reader) {
	t.Helper()
	l := testLink(t)
	c, r := dial(t, l)
	if !roundTrip(t, c, r, "before", 5*time.Second) {
		t.Fatal("no echo through an open link")
	}
	return l, c, r
}

// roundTrip sends line and reports whether its echo came back within d.
func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, line string, d time.Duration) bool {
	t.Helper()
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		return false
	}
	got, err := readLine(c, r, d)
	return err == nil && got == line+"\n"
}

// A frozen link holds what is sent and lets it through, in order, once thawed; a new
// connection made while frozen reaches the server only then.
func TestLinkFreezeHoldsAndThawDelivers(t *testing.T) {
	l, c, r := openLink(t)
	l.freeze()
	if roundTrip(t, c, r, "held", 300*time.Millisecond) {
		t.Fatal("an echo came through a frozen link")
	}
	c2, r2 := dial(t, l)
	if roundTrip(t, c2, r2, "new", 300*time.Millisecond) {
		t.Fatal("a connection made while frozen reached the server")
	}
	l.thaw()
	if got, err := readLine(c, r, 5*time.Second); err != nil || got != "held\n" {
		t.Fatalf("after the thaw: %q, %v; want the held line", got, err)
	}
	if got, err := readLine(c2, r2, 5*time.Second); err != nil || got != "new\n" {
		t.Fatalf("the connection made while frozen, after the thaw: %q, %v", got, err)
	}
}

// A cut link closes every connection, frozen ones too, and closes new ones at once.
func TestLinkCutClosesEverything(t *testing.T) {
	l, c, r := openLink(t)
	l.freeze()
	l.cutAll()
	if _, err := readLine(c, r, 5*time.Second); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("read on a cut connection: %v; want it closed", err)
	}
	c2, r2 := dial(t, l)
	if _, err := readLine(c2, r2, 5*time.Second); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("read on a connection made after the cut: %v; want it closed at once", err)
	}
}

func TestLinkDSN(t *testing.T) {
	l := testLink(t)
	port := l.ln.Addr().(*net.TCPAddr).Port
	for _, tc := range []struct{ in, want string }{
		{"host=db.example port=5433 user=u password=p dbname=d",
			"host=db.example port=5433 user=u password=p dbname=d host=127.0.0.1 port=" + strconv.Itoa(port)},
		{"postgres://u:p@db.example:5433,db2.example:5433/d?sslmode=disable",
			"postgres://u:p@127.0.0.1:" + strconv.Itoa(port) + "/d?sslmode=disable"},
	} {
		got, err := l.dsn(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("dsn(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
