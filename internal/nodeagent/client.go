// One attached process's connection, as the node agent sees it: its queues of messages,
// read and written by goroutines of its own.

package nodeagent

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/pg-liveness/pg_liveness_exporter/internal/nodeagent/proto"
	"github.com/pg-liveness/pg_liveness_exporter/internal/notify"
)

// peerOf names a process's connection by its credentials (SO_PEERCRED) on the unix
// socket, by its address over TCP, for the logs.
func peerOf(conn net.Conn) string {
	c, ok := conn.(*net.UnixConn)
	if !ok {
		if a := conn.RemoteAddr(); a != nil {
			return "tcp " + a.String()
		}
		return ""
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return ""
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || cerr != nil {
		return ""
	}
	return fmt.Sprintf("pid=%d uid=%d", cred.Pid, cred.Uid)
}

// nodeClient is one process's connection.
type nodeClient struct {
	conn        net.Conn
	peer        string
	control     chan proto.Message // state, proof, error: never dropped (a client that lets them pile up is dropped)
	events      chan proto.Message // notifications: dropped when full, then a resync
	dropped     atomic.Bool
	attached    atomic.Bool
	wantMembers atomic.Bool
	closeOnce   sync.Once
	done        chan struct{}
	sentLast    chan struct{} // closed by closeAfterSend: close once control is drained

	maxMessage int      // the longest line read
	cred       peerCred // the process on the other end, when hasCred (the unix socket)
	hasCred    bool
	tcp        bool // attached over TCP: its first line must be an authenticated attach
	// secret is the hex SHA-256 of the process's secret, set by the reader before it
	// hands on the attach (empty when it sent none).
	secret string

	// Owned by the session goroutine.
	instance            uuid.UUID
	database            string
	held                bool
	claim               uint64
	duplicate, stranger bool
	askedHolder         time.Time
}

func newNodeClient(conn net.Conn, maxMessage int) *nodeClient {
	cred, hasCred := credOf(conn)
	_, tcp := conn.(*net.TCPConn)
	return &nodeClient{conn: conn, control: make(chan proto.Message, proto.ClientQueue),
		events: make(chan proto.Message, proto.ClientQueue), done: make(chan struct{}), sentLast: make(chan struct{}),
		peer: peerOf(conn), maxMessage: maxMessage, cred: cred, hasCred: hasCred, tcp: tcp}
}

// who names the process for the impostor's log line: its credentials, or its address.
func (c *nodeClient) who() string {
	if c.hasCred {
		return c.cred.String()
	}
	return c.peer
}

// send queues a control message; a process that does not read them is dropped (its
// connection closed, which lets its lock go).
func (c *nodeClient) send(m proto.Message) {
	select {
	case c.control <- m:
	default:
		c.close()
	}
}

// event queues a notification, or notes that one was dropped.
func (c *nodeClient) event(m proto.Message) {
	select {
	case c.events <- m:
	default:
		c.dropped.Store(true)
	}
}

func (c *nodeClient) close() {
	c.closeOnce.Do(func() {
		close(c.done)
		_ = c.conn.Close()
	})
}

// closeAfterSend closes the connection once the queued control messages are written.
func (c *nodeClient) closeAfterSend() {
	select {
	case <-c.sentLast:
	default:
		close(c.sentLast)
	}
}

// read hands each message to handle until the connection ends or handle returns false,
// and returns why it ended: an error that is proto.ErrNotProtocol when the process sent
// something else, nil when handle ended it.
func (c *nodeClient) read(handle func(proto.Message) bool) error {
	d := proto.NewDecoder(c.conn, c.maxMessage)
	for {
		m, err := d.Next()
		if err != nil {
			return err
		}
		if !handle(m) {
			return nil
		}
	}
}

// write sends the queued messages, control first, until the connection ends.
func (c *nodeClient) write(ctx context.Context) {
	for {
		select {
		case m := <-c.control:
			if proto.Write(c.conn, m) != nil {
				c.close()
				return
			}
			continue
		default:
		}
		select {
		case <-ctx.Done():
			c.close()
			return
		case <-c.done:
			return
		case m := <-c.control:
			if proto.Write(c.conn, m) != nil {
				c.close()
				return
			}
		case <-c.sentLast:
			if len(c.control) == 0 {
				c.close()
				return
			}
		case m := <-c.events:
			if proto.Write(c.conn, m) != nil {
				c.close()
				return
			}
			if len(c.events) == 0 && c.dropped.Swap(false) {
				c.event(proto.Message{Op: proto.OpEvent, Kind: notify.Resync})
			}
		}
	}
}
