package alivelock

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/lifegate"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/nodeagent/proto"
	"github.com/pg-liveness/pg_liveness_exporter/internal/notify"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// NodeConfig configures a Node lock.
type NodeConfig struct {
	// Socket is where the node agent listens (AgentConfig.NodeAgentSocket): a unix
	// socket's path, or "tcp://host:port" with Token.
	Socket     string
	Token      string
	InstanceID uuid.UUID
	Schema     string
	// Pool tells which database the process's statements reach: the node agent holds
	// locks in its own database only.
	Pool *pgxpool.Pool
	// LeaderVerifyInterval is how often the lock is proved while the instance leads; zero
	// means the leader's interval at the default lock grace (lifegate).
	LeaderVerifyInterval time.Duration
	Events               *notify.Hub
	Logger               *slog.Logger
}

// Node holds the instance's alive lock through the node agent of its node: the node
// agent's session claims it when the process attaches, and lets it go when the process's
// connection to it closes. It is a Lock, as Direct is: the proofs a leader needs are the
// node agent's verifications of its session, each sent after this process asked; and the
// node agent's session's notifications arrive on the same connection.
// Between proofs nothing is sent: the node agent tells when its session drops, and this
// process notices at once when the node agent's end of the connection closes.
type Node struct {
	state
	cfg         NodeConfig
	dbSQL       string
	log         *slog.Logger
	leaderEvery time.Duration
	wakeCh      chan struct{}

	// network and address are the node agent's (Socket); secret is this process's own,
	// drawn when the lock was made and presented on every attach: the node agent binds
	// the instance to it.
	network, address, secret string

	running       atomic.Bool
	connectedOnce bool
	dialFailed    bool   // the last dial of the socket failed: nobody listens there
	database      string // the pool's, read once
	condition     logging.Repeats
}

// NewNode prepares the lock. It does not connect; Run does.
func NewNode(cfg NodeConfig) *Node {
	n := &Node{cfg: cfg, dbSQL: store.LockDatabase.In(cfg.Schema).SQL, log: logging.Wrap(cfg.Logger),
		leaderEvery: cfg.LeaderVerifyInterval, wakeCh: make(chan struct{}, 1), network: "unix", address: cfg.Socket,
		secret: rand.Text()}
	if addr, ok := strings.CutPrefix(cfg.Socket, NodeAgentTCPScheme); ok {
		n.network, n.address = "tcp", addr
	}
	if n.leaderEvery <= 0 {
		n.leaderEvery = lifegate.Timing{Grace: defaults.LockGrace}.LeaderVerifyInterval()
	}
	n.state.init()
	n.state.wake = n.wakeNow
	if cfg.Events != nil {
		cfg.Events.OnMembersWantChanged(n.wakeNow)
	}
	return n
}

// wakeNow asks the connection for a proof now, and to tell the node agent whether
// membership events are wanted. Safe from any goroutine.
func (n *Node) wakeNow() {
	select {
	case n.wakeCh <- struct{}{}:
	default:
	}
}

// Run attaches, and attaches again after the connection ends (with backoff and jitter),
// until ctx ends; then it closes the connection, which lets the lock go.
func (n *Node) Run(ctx context.Context) error {
	if !n.running.CompareAndSwap(false, true) {
		return errors.New("liveness: node lock: Run is already running")
	}
	defer n.running.Store(false)
	for attempt := 1; n.database == ""; attempt++ {
		qctx, cancel := context.WithTimeout(ctx, StatementTimeout)
		err := n.cfg.Pool.QueryRow(qctx, n.dbSQL).Scan(&n.database)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		n.settledOnce() // no answer for now: the heartbeat need not wait
		n.condition.Log(n.log, slog.LevelWarn, "database", "cannot read the pool's database; retrying", "error", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(Backoff(attempt)):
		}
	}
	attempt := 0
	for {
		began := time.Now()
		held := n.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if held || time.Since(began) > ReconnectBackoffMax {
			attempt = 0
		}
		attempt++
		wait := Backoff(attempt)
		if n.dialFailed {
			// Nobody listens on the socket (the node agent restarts): a local dial costs
			// a system call, so try often, to attach within a fraction of a second of
			// its return however long it was away.
			wait = min(wait, nodeAgentRedialEvery)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// nodeAgentRedialEvery is the longest wait between two dials of a node agent's socket
// that nobody answered.
const nodeAgentRedialEvery = 100 * time.Millisecond

// NodeAgentTCPScheme starts NodeConfig.Socket (the library's AgentConfig.NodeAgentSocket)
// for a node agent's TCP listener.
const NodeAgentTCPScheme = "tcp://"

// nodeAgentTCPConnect bounds one TCP connect to a node agent, after its name resolved: a
// Service whose node has no node agent now may drop the connection's first packet rather
// than refuse it, and the dial is tried again 100 ms later.
const nodeAgentTCPConnect = 250 * time.Millisecond

// dial connects to the node agent: its unix socket, or its TCP address, each of the
// name's addresses in turn, with keepalive and a user timeout (proto.TCPDeadPeer).
func (n *Node) dial(ctx context.Context) (net.Conn, error) {
	if n.network == "unix" {
		d := net.Dialer{Timeout: ConnectTimeout}
		return d.DialContext(ctx, "unix", n.address)
	}
	host, port, err := net.SplitHostPort(n.address)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, ConnectTimeout)
	addrs, err := net.DefaultResolver.LookupHost(rctx, host)
	cancel()
	if err != nil {
		return nil, err
	}
	d := net.Dialer{Timeout: nodeAgentTCPConnect, KeepAliveConfig: proto.TCPKeepalive}
	var first error
	for _, a := range addrs {
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(a, port))
		if err == nil {
			proto.TuneTCP(conn)
			return conn, nil
		}
		first = cmp.Or(first, err)
	}
	return nil, first
}

// session runs one connection to the node agent; it reports whether the lock was held
// at some point.
func (n *Node) session(ctx context.Context) (held bool) {
	conn, err := n.dial(ctx)
	n.dialFailed = err != nil
	if err != nil {
		n.settledOnce()
		if ctx.Err() == nil {
			n.condition.Log(n.log, slog.LevelWarn, "connect",
				"cannot reach the node agent; retrying, the heartbeat goes on at the fast cadence",
				"node_agent", n.cfg.Socket, "error", err)
		}
		return false
	}
	if n.connectedOnce {
		n.reconnects.Add(1)
	}
	n.connectedOnce = true
	msgs := make(chan proto.Message, proto.ClientQueue)
	readErr := make(chan error, 1)
	go func() { // ends when conn is closed, below
		defer close(msgs)
		dec := proto.NewDecoder(conn, defaults.NodeAgentMaxMessageBytes)
		for {
			m, err := dec.Next()
			if err != nil {
				readErr <- err
				return
			}
			msgs <- m
		}
	}()
	defer func() {
		_ = conn.Close()
		for range msgs { // drain, so that the reader ends
		}
		n.cfg.Events.SetListening(false)
		if ctx.Err() != nil {
			n.release()
		} else {
			n.setHeld(false)
		}
	}()

	send := func(m proto.Message) bool {
		_ = conn.SetWriteDeadline(time.Now().Add(StatementTimeout))
		if err := proto.Write(conn, m); err != nil {
			if ctx.Err() == nil {
				n.condition.Log(n.log, slog.LevelWarn, "lost", "node agent connection lost; attaching again", "error", err)
			}
			return false
		}
		return true
	}
	attachSent := time.Now()
	attach := proto.Message{Op: proto.OpAttach, Instance: n.cfg.InstanceID, Schema: n.cfg.Schema, Database: n.database,
		Secret: n.secret}
	if n.network == "tcp" {
		attach.Token = n.cfg.Token
	}
	if !send(attach) {
		return false
	}
	var (
		seq        uint64
		asked      = map[uint64]time.Time{} // prove requests in flight, by when they were sent
		claim      uint64                   // the node agent's number of the claim it holds the lock by
		answered   bool                     // the attach was answered
		members    bool                     // told the node agent that membership is wanted
		listening  bool
		nextProof  time.Time
		proveTimer = time.NewTimer(time.Hour)
	)
	defer proveTimer.Stop()
	prove := func() bool {
		seq++
		asked[seq] = time.Now()
		nextProof = time.Now().Add(n.leaderEvery)
		return send(proto.Message{Op: proto.OpProve, Seq: seq})
	}
	for {
		if n.leading.Load() > 0 && n.held.Load() {
			proveTimer.Reset(max(time.Until(nextProof), 0))
		} else {
			proveTimer.Reset(time.Hour)
		}
		select {
		case <-ctx.Done():
			return held
		case <-proveTimer.C:
			if !prove() {
				return held
			}
		case <-n.wakeCh:
			if want := n.cfg.Events.MembersWanted(); want != members {
				if !send(proto.Message{Op: proto.OpMembers, Want: want}) {
					return held
				}
				members = want
			}
			if n.held.Load() && !prove() {
				return held
			}
		case m, ok := <-msgs:
			if !ok {
				if ctx.Err() == nil {
					err := <-readErr
					n.condition.Log(n.log, slog.LevelWarn, "lost",
						"node agent connection lost; the heartbeat proves life, attaching again", "held_before", n.held.Load(), "error", err)
				}
				return held
			}
			switch m.Op {
			case proto.OpState:
				if m.Listening != listening {
					listening = m.Listening
					n.cfg.Events.SetListening(listening)
					if listening {
						n.cfg.Events.Publish(notify.Event{Kind: notify.Resync})
					}
				}
				n.duplicate.Store(m.Duplicate)
				n.stranger.Store(m.Stranger)
				switch {
				case m.Held && (!n.held.Load() || m.Claim != claim):
					claim = m.Claim
					n.pid.Store(m.PID)
					n.claims.Add(1)
					if !answered {
						// The claim ran after the attach was sent: a proof.
						n.recordProof(Proof{Sent: attachSent, Claim: n.claims.Load(), ServerClock: m.ServerClock,
							RoundTrip: time.Since(attachSent)})
					}
					n.setHeld(true)
					held = true
					n.condition.Log(n.log, slog.LevelInfo, "held", "alive lock held through the node agent",
						"node_agent", n.cfg.Socket, "backend_pid", m.PID)
					if answered && !prove() { // claimed again by the node agent: prove it from here
						return held
					}
				case !m.Held && n.held.Load():
					n.setHeld(false)
					n.condition.Log(n.log, slog.LevelWarn, "vanished",
						"the node agent's session no longer holds the alive lock; the heartbeat proves life")
				case m.Duplicate:
					n.change(n.held.Load())
					n.condition.Log(n.log, slog.LevelWarn, "duplicate",
						"alive lock held by another session of this instance id (through the node agent); retrying")
				case m.Stranger:
					n.change(n.held.Load())
					n.condition.Log(n.log, slog.LevelError, "stranger",
						"alive lock's key held by a session that did not claim it for this instance: it counts for "+
							"nobody, and this instance is judged by its heartbeat until the key is free")
				}
				answered = true
				n.settledOnce()
				if want := n.cfg.Events.MembersWanted(); want != members {
					if !send(proto.Message{Op: proto.OpMembers, Want: want}) {
						return held
					}
					members = want
				}
			case proto.OpProof:
				sent, ok := asked[m.Seq]
				if !ok {
					continue
				}
				delete(asked, m.Seq)
				if m.Held && m.Claim == claim && n.held.Load() {
					n.recordProof(Proof{Sent: sent, Claim: n.claims.Load(), ServerClock: m.ServerClock,
						RoundTrip: time.Since(sent)})
				} else if n.held.Load() {
					n.setHeld(false)
				}
			case proto.OpEvent:
				n.cfg.Events.Publish(notify.Event{Kind: m.Kind, ID: m.ID})
			case proto.OpError:
				n.settledOnce()
				n.condition.Log(n.log, slog.LevelError, "refused:"+m.Error, "the node agent refused to hold this instance's lock",
					"node_agent", n.cfg.Socket, "reason", m.Error)
				return held
			}
		}
	}
}
