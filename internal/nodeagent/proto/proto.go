// The node agent's wire protocol: its messages, their encoding one JSON object a line,
// and the settings of the TCP connections it runs on.

package proto

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"
)

// The node agent's protocol, on its local (unix) socket or its TCP listener: one JSON
// object per line, each way. A process attaches one instance per connection, and the
// connection is the lock: when it closes, however the process ended, the node agent lets
// the lock go.
//
// From the process:
//
//	{"op":"attach","instance":"<uuid>","schema":"liveness","database":"app","secret":"<hex>","token":"..."}
//	                                the secret is the process's own (drawn at its start);
//	                                the token, the node agent's, over TCP only, where the
//	                                attach must be the connection's first line
//	{"op":"prove","seq":N}          a proof of the lock, sent after this request arrived
//	{"op":"members","want":true}    forward the members channel's events, or stop
//
// From the node agent:
//
//	{"op":"state",...}              the lock's state, after the attach and at every change
//	{"op":"proof","seq":N,...}      the answer to a prove
//	{"op":"event","kind":"free","id":"<lease>"}  a notification of the schema's channels
//	{"op":"error","error":"..."}    the attach was refused; the node agent closes
const (
	OpAttach  = "attach"
	OpProve   = "prove"
	OpMembers = "members"
	OpState   = "state"
	OpProof   = "proof"
	OpEvent   = "event"
	OpError   = "error"
)

// Message is one line of the protocol. Fields not used by an op are left out.
type Message struct {
	Op string `json:"op"`

	// attach
	Instance uuid.UUID `json:"instance,omitzero"`
	Schema   string    `json:"schema,omitempty"`
	Database string    `json:"database,omitempty"`
	// Secret is the process's own: random, drawn when it started, the same on every
	// attach of the process; the node agent binds the instance to it (it keeps only its
	// hash). Token is the node agent's (its configured token), over TCP: the node agent
	// drops it as soon as it has compared it, and never logs either.
	Secret string `json:"secret,omitempty"`
	Token  string `json:"token,omitempty"`

	// prove, proof
	Seq uint64 `json:"seq,omitempty"`

	// state, proof: whether the node agent's session holds the instance's lock, the
	// session's backend pid, the claim it holds it by (a new one after every reconnect of
	// the session), and the server's clock when the claim or the verification ran.
	Held        bool      `json:"held,omitempty"`
	PID         int64     `json:"pid,omitempty"`
	Claim       uint64    `json:"claim,omitempty"`
	ServerClock time.Time `json:"server_clock,omitzero"`
	// state: the claim found the key held by another session of this instance (a
	// duplicate), or by a stranger's; and whether the session listens to the channels.
	Duplicate bool `json:"duplicate,omitempty"`
	Stranger  bool `json:"stranger,omitempty"`
	Listening bool `json:"listening,omitempty"`

	// members
	Want bool `json:"want,omitempty"`

	// event
	Kind string `json:"kind,omitempty"`
	ID   string `json:"id,omitempty"`

	// error
	Error string `json:"error,omitempty"`
}

// ErrNotProtocol matches the decoder's errors for what is not the protocol.
var ErrNotProtocol = errors.New("liveness: node agent protocol")

// Decoder reads the protocol's lines, each at most limit bytes.
type Decoder struct {
	r     *bufio.Reader
	limit int
}

// NewDecoder reads the messages of r.
func NewDecoder(r io.Reader, limit int) *Decoder {
	return &Decoder{r: bufio.NewReaderSize(r, 4096), limit: limit}
}

// Next reads one message. A line over the limit, or one that is not a message, is an
// error that is ErrNotProtocol: the peer speaks something else.
func (d *Decoder) Next() (Message, error) {
	var line []byte
	for {
		chunk, isPrefix, err := d.r.ReadLine()
		if err != nil {
			return Message{}, err
		}
		line = append(line, chunk...)
		if len(line) > d.limit {
			return Message{}, fmt.Errorf("%w: a line of over %d bytes", ErrNotProtocol, d.limit)
		}
		if !isPrefix {
			break
		}
	}
	var m Message
	if err := json.Unmarshal(line, &m); err != nil {
		return Message{}, fmt.Errorf("%w: %w", ErrNotProtocol, err)
	}
	if m.Op == "" {
		return Message{}, fmt.Errorf("%w: a line without an op", ErrNotProtocol)
	}
	return m, nil
}

// Write writes one message as a line.
func Write(w io.Writer, m Message) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// ClientQueue bounds the messages waiting on either end of a connection, of each kind:
// the node agent's for a process (control, events), a process's read from the node agent.
const ClientQueue = 64

// TokenMin is the shortest token the node agent takes, and so a process presents.
const TokenMin = 16

// TCPDeadPeer bounds how long a TCP connection to or from a node agent stays open after
// its peer vanished without closing it (its node or its network lost): keepalive probes
// after 5 s of silence, every second, five of them, and a user timeout of as much for
// data sent and not acknowledged. A process that is killed, however, closes its
// connection at once: its kernel sends FIN or RST.
const TCPDeadPeer = tcpKeepIdle + tcpKeepCount*tcpKeepInterval

const (
	tcpKeepIdle     = 5 * time.Second
	tcpKeepInterval = time.Second
	tcpKeepCount    = 5
)

// TCPKeepalive is the keepalive of TCP connections to and from node agents: the
// processes' dialer's and the node agent's listener's.
var TCPKeepalive = net.KeepAliveConfig{Enable: true, Idle: tcpKeepIdle, Interval: tcpKeepInterval,
	Count: tcpKeepCount}

// TuneTCP sets the user timeout of a TCP connection to or from a node agent (its
// keepalive is the dialer's or the listener's, TCPKeepalive): data unacknowledged for
// TCPDeadPeer ends the connection. Any other connection is left as it is.
func TuneTCP(conn net.Conn) {
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		return
	}
	if raw, err := tc.SyscallConn(); err == nil {
		_ = raw.Control(func(fd uintptr) {
			_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(TCPDeadPeer.Milliseconds()))
		})
	}
}
