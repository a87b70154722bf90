// The node agent's server: its configuration, the unix socket and the TCP listener
// processes attach on, the queue of their requests for the session, and the
// notifications it hands on to them.

package nodeagent

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pg-liveness/pg_liveness_exporter/internal/alivelock"
	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/nodeagent/proto"
	"github.com/pg-liveness/pg_liveness_exporter/internal/notify"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// Config configures a Server. Zero values take the defaults of the alive lock's session
// (package defaults).
type Config struct {
	// DirectDSN reaches PostgreSQL itself, never a pooler in transaction mode: the one
	// session on which the node agent holds the alive locks of the processes attached.
	DirectDSN string
	Schema    string // "liveness" if empty
	// Socket is the path of the unix socket processes attach on
	// (AgentConfig.NodeAgentSocket). A socket left there by a previous run is replaced;
	// any other file there is an error. Socket, ListenAddress or both must be set.
	Socket string
	// SocketMode is the socket file's permissions, 0660 if zero: whoever may connect to
	// it may attach processes. An instance belongs to the process that claimed it (its
	// uid, pid and start time, from the socket's peer credentials, kept in ClaimsFile
	// across restarts): no other process may claim, hold or let go of it until its
	// claimant has ended and the fleet has called it dead.
	SocketMode fs.FileMode
	// ListenAddress, when set, is a TCP address ("host:port") processes attach on too
	// (AgentConfig.NodeAgentSocket "tcp://host:port"), where no unix socket can be shared:
	// in Kubernetes, behind a Service with internalTrafficPolicy Local. Only a process
	// that presents Token attaches, and an instance is bound to the secret its claimant
	// drew at its start (it presents it on every attach; ClaimsFile keeps its hash): over
	// TCP the node agent cannot see a process end, so a claimant has ended when no
	// connection that presented its secret is attached, and another process may claim its
	// instance once the fleet has called it dead too. Accepted connections carry TCP
	// keepalive and a user timeout: a peer that vanished without closing (its node lost)
	// is dropped within proto.TCPDeadPeer.
	ListenAddress string
	// Token is what a process must present to attach over TCP (AgentConfig.NodeAgentToken);
	// required with ListenAddress, at least 16 bytes. It is compared in constant time,
	// never logged, and never sent back.
	Token string
	// ClaimsFile keeps the instances' claimants across restarts of the node agent;
	// <Socket>.claims if empty, and it must be set without Socket.
	ClaimsFile string
	// ServiceName names the session: application_name "<ServiceName>:node-agent".
	ServiceName string

	KeepaliveIdle     time.Duration
	KeepaliveInterval time.Duration
	KeepaliveCount    int
	UserTimeout       time.Duration
	// VerifyInterval is how often the session proves itself while no process asks for a
	// proof; 30 s if zero. A dropped session is noticed at once anyway.
	VerifyInterval time.Duration
	// MaxConnections bounds the processes' connections open at once (one per attached
	// instance); 4,096 if zero. A connection past it is told why,
	// closed, counted (Snapshot.Refused) and logged.
	MaxConnections int
	// MaxMessageBytes bounds one line of the protocol; 16 KiB if
	// zero. A longer line is a protocol error: counted, logged, and its connection closed.
	MaxMessageBytes int

	Logger *slog.Logger // passwords removed; nil discards
}

// tcpAttachTimeout is how long a TCP connection may take to send its attach (a
// variable for the test of it).
var tcpAttachTimeout = 10 * time.Second

// Server is the node agent: it holds the alive locks of every process of its node on one
// direct session, and listens to the schema's channels once for them: the database
// serves one liveness backend, and one listener, per node instead of per process. A
// process attaches over the node agent's local socket, or its TCP listener with its
// token (AgentConfig.NodeAgentSocket), one connection per instance, and the connection
// is the lock: when it closes (the process exited, was killed, or its kernel closed its
// files) the node agent lets the lock go, and the fleet sees it vanish as it would have
// seen the process's own session end. A process proves its lock by asking: each proof is
// a verification of the node agent's session sent after the question arrived, so a
// leader's guarantees are those of a session of its own. When the node agent's session
// ends (or the node agent dies: the sockets close), every attached process notices at
// once and proves life by its heartbeat, so none of them is called dead; they attach
// again, and the node agent claims their locks again, when it is back.
type Server struct {
	cfg               Config
	connCfg           *pgx.ConnConfig
	clientUserTimeout time.Duration
	log               *slog.Logger
	verifyEvery       time.Duration

	claimSQL, verifySQL, holderSQL, releaseSQL, databaseSQL   string
	listenSQL, membersSQL, unmembersSQL, deadSQL, claimingSQL string

	// bindings are the instances and the processes that claimed them, kept beside the
	// socket; owned by the session goroutine once Run has loaded them.
	bindings  *claimBindings
	impostors atomic.Uint64 // attaches refused: another process's instance

	claimsFile      string
	tokenHash       [sha256.Size]byte // of cfg.Token
	listenAddr      atomic.Pointer[string]
	unauthenticated atomic.Uint64 // TCP connections refused: no attach, or a wrong token

	// The requests of the clients' readers, for the session goroutine, and the doorbell
	// that ends its wait.
	mu       sync.Mutex
	queue    []nodeRequest
	rung     bool
	wakeWait context.CancelCauseFunc
	clients  map[*nodeClient]struct{} // connected, for events; under mu

	running    atomic.Bool
	sessionUp  atomic.Bool
	listening  atomic.Bool
	backendPID atomic.Int64
	attached   atomic.Int64
	locksHeld  atomic.Int64
	claims     atomic.Uint64
	proofs     atomic.Uint64 // verifications sent
	proveAsked atomic.Uint64 // prove requests answered
	reconnects atomic.Uint64
	refused    atomic.Uint64 // attaches and connections refused (schema, database, limits)
	condition  logging.Repeats

	maxConns, maxMessage int
	connections          atomic.Int64  // open, attached or not
	acceptErrors         atomic.Uint64 // accepts that failed (and were retried)
	accepting            logging.Repeats
	protocolErrors       atomic.Uint64 // lines that are not the protocol, unknown ops, proofs asked unattached
	protocolLog          rareLog
	refusedLog           rareLog
}

// Snapshot is a point-in-time view of a Server, for exporters.
type Snapshot struct {
	Socket string
	// ListenAddress is the TCP address the node agent listens on (its port chosen, when
	// Config.ListenAddress named port 0); empty until it listens, and without one.
	ListenAddress string
	SessionUp     bool  // its session to the database is up
	Listening     bool  // that session listens to the schema's channels
	BackendPID    int64 // of that session; 0 while down
	Attached      int   // processes attached
	LocksHeld     int   // alive locks its session holds for them
	Claims        uint64
	Proofs        uint64 // verifications of its session sent
	ProveAsked    uint64 // proofs the processes asked for and got
	Reconnects    uint64 // sessions opened after the first
	Refused       uint64 // attaches refused (another schema or database) and connections past MaxConnections
	// AcceptErrors counts the accepts of the socket that failed (out of file
	// descriptors, say): each is retried, with back-off, and the node agent serves on.
	AcceptErrors uint64
	// ProtocolErrors counts what processes sent that is not the protocol: lines that do
	// not parse or are too long (their connection is closed), unknown ops, and proofs
	// asked before attaching (answered not held, at no cost to the database).
	ProtocolErrors uint64
	// Impostors counts attaches refused because they named an instance another process
	// claimed: one that still runs, or one that ended and is not dead yet by the verdict.
	Impostors uint64
	// Unauthenticated counts TCP connections closed before attaching: their first line
	// was not an attach with the node agent's token and a process secret, or none came
	// within 10 s.
	Unauthenticated uint64
}

// New checks the configuration; nothing connects or listens until Run.
func New(cfg Config) (*Server, error) {
	cfg.Logger = logging.Wrap(cfg.Logger)
	cfg.Schema = cmp.Or(cfg.Schema, defaults.Schema)
	cfg.ServiceName = cmp.Or(cfg.ServiceName, "pg_liveness_node_agent")
	cfg.SocketMode = cmp.Or(cfg.SocketMode, 0o660)
	if cfg.Socket == "" && cfg.ListenAddress == "" {
		return nil, &store.ConfigError{Field: "nodeagent.Config.Socket", Reason: "or nodeagent.Config.ListenAddress must be set"}
	}
	if err := checkListenAddress(cfg.ListenAddress); err != nil {
		return nil, err
	}
	if cfg.ListenAddress != "" && len(cfg.Token) < proto.TokenMin {
		reason := fmt.Sprintf("must be at least %d bytes with nodeagent.Config.ListenAddress: it is all that keeps whoever "+
			"reaches the TCP listener from attaching processes", proto.TokenMin)
		if cfg.Token == "" {
			reason = "must be set with nodeagent.Config.ListenAddress: it is all that keeps whoever reaches the TCP " +
				"listener from attaching processes"
		}
		return nil, &store.ConfigError{Field: "nodeagent.Config.Token", Reason: reason}
	}
	claims := cfg.ClaimsFile
	if claims == "" {
		if cfg.Socket == "" {
			return nil, &store.ConfigError{Field: "nodeagent.Config.ClaimsFile", Reason: "must be set without " +
				"nodeagent.Config.Socket: it keeps which process claimed each instance across restarts of the node agent"}
		}
		claims = cfg.Socket + ".claims"
	}
	if cfg.MaxConnections < 0 {
		return nil, &store.ConfigError{Field: "nodeagent.Config.MaxConnections", Reason: fmt.Sprintf("(%d) must not be negative", cfg.MaxConnections)}
	}
	if cfg.MaxMessageBytes != 0 && cfg.MaxMessageBytes < 1024 {
		return nil, &store.ConfigError{Field: "nodeagent.Config.MaxMessageBytes",
			Reason: fmt.Sprintf("(%d) must be at least 1024: a lease's name may be that long", cfg.MaxMessageBytes)}
	}
	lc := alivelock.Config{DSN: cfg.DirectDSN, InstanceID: uuid.Max, ServiceName: cfg.ServiceName,
		KeepaliveIdle: cfg.KeepaliveIdle, KeepaliveInterval: cfg.KeepaliveInterval, KeepaliveCount: cfg.KeepaliveCount,
		UserTimeout: cfg.UserTimeout, VerifyInterval: cfg.VerifyInterval}
	connCfg, clientUserTimeout, err := lc.ConnConfig()
	if err != nil {
		var ce *store.ConfigError
		if errors.As(err, &ce) {
			ce.Field = nodeAgentFields[ce.Field]
		}
		return nil, err
	}
	connCfg.RuntimeParams["application_name"] = cfg.ServiceName + ":node-agent"
	n := &Server{cfg: cfg, connCfg: connCfg, clientUserTimeout: clientUserTimeout, log: cfg.Logger,
		verifyEvery: cmp.Or(cfg.VerifyInterval, defaults.VerifyInterval),
		claimSQL:    store.AliveLockClaim.In(cfg.Schema).SQL, verifySQL: store.AliveLockVerify.In(cfg.Schema).SQL,
		holderSQL: store.AliveLockHolder.In(cfg.Schema).SQL, releaseSQL: store.AliveLockRelease.In(cfg.Schema).SQL,
		databaseSQL: store.LockDatabase.In(cfg.Schema).SQL, listenSQL: store.EventsListen.In(cfg.Schema).SQL,
		membersSQL: store.MembersListen.In(cfg.Schema).SQL, unmembersSQL: store.MembersUnlisten.In(cfg.Schema).SQL,
		deadSQL: store.NodeAgentDeadInstances.In(cfg.Schema).SQL, claimingSQL: store.NodeAgentRowsClaimingLocks.In(cfg.Schema).SQL,
		clients: map[*nodeClient]struct{}{}, claimsFile: claims, tokenHash: sha256.Sum256([]byte(cfg.Token)),
		maxConns: cmp.Or(cfg.MaxConnections, defaults.NodeAgentMaxConnections), maxMessage: cmp.Or(cfg.MaxMessageBytes, defaults.NodeAgentMaxMessageBytes)}
	connCfg.OnNotification = func(_ *pgconn.PgConn, note *pgconn.Notification) {
		if e, ok := notify.Parse(note.Payload); ok {
			n.broadcast(e)
		}
	}
	return n, nil
}

// checkListenAddress refuses a TCP address that is not "host:port" with a port number.
func checkListenAddress(addr string) error {
	if addr == "" {
		return nil
	}
	bad := func(why string) error {
		return &store.ConfigError{Field: "nodeagent.Config.ListenAddress", Reason: fmt.Sprintf("(%q) %s", addr, why)}
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return bad("is not host:port (\":9817\", \"0.0.0.0:9817\", \"[::]:9817\")")
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || port == "" || strconv.FormatUint(p, 10) != port {
		return bad("names no port number")
	}
	return nil
}

// nodeAgentFields maps the session's config fields (alivelock.Config's) to Config's.
var nodeAgentFields = map[string]string{
	alivelock.Field("DSN"):               "nodeagent.Config.DirectDSN",
	alivelock.Field("ServiceName"):       "nodeagent.Config.ServiceName",
	alivelock.Field("KeepaliveIdle"):     "nodeagent.Config.KeepaliveIdle",
	alivelock.Field("KeepaliveInterval"): "nodeagent.Config.KeepaliveInterval",
	alivelock.Field("KeepaliveCount"):    "nodeagent.Config.KeepaliveCount",
	alivelock.Field("UserTimeout"):       "nodeagent.Config.UserTimeout",
	alivelock.Field("VerifyInterval"):    "nodeagent.Config.VerifyInterval",
}

// Snapshot reports the node agent's state. It never blocks on the database.
func (n *Server) Snapshot() Snapshot {
	var listenAddr string
	if a := n.listenAddr.Load(); a != nil {
		listenAddr = *a
	}
	return Snapshot{Socket: n.cfg.Socket, ListenAddress: listenAddr, Unauthenticated: n.unauthenticated.Load(),
		SessionUp: n.sessionUp.Load(), Listening: n.listening.Load(),
		BackendPID: n.backendPID.Load(), Attached: int(n.attached.Load()), LocksHeld: int(n.locksHeld.Load()),
		Claims: n.claims.Load(), Proofs: n.proofs.Load(), ProveAsked: n.proveAsked.Load(),
		Reconnects: n.reconnects.Load(), Refused: n.refused.Load(), AcceptErrors: n.acceptErrors.Load(),
		ProtocolErrors: n.protocolErrors.Load(), Impostors: n.impostors.Load()}
}

// Run listens on the socket and the TCP address and holds the session until ctx ends;
// then it closes them and every process's connection, waits (at most 2 s) until the
// processes' rows no longer claim their locks, since each beats at once when its
// connection closes, and ends the session, which lets every lock go. It returns an error
// only when it cannot listen.
func (n *Server) Run(ctx context.Context) error {
	if !n.running.CompareAndSwap(false, true) {
		return errors.New("liveness: node agent: Run is already running")
	}
	defer n.running.Store(false)
	bindings, err := loadBindings(n.claimsFile)
	if err != nil {
		return err
	}
	n.bindings = bindings
	var listeners []net.Listener
	var socketFile os.FileInfo // the socket this run created, to remove only that one
	if n.cfg.Socket != "" {
		ln, err := n.listen()
		if err != nil {
			return err
		}
		if socketFile, err = os.Lstat(n.cfg.Socket); err != nil {
			_ = ln.Close()
			return fmt.Errorf("liveness: node agent: %w", err)
		}
		listeners = append(listeners, ln)
	}
	if n.cfg.ListenAddress != "" {
		lc := net.ListenConfig{KeepAliveConfig: proto.TCPKeepalive}
		ln, err := lc.Listen(ctx, "tcp", n.cfg.ListenAddress)
		if err != nil {
			for _, l := range listeners {
				_ = l.Close()
			}
			return fmt.Errorf("liveness: node agent: listen on %s: %w", n.cfg.ListenAddress, err)
		}
		listeners = append(listeners, ln)
		addr := ln.Addr().String()
		n.listenAddr.Store(&addr)
		defer n.listenAddr.Store(nil)
	}
	n.log.Info("node agent listening", "socket", n.cfg.Socket, "listen_address", n.Snapshot().ListenAddress)
	var wg sync.WaitGroup
	defer wg.Wait()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	for _, ln := range listeners {
		context.AfterFunc(runCtx, func() {
			if _, unix := ln.(*net.UnixListener); unix {
				n.removeSocket(socketFile)
			}
			_ = ln.Close()
		})
		wg.Go(func() { n.accept(runCtx, ln, &wg) })
	}
	n.hold(runCtx)
	stop()
	n.mu.Lock()
	for c := range n.clients {
		c.close()
	}
	n.mu.Unlock()
	return nil
}

// removeSocket removes the socket file when the node agent stops, while it still accepts:
// a successor that finds the file then finds it answering and does not take it, and one
// that finds none creates its own, which a later removal (after the hand-over, which can
// take seconds) would take away from under it. Only the file this run created goes.
func (n *Server) removeSocket(created os.FileInfo) {
	if fi, err := os.Lstat(n.cfg.Socket); err == nil && os.SameFile(fi, created) {
		_ = os.Remove(n.cfg.Socket)
	}
}

// listen creates the socket, replacing one a previous run left, never another file.
func (n *Server) listen() (net.Listener, error) {
	if fi, err := os.Lstat(n.cfg.Socket); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("liveness: node agent: %s exists and is not a socket; not replacing it", n.cfg.Socket)
		}
		if c, err := net.DialTimeout("unix", n.cfg.Socket, time.Second); err == nil {
			_ = c.Close()
			return nil, fmt.Errorf("liveness: node agent: another node agent listens on %s", n.cfg.Socket)
		}
		if err := os.Remove(n.cfg.Socket); err != nil {
			return nil, fmt.Errorf("liveness: node agent: remove the stale socket: %w", err)
		}
	}
	ln, err := net.Listen("unix", n.cfg.Socket)
	if err != nil {
		return nil, fmt.Errorf("liveness: node agent: listen on %s: %w", n.cfg.Socket, err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false) // removed before it closes, by removeSocket
	if err := os.Chmod(n.cfg.Socket, n.cfg.SocketMode); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("liveness: node agent: chmod %s: %w", n.cfg.Socket, err)
	}
	return ln, nil
}

// accept takes the processes' connections until ln closes; each gets a reader and a
// writer, owned by wg. A failed accept (out of file descriptors during a burst, say) is
// retried with back-off, logged once while it lasts and counted: the node agent never
// stops serving. A connection past MaxConnections is told why and closed.
func (n *Server) accept(ctx context.Context, ln net.Listener, wg *sync.WaitGroup) {
	var pause time.Duration
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			n.acceptErrors.Add(1)
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			n.accepting.Log(n.log, slog.LevelError, "failing", "node agent: accepting a process's connection failed; "+
				"retrying (processes wait to attach meanwhile)", "err", err, "retry_in", pause)
			select {
			case <-ctx.Done():
				return
			case <-time.After(pause):
			}
			continue
		}
		if pause > 0 {
			pause = 0
			n.accepting.Clear(n.log, "node agent: accepting connections again", "accept_errors", n.acceptErrors.Load())
		}
		if open := n.connections.Load(); open >= int64(n.maxConns) {
			n.refused.Add(1)
			reason := fmt.Sprintf("the node agent has %d connections open, the most it takes (--node-agent.max-connections)", open)
			n.refusedLog.warn(n.log, "node agent: connection refused", "reason", reason, "peer", peerOf(conn))
			_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
			_ = proto.Write(conn, proto.Message{Op: proto.OpError, Error: reason})
			_ = conn.Close()
			continue
		}
		n.connections.Add(1)
		proto.TuneTCP(conn)
		c := newNodeClient(conn, n.maxMessage)
		n.mu.Lock()
		n.clients[c] = struct{}{}
		n.mu.Unlock()
		wg.Go(func() { c.write(ctx) })
		wg.Go(func() {
			authenticated, refused := !c.tcp, false
			if !authenticated {
				_ = conn.SetReadDeadline(time.Now().Add(tcpAttachTimeout))
			}
			err := c.read(func(m proto.Message) bool {
				if !authenticated {
					if authenticated = n.authenticate(c, &m); !authenticated {
						refused = true
						return false
					}
					_ = conn.SetReadDeadline(time.Time{})
				} else if m.Op == proto.OpAttach && m.Secret != "" && c.secret == "" {
					c.secret = secretHash(m.Secret)
				}
				m.Token, m.Secret = "", ""
				n.request(nodeRequest{client: c, msg: m})
				return true
			})
			switch {
			case errors.Is(err, proto.ErrNotProtocol):
				n.protocolError(c, err)
			case !authenticated && errors.Is(err, os.ErrDeadlineExceeded):
				n.refuseUnauthenticated(c, fmt.Sprintf("no attach within %s of connecting", tcpAttachTimeout))
				refused = true
			}
			if refused {
				// Refused: the writer closes the connection once it has said why.
				select {
				case <-c.done:
				case <-time.After(time.Second):
				}
			}
			n.mu.Lock()
			delete(n.clients, c)
			n.mu.Unlock()
			c.close()
			n.connections.Add(-1)
			n.request(nodeRequest{client: c, gone: true})
		})
	}
}

// authenticate takes the first line of a TCP connection: it must be an attach with the
// node agent's token (compared in constant time) and a process secret. It reports
// whether it was; if not, the process is told why, the connection closed and counted.
func (n *Server) authenticate(c *nodeClient, m *proto.Message) bool {
	given := sha256.Sum256([]byte(m.Token))
	var reason string
	switch {
	case m.Op != proto.OpAttach:
		reason = fmt.Sprintf("the first line over TCP must be an attach with the node agent's token, not %q", m.Op)
	case m.Token == "":
		reason = "the attach carries no token: over TCP a process attaches with the node agent's token " +
			"(AgentConfig.NodeAgentToken)"
	case subtle.ConstantTimeCompare(given[:], n.tokenHash[:]) != 1:
		reason = "the attach's token is not the node agent's (AgentConfig.NodeAgentToken, --node-agent.token-file)"
	case len(m.Secret) < proto.TokenMin:
		reason = "the attach carries no process secret: over TCP an instance is bound to the secret of the process " +
			"that claimed it"
	}
	m.Token = ""
	if reason != "" {
		n.refuseUnauthenticated(c, reason)
		return false
	}
	c.secret = secretHash(m.Secret)
	return true
}

// secretHash is what the node agent keeps of a process's secret.
func secretHash(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

// refuseUnauthenticated tells a TCP connection why it may not attach, closes it once
// told, and counts and logs it (rarely). Neither the token nor the secret is logged.
func (n *Server) refuseUnauthenticated(c *nodeClient, reason string) {
	n.unauthenticated.Add(1)
	n.refusedLog.warn(n.log, "node agent: TCP connection refused: not authenticated", "peer", c.peer, "reason", reason)
	c.send(proto.Message{Op: proto.OpError, Error: reason})
	c.closeAfterSend()
}

// protocolError counts and logs (rarely) what a process sent that is not the protocol.
func (n *Server) protocolError(c *nodeClient, err error) {
	n.protocolErrors.Add(1)
	n.protocolLog.warn(n.log, "node agent: a process sent what is not the protocol", "peer", c.peer, "instance_id", c.instance,
		"err", err)
}

// rareLog logs a line at warning level at most once every rareLogEvery, saying how many
// like it it did not log since: a flood of bad input costs a line every few seconds.
type rareLog struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

const rareLogEvery = 10 * time.Second

func (r *rareLog) warn(l *slog.Logger, msg string, args ...any) {
	r.mu.Lock()
	if !r.last.IsZero() && time.Since(r.last) < rareLogEvery {
		r.suppressed++
		r.mu.Unlock()
		return
	}
	suppressed := r.suppressed
	r.last, r.suppressed = time.Now(), 0
	r.mu.Unlock()
	if suppressed > 0 {
		args = append(args, "not_logged_since_the_last", suppressed)
	}
	l.Warn(msg, args...)
}

// nodeRequest is a process's message, or its connection's end, for the session.
type nodeRequest struct {
	client *nodeClient
	msg    proto.Message
	gone   bool
}

// request queues r for the session goroutine and rings the doorbell.
func (n *Server) request(r nodeRequest) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.queue = append(n.queue, r)
	if n.wakeWait != nil {
		n.wakeWait(errRung)
		n.wakeWait = nil
		return
	}
	n.rung = true
}

var errRung = errors.New("liveness: node agent: a request came")

func (n *Server) take() []nodeRequest {
	n.mu.Lock()
	defer n.mu.Unlock()
	q := n.queue
	n.queue, n.rung = nil, false
	return q
}

// broadcast hands a notification to the processes it concerns: membership to those that
// asked for it, lease events to all. It never blocks: a process that does not read gets
// a resync once it does (its waiters then read the state again).
func (n *Server) broadcast(e notify.Event) {
	members := e.Kind == notify.Joined || e.Kind == notify.Left || e.Kind == notify.Dead
	m := proto.Message{Op: proto.OpEvent, Kind: e.Kind, ID: e.ID}
	n.mu.Lock()
	defer n.mu.Unlock()
	for c := range n.clients {
		if c.attached.Load() && (!members || c.wantMembers.Load()) {
			c.event(m)
		}
	}
}

// doorbell returns a channel closed at the next request (at once if one is queued), and
// the function that stops listening for it.
func (n *Server) doorbell(ctx context.Context) (<-chan struct{}, func()) {
	wctx, cancel := context.WithCancelCause(ctx)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.rung || len(n.queue) > 0 {
		cancel(errRung)
		return wctx.Done(), func() {}
	}
	n.wakeWait = cancel
	return wctx.Done(), func() {
		n.mu.Lock()
		n.wakeWait = nil
		n.mu.Unlock()
		cancel(nil)
	}
}
