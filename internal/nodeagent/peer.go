// Who a process attached to the node agent is, and which instance each process claimed:
// an instance is the process that claimed it, across the node agent's restarts too.

package nodeagent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"
)

// peerCred is a process on the other end of the node agent's socket: its uid and pid as
// the kernel gave them (SO_PEERCRED), and its start time (/proc/<pid>/stat), which a
// later process given the same pid does not share. pid is 0 when the peer runs in a pid
// namespace the node agent cannot see into, and start 0 when /proc does not show it.
type peerCred struct {
	UID   uint32 `json:"uid"`
	PID   int32  `json:"pid"`
	Start uint64 `json:"start"`
}

// credOf reads the peer's credentials of a unix connection; ok is false on any other.
func credOf(conn net.Conn) (peerCred, bool) {
	c, ok := conn.(*net.UnixConn)
	if !ok {
		return peerCred{}, false
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return peerCred{}, false
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || cerr != nil {
		return peerCred{}, false
	}
	p := peerCred{UID: cred.Uid, PID: cred.Pid}
	if p.PID > 0 {
		p.Start = procStart(p.PID)
	}
	return p, true
}

// procStart is the start time of process pid (clock ticks after boot), 0 when unknown.
func procStart(pid int32) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/stat")
	if err != nil {
		return 0
	}
	// The command is in parentheses and may hold anything: the fields follow the last ).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	fields := strings.Fields(string(b[i+1:]))
	// Field 22 of stat; fields[0] is field 3 (the state).
	if len(fields) < 20 {
		return 0
	}
	v, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return 0
	}
	return v
}

// known reports whether p names one process for good: its pid and start time are known.
func (p peerCred) known() bool { return p.PID > 0 && p.Start > 0 }

// same reports whether p and q are one process: the same uid, pid and start time, or,
// for peers whose pid cannot be seen, the same uid.
func (p peerCred) same(q peerCred) bool {
	if p.known() || q.known() {
		return p == q
	}
	return p.UID == q.UID
}

// running reports whether the process p names still runs (a known process: its pid with
// its start time; otherwise it cannot be told, and counts as running).
func (p peerCred) running() bool {
	if !p.known() {
		return true
	}
	return procStart(p.PID) == p.Start
}

func (p peerCred) String() string {
	if p.PID == 0 {
		return fmt.Sprintf("uid %d (pid not visible)", p.UID)
	}
	return fmt.Sprintf("pid %d uid %d", p.PID, p.UID)
}

// claimBinding is an instance's claimant, as the node agent keeps it: the peer's
// credentials when it attached on the unix socket, and the hash of the secret it presented
// (always over TCP, which has no peer credentials; over the socket too when the process
// sends one, as the library's does).
type claimBinding struct {
	Instance uuid.UUID `json:"instance"`
	Peer     *peerCred `json:"peer,omitempty"`
	Secret   string    `json:"secret_sha256,omitempty"`
	Since    time.Time `json:"since"`
}

// heldBy reports whether c is the process that made the claim: every credential that both
// the claim and c have is the same, and they have one at least in common.
func (b claimBinding) heldBy(c *nodeClient) bool {
	shared := false
	if b.Peer != nil && c.hasCred {
		if !b.Peer.same(c.cred) {
			return false
		}
		shared = true
	}
	if b.Secret != "" && c.secret != "" {
		if b.Secret != c.secret {
			return false
		}
		shared = true
	}
	return shared
}

// running reports whether the claimant still runs: a process whose pid and start time
// are known, by /proc; otherwise one known by its secret while a connection that
// presented that secret is attached (attached holds their hashes: over TCP the node agent
// cannot see a process end, only its connections close); otherwise it cannot be told,
// and counts as running.
func (b claimBinding) running(attached map[string]bool) bool {
	switch {
	case b.Peer != nil && b.Peer.known():
		return b.Peer.running()
	case b.Secret != "":
		return attached[b.Secret]
	}
	return true
}

// who names the claimant for messages and logs: its credentials, or a prefix of its
// secret's hash (which tells nothing of the secret).
func (b claimBinding) who() string {
	switch {
	case b.Peer != nil:
		return b.Peer.String()
	case len(b.Secret) >= 12:
		return "a process over TCP, secret sha256 " + b.Secret[:12] + "…"
	}
	return "a process of unknown credentials"
}

// runs says how the claimant is seen to run, for the impostor's message.
func (b claimBinding) runs() string {
	if b.Peer == nil || !b.Peer.known() && b.Secret != "" {
		return "which is attached"
	}
	return "which still runs"
}

// claimBindings are the node agent's instances and the processes that claimed them,
// kept in a file beside the socket so that they outlive a restart of the node agent: a
// process that attaches first after one cannot take another's instance. Owned by the
// session goroutine.
type claimBindings struct {
	path  string
	byID  map[uuid.UUID]claimBinding
	dirty bool
}

// loadBindings reads path; a missing file is none, a file that does not parse is an error.
func loadBindings(path string) (*claimBindings, error) {
	b := &claimBindings{path: path, byID: map[uuid.UUID]claimBinding{}}
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return b, nil
	}
	if err != nil {
		return nil, fmt.Errorf("liveness: node agent: read its claims (%s): %w", path, err)
	}
	var list []claimBinding
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, fmt.Errorf("liveness: node agent: its claims (%s) do not parse: %w; remove the file only once no "+
			"process is attached", path, err)
	}
	for _, c := range list {
		b.byID[c.Instance] = c
	}
	return b, nil
}

// save writes the bindings when they changed: a new file renamed over the old, so that a
// crash leaves one or the other.
func (b *claimBindings) save() error {
	if !b.dirty {
		return nil
	}
	list := make([]claimBinding, 0, len(b.byID))
	for _, c := range b.byID {
		list = append(list, c)
	}
	data, err := json.Marshal(list)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(b.path), filepath.Base(b.path)+".*")
	if err != nil {
		return fmt.Errorf("liveness: node agent: write its claims: %w", err)
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if err := cmpErr(werr, cerr); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("liveness: node agent: write its claims: %w", err)
	}
	if err := os.Rename(tmp.Name(), b.path); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("liveness: node agent: write its claims: %w", err)
	}
	b.dirty = false
	return nil
}

func cmpErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// bind makes c the claimant of id.
func (b *claimBindings) bind(id uuid.UUID, c *nodeClient) {
	cb := claimBinding{Instance: id, Secret: c.secret, Since: time.Now()}
	if c.hasCred {
		cred := c.cred
		cb.Peer = &cred
	}
	b.byID[id] = cb
	b.dirty = true
}

func (b *claimBindings) forget(id uuid.UUID) {
	if _, ok := b.byID[id]; ok {
		delete(b.byID, id)
		b.dirty = true
	}
}

// ended lists the instances whose claimant no longer runs (claimBinding.running).
func (b *claimBindings) ended(attached map[string]bool) []uuid.UUID {
	var out []uuid.UUID
	for id, c := range b.byID {
		if !c.running(attached) {
			out = append(out, id)
		}
	}
	return out
}
