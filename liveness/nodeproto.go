package liveness

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/google/uuid"
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
	nodeOpAttach  = "attach"
	nodeOpProve   = "prove"
	nodeOpMembers = "members"
	nodeOpState   = "state"
	nodeOpProof   = "proof"
	nodeOpEvent   = "event"
	nodeOpError   = "error"
)

// nodeMessage is one line of the protocol. Fields not used by an op are left out.
type nodeMessage struct {
	Op string `json:"op"`

	// attach
	Instance uuid.UUID `json:"instance,omitzero"`
	Schema   string    `json:"schema,omitempty"`
	Database string    `json:"database,omitempty"`
	// Secret is the process's own: random, drawn when it started, the same on every
	// attach of the process; the node agent binds the instance to it (it keeps only its
	// hash). Token is the node agent's (NodeAgentConfig.Token), over TCP: the node agent
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

// errNotProtocol matches the decoder's errors for what is not the protocol.
var errNotProtocol = errors.New("liveness: node agent protocol")

// nodeDecoder reads the protocol's lines, each at most limit bytes.
type nodeDecoder struct {
	r     *bufio.Reader
	limit int
}

func newNodeDecoder(r io.Reader, limit int) *nodeDecoder {
	return &nodeDecoder{r: bufio.NewReaderSize(r, 4096), limit: limit}
}

// next reads one message. A line over the limit, or one that is not a message, is an
// error that is errNotProtocol: the peer speaks something else.
func (d *nodeDecoder) next() (nodeMessage, error) {
	var line []byte
	for {
		chunk, isPrefix, err := d.r.ReadLine()
		if err != nil {
			return nodeMessage{}, err
		}
		line = append(line, chunk...)
		if len(line) > d.limit {
			return nodeMessage{}, fmt.Errorf("%w: a line of over %d bytes", errNotProtocol, d.limit)
		}
		if !isPrefix {
			break
		}
	}
	var m nodeMessage
	if err := json.Unmarshal(line, &m); err != nil {
		return nodeMessage{}, fmt.Errorf("%w: %w", errNotProtocol, err)
	}
	if m.Op == "" {
		return nodeMessage{}, fmt.Errorf("%w: a line without an op", errNotProtocol)
	}
	return m, nil
}

// writeNodeMessage writes one message as a line.
func writeNodeMessage(w io.Writer, m nodeMessage) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
