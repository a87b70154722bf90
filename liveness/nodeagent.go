package liveness

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sys/unix"

	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// NodeAgentConfig configures a NodeAgent. Zero values take the defaults of the alive
// lock's session (the Default* constants).
type NodeAgentConfig struct {
	// DirectDSN reaches PostgreSQL itself, never a pooler in transaction mode: the one
	// session on which the node agent holds the alive locks of the processes attached.
	DirectDSN string
	Schema    string // DefaultSchema if empty
	// Socket is the path of the unix socket processes attach on
	// (AgentConfig.NodeAgentSocket). A socket left there by a previous run is replaced;
	// any other file there is an error.
	Socket string
	// SocketMode is the socket file's permissions, 0660 if zero: whoever may connect to
	// it may hold and let go the lock of any instance id it names.
	SocketMode fs.FileMode
	// ServiceName names the session: application_name "<ServiceName>:node-agent".
	ServiceName string

	KeepaliveIdle     time.Duration
	KeepaliveInterval time.Duration
	KeepaliveCount    int
	UserTimeout       time.Duration
	// VerifyInterval is how often the session proves itself while no process asks for a
	// proof; DefaultVerifyInterval if zero. A dropped session is noticed at once anyway.
	VerifyInterval time.Duration

	Logger *slog.Logger // passwords removed; nil discards
}

// NodeAgent holds the alive locks of every process of its node on one direct session,
// and listens to the schema's channels once for them: the database serves one liveness
// backend, and one listener, per node instead of per process. A process attaches over
// the node agent's local socket (AgentConfig.NodeAgentSocket), one connection per
// instance, and the connection is the lock: when it closes (the process exited, was
// killed, or its kernel closed its files) the node agent lets the lock go, and the fleet
// sees it vanish as it would have seen the process's own session end. A process proves
// its lock by asking: each proof is a verification of the node agent's session sent after
// the question arrived, so a leader's guarantees are those of a session of its own. When
// the node agent's session ends (or the node agent dies: the sockets close), every
// attached process notices at once and proves life by its heartbeat, so none of them is
// called dead; they attach again, and the node agent claims their locks again, when it
// is back.
type NodeAgent struct {
	cfg               NodeAgentConfig
	connCfg           *pgx.ConnConfig
	clientUserTimeout time.Duration
	log               *slog.Logger
	verifyEvery       time.Duration

	claimSQL, verifySQL, holderSQL, releaseSQL, databaseSQL string
	listenSQL, membersSQL, unmembersSQL                     string

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
	refused    atomic.Uint64 // attaches refused (schema, database, protocol)
	condition  logging.Repeats
}

// NodeAgentSnapshot is a point-in-time view of a NodeAgent, for exporters.
type NodeAgentSnapshot struct {
	Socket     string
	SessionUp  bool  // its session to the database is up
	Listening  bool  // that session listens to the schema's channels
	BackendPID int64 // of that session; 0 while down
	Attached   int   // processes attached
	LocksHeld  int   // alive locks its session holds for them
	Claims     uint64
	Proofs     uint64 // verifications of its session sent
	ProveAsked uint64 // proofs the processes asked for and got
	Reconnects uint64 // sessions opened after the first
	Refused    uint64 // attaches refused: another schema or database, or not the protocol
}

// NewNodeAgent checks the configuration; nothing connects or listens until Run.
func NewNodeAgent(cfg NodeAgentConfig) (*NodeAgent, error) {
	cfg.Logger = logging.Wrap(cfg.Logger)
	cfg.Schema = cmp.Or(cfg.Schema, DefaultSchema)
	cfg.ServiceName = cmp.Or(cfg.ServiceName, "pg_liveness_node_agent")
	cfg.SocketMode = cmp.Or(cfg.SocketMode, 0o660)
	if cfg.Socket == "" {
		return nil, &ConfigError{Field: "NodeAgentConfig.Socket", Reason: "must be set"}
	}
	lc := aliveLockConfig{DSN: cfg.DirectDSN, Schema: cfg.Schema, InstanceID: uuid.Max, ServiceName: cfg.ServiceName,
		KeepaliveIdle: cfg.KeepaliveIdle, KeepaliveInterval: cfg.KeepaliveInterval, KeepaliveCount: cfg.KeepaliveCount,
		UserTimeout: cfg.UserTimeout, VerifyInterval: cfg.VerifyInterval}
	connCfg, clientUserTimeout, err := lc.connConfig()
	if err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			ce.Field = nodeAgentFields[ce.Field]
		}
		return nil, err
	}
	connCfg.RuntimeParams["application_name"] = cfg.ServiceName + ":node-agent"
	n := &NodeAgent{cfg: cfg, connCfg: connCfg, clientUserTimeout: clientUserTimeout, log: cfg.Logger,
		verifyEvery: cmp.Or(cfg.VerifyInterval, DefaultVerifyInterval),
		claimSQL:    store.AliveLockClaim.In(cfg.Schema).SQL, verifySQL: store.AliveLockVerify.In(cfg.Schema).SQL,
		holderSQL: store.AliveLockHolder.In(cfg.Schema).SQL, releaseSQL: store.AliveLockRelease.In(cfg.Schema).SQL,
		databaseSQL: store.LockDatabase.In(cfg.Schema).SQL, listenSQL: store.EventsListen.In(cfg.Schema).SQL,
		membersSQL: store.MembersListen.In(cfg.Schema).SQL, unmembersSQL: store.MembersUnlisten.In(cfg.Schema).SQL,
		clients: map[*nodeClient]struct{}{}}
	connCfg.OnNotification = func(_ *pgconn.PgConn, note *pgconn.Notification) {
		if e, ok := parseEvent(note.Payload); ok {
			n.broadcast(e)
		}
	}
	return n, nil
}

// nodeAgentFields maps the session's config fields to NodeAgentConfig's.
var nodeAgentFields = map[string]string{
	"aliveLockConfig.DSN":               "NodeAgentConfig.DirectDSN",
	"aliveLockConfig.ServiceName":       "NodeAgentConfig.ServiceName",
	"aliveLockConfig.KeepaliveIdle":     "NodeAgentConfig.KeepaliveIdle",
	"aliveLockConfig.KeepaliveInterval": "NodeAgentConfig.KeepaliveInterval",
	"aliveLockConfig.KeepaliveCount":    "NodeAgentConfig.KeepaliveCount",
	"aliveLockConfig.UserTimeout":       "NodeAgentConfig.UserTimeout",
	"aliveLockConfig.VerifyInterval":    "NodeAgentConfig.VerifyInterval",
}

// Snapshot reports the node agent's state. It never blocks on the database.
func (n *NodeAgent) Snapshot() NodeAgentSnapshot {
	return NodeAgentSnapshot{Socket: n.cfg.Socket, SessionUp: n.sessionUp.Load(), Listening: n.listening.Load(),
		BackendPID: n.backendPID.Load(), Attached: int(n.attached.Load()), LocksHeld: int(n.locksHeld.Load()),
		Claims: n.claims.Load(), Proofs: n.proofs.Load(), ProveAsked: n.proveAsked.Load(),
		Reconnects: n.reconnects.Load(), Refused: n.refused.Load()}
}

// Run listens on the socket and holds the session until ctx ends; then it closes the
// socket and every process's connection, and the session, which lets every lock go.
// It returns an error only when the socket cannot be listened on.
func (n *NodeAgent) Run(ctx context.Context) error {
	if !n.running.CompareAndSwap(false, true) {
		return errors.New("liveness: node agent: Run is already running")
	}
	defer n.running.Store(false)
	ln, err := n.listen()
	if err != nil {
		return err
	}
	n.log.Info("node agent listening", "socket", n.cfg.Socket)
	var wg sync.WaitGroup
	defer wg.Wait()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	context.AfterFunc(runCtx, func() { _ = ln.Close() })
	wg.Go(func() { n.accept(runCtx, ln, &wg) })
	n.hold(runCtx)
	stop()
	n.mu.Lock()
	for c := range n.clients {
		c.close()
	}
	n.mu.Unlock()
	_ = os.Remove(n.cfg.Socket)
	return nil
}

// listen creates the socket, replacing one a previous run left, never another file.
func (n *NodeAgent) listen() (net.Listener, error) {
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
	ln.(*net.UnixListener).SetUnlinkOnClose(false) // removed once the session let go, in Run
	if err := os.Chmod(n.cfg.Socket, n.cfg.SocketMode); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("liveness: node agent: chmod %s: %w", n.cfg.Socket, err)
	}
	return ln, nil
}

// accept takes the processes' connections until ln closes; each gets a reader and a
// writer, owned by wg.
func (n *NodeAgent) accept(ctx context.Context, ln net.Listener, wg *sync.WaitGroup) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() == nil {
				n.log.Error("node agent: accept failed; no process can attach", "err", err)
			}
			return
		}
		c := newNodeClient(conn)
		n.mu.Lock()
		n.clients[c] = struct{}{}
		n.mu.Unlock()
		wg.Go(func() { c.write(ctx) })
		wg.Go(func() {
			c.read(func(m nodeMessage) { n.request(nodeRequest{client: c, msg: m}) })
			n.mu.Lock()
			delete(n.clients, c)
			n.mu.Unlock()
			c.close()
			n.request(nodeRequest{client: c, gone: true})
		})
	}
}

// nodeRequest is a process's message, or its connection's end, for the session.
type nodeRequest struct {
	client *nodeClient
	msg    nodeMessage
	gone   bool
}

// request queues r for the session goroutine and rings the doorbell.
func (n *NodeAgent) request(r nodeRequest) {
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

func (n *NodeAgent) take() []nodeRequest {
	n.mu.Lock()
	defer n.mu.Unlock()
	q := n.queue
	n.queue, n.rung = nil, false
	return q
}

// broadcast hands a notification to the processes it concerns: membership to those that
// asked for it, lease events to all. It never blocks: a process that does not read gets
// a resync once it does (its waiters then read the state again).
func (n *NodeAgent) broadcast(e event) {
	members := e.Kind == eventJoined || e.Kind == eventLeft || e.Kind == eventDead
	m := nodeMessage{Op: nodeOpEvent, Kind: e.Kind, ID: e.ID}
	n.mu.Lock()
	defer n.mu.Unlock()
	for c := range n.clients {
		if c.attached.Load() && (!members || c.wantMembers.Load()) {
			c.event(m)
		}
	}
}

// nodeSession is what the session goroutine owns.
type nodeSession struct {
	conn        *pgx.Conn
	byInstance  map[uuid.UUID]*nodeClient // the client each attached instance belongs to
	clients     map[*nodeClient]struct{}  // attached, whoever holds what
	members     bool                      // the session listens to the members channel
	database    string
	claim       uint64 // the last claim's number
	lastVerify  time.Time
	lastReclaim time.Time
}

// hold runs sessions until ctx ends: connect, listen, claim what is attached, serve the
// requests; after a drop, every attached process is told, and the next session claims
// their locks again.
func (n *NodeAgent) hold(ctx context.Context) {
	s := &nodeSession{byInstance: map[uuid.UUID]*nodeClient{}, clients: map[*nodeClient]struct{}{}}
	attempt, connectedOnce := 0, false
	for ctx.Err() == nil {
		began := time.Now()
		if n.session(ctx, s, &connectedOnce) || time.Since(began) > reconnectBackoffMax {
			attempt = 0
		}
		if ctx.Err() != nil {
			return
		}
		attempt++
		wait := time.NewTimer(backoff(attempt))
		for waiting := true; waiting; {
			// Requests while down: attaches wait for the next session, departures just go.
			n.serveWhileDown(s)
			rung, stop := n.doorbell(ctx)
			select {
			case <-ctx.Done():
				wait.Stop()
				waiting = false
			case <-wait.C:
				waiting = false
			case <-rung:
			}
			stop()
		}
	}
}

// doorbell returns a channel closed at the next request (at once if one is queued), and
// the function that stops listening for it.
func (n *NodeAgent) doorbell(ctx context.Context) (<-chan struct{}, func()) {
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

// serveWhileDown answers the requests that came while no session is up.
func (n *NodeAgent) serveWhileDown(s *nodeSession) {
	for _, r := range n.take() {
		c := r.client
		switch {
		case r.gone:
			n.forget(s, c)
		case r.msg.Op == nodeOpAttach:
			if n.attach(s, c, r.msg, false) {
				c.send(nodeMessage{Op: nodeOpState})
			}
		case r.msg.Op == nodeOpProve:
			c.send(nodeMessage{Op: nodeOpProof, Seq: r.msg.Seq})
		case r.msg.Op == nodeOpMembers:
			c.wantMembers.Store(r.msg.Want)
		}
	}
}

// session runs one connection; it reports whether it held anything. The locks of the
// attached processes are claimed at its start and let go at its end (the session's end
// lets every lock go).
func (n *NodeAgent) session(ctx context.Context, s *nodeSession, connectedOnce *bool) (ok bool) {
	cctx, cancel := context.WithTimeout(ctx, aliveLockConnectTimeout)
	conn, err := pgx.ConnectConfig(cctx, n.connCfg)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			n.condition.Log(n.log, slog.LevelWarn, "connect", "node agent cannot connect; retrying", "error", err)
		}
		return false
	}
	if *connectedOnce {
		n.reconnects.Add(1)
	}
	*connectedOnce = true
	s.conn = conn
	defer func() {
		n.sessionUp.Store(false)
		n.listening.Store(false)
		n.backendPID.Store(0)
		for c := range s.clients {
			c.held, c.duplicate, c.stranger = false, false, false
			c.send(nodeMessage{Op: nodeOpState})
		}
		n.locksHeld.Store(0)
		s.members = false
		closeCtx, cancel := context.WithTimeout(context.Background(), aliveLockCloseTimeout)
		defer cancel()
		_ = conn.Close(closeCtx) // ends the session: every lock goes
		s.conn = nil
	}()
	pid := int64(conn.PgConn().PID())
	if err := n.query(ctx, s, n.databaseSQL).Scan(&s.database); err != nil {
		n.condition.Log(n.log, slog.LevelWarn, "lost", "node agent session failed; reconnecting", "error", err)
		return false
	}
	var listening bool
	var channel string
	if err := n.query(ctx, s, n.listenSQL).Scan(&channel); err != nil {
		n.log.Warn("node agent cannot listen to the schema's events; the processes poll instead", "error", err)
	} else {
		listening = true
	}
	n.sessionUp.Store(true)
	n.listening.Store(listening)
	n.backendPID.Store(pid)
	n.condition.Log(n.log, slog.LevelInfo, "up", "node agent session up", "backend_pid", pid, "database", s.database)
	// The processes attached meanwhile, or before the drop: claim their locks again.
	for c := range s.clients {
		if !n.claim(ctx, s, c) {
			return true
		}
	}
	s.lastVerify, s.lastReclaim = time.Now(), time.Now()
	for {
		if !n.serve(ctx, s) {
			return true
		}
		if !n.wait(ctx, s) {
			return true
		}
	}
}

// serve answers the queued requests, then what is due: one verification for every
// proof asked (each sent after its question arrived), the session's own, and claims
// again of the locks not held. It returns false when the session must be dropped.
func (n *NodeAgent) serve(ctx context.Context, s *nodeSession) bool {
	var proves []nodeRequest
	for _, r := range n.take() {
		c := r.client
		switch {
		case r.gone:
			if c.held && s.byInstance[c.instance] == c {
				if _, err := s.conn.Exec(ctx, n.releaseSQL, c.instance.String()); err != nil {
					n.log.Warn("node agent: letting a departed process's lock go failed; dropping the session, "+
						"which lets it go", "instance_id", c.instance, "error", err)
					n.forget(s, c)
					return false
				}
			}
			n.forget(s, c)
		case r.msg.Op == nodeOpAttach:
			if n.attach(s, c, r.msg, true) && !n.claim(ctx, s, c) {
				return false
			}
		case r.msg.Op == nodeOpProve:
			proves = append(proves, r)
		case r.msg.Op == nodeOpMembers:
			c.wantMembers.Store(r.msg.Want)
		}
	}
	if !n.syncMembers(ctx, s) {
		return false
	}
	if len(proves) > 0 || time.Since(s.lastVerify) >= n.verifyEvery {
		clock, ok := n.verify(ctx, s)
		if !ok {
			return false
		}
		for _, r := range proves {
			c := r.client
			r.client.send(nodeMessage{Op: nodeOpProof, Seq: r.msg.Seq, Held: c.held, PID: n.backendPID.Load(),
				Claim: c.claim, ServerClock: clock})
		}
		n.proveAsked.Add(uint64(len(proves)))
	}
	if time.Since(s.lastReclaim) >= reclaimEvery {
		s.lastReclaim = time.Now()
		for c := range s.clients {
			if !c.held && !n.claim(ctx, s, c) {
				return false
			}
		}
	}
	return true
}

// attach takes an attach request: the process's schema and database must be the node
// agent's (checked once a session knows the database: live says one is up). It reports
// whether the process is now attached.
func (n *NodeAgent) attach(s *nodeSession, c *nodeClient, m nodeMessage, live bool) bool {
	switch {
	case c.attached.Load():
		return n.refuse(c, m.Instance, "one instance per connection: already attached")
	case m.Instance == uuid.Nil:
		return n.refuse(c, m.Instance, "attach names no instance")
	case m.Schema != n.cfg.Schema:
		return n.refuse(c, m.Instance, fmt.Sprintf("the node agent holds locks for schema %q, not %q", n.cfg.Schema, m.Schema))
	case live && m.Database != s.database:
		return n.refuse(c, m.Instance, n.otherDatabase(s, m.Database))
	}
	c.instance, c.database = m.Instance, m.Database
	c.attached.Store(true)
	s.clients[c] = struct{}{}
	n.attached.Store(int64(len(s.clients)))
	n.log.Debug("node agent: process attached", "instance_id", c.instance, "peer", c.peer)
	return true
}

// refuse tells a process why it may not attach, and closes its connection once told.
func (n *NodeAgent) refuse(c *nodeClient, instance uuid.UUID, reason string) bool {
	n.refused.Add(1)
	n.log.Warn("node agent: attach refused", "instance_id", instance, "peer", c.peer, "reason", reason)
	c.send(nodeMessage{Op: nodeOpError, Error: reason})
	c.closeAfterSend()
	return false
}

func (n *NodeAgent) otherDatabase(s *nodeSession, database string) string {
	return fmt.Sprintf("the node agent holds locks in database %q, not %q", s.database, database)
}

// forget removes a process that departed.
func (n *NodeAgent) forget(s *nodeSession, c *nodeClient) {
	if _, ok := s.clients[c]; !ok {
		return
	}
	delete(s.clients, c)
	if s.byInstance[c.instance] == c {
		delete(s.byInstance, c.instance)
	}
	if c.held {
		c.held = false
		n.locksHeld.Add(-1)
	}
	n.attached.Store(int64(len(s.clients)))
	n.log.Debug("node agent: process departed", "instance_id", c.instance)
}

// claim claims c's lock on the session and tells c. Another process attached with the
// same instance id is a duplicate, whose lock this session would otherwise hold twice
// (session locks stack). It returns false when the session must be dropped.
func (n *NodeAgent) claim(ctx context.Context, s *nodeSession, c *nodeClient) bool {
	if c.database != s.database {
		// Attached while no session knew the database: refused now.
		n.forget(s, c)
		n.refuse(c, c.instance, n.otherDatabase(s, c.database))
		return true
	}
	if owner := s.byInstance[c.instance]; owner != nil && owner != c {
		if !c.duplicate {
			c.duplicate, c.stranger = true, false
			c.send(nodeMessage{Op: nodeOpState, Duplicate: true, Listening: n.listening.Load()})
		}
		return true
	}
	var pid int64
	var held *bool
	var clock time.Time
	if err := n.query(ctx, s, n.claimSQL, c.instance.String(), int64(s.conn.PgConn().PID())).Scan(&pid, &held, &clock); err != nil {
		return n.failed(ctx, s, "claim", err)
	}
	if held != nil && *held {
		s.claim++
		s.byInstance[c.instance] = c
		c.held, c.claim, c.duplicate, c.stranger = true, s.claim, false, false
		n.claims.Add(1)
		n.locksHeld.Add(1)
		c.send(nodeMessage{Op: nodeOpState, Held: true, PID: pid, Claim: c.claim, ServerClock: clock,
			Listening: n.listening.Load()})
		return true
	}
	// Held by another session: whose, at the first refusal and then rarely.
	if c.askedHolder.IsZero() || time.Since(c.askedHolder) >= holderAskEvery {
		c.askedHolder = time.Now()
		var holderPID int32
		var claimed bool
		switch err := n.query(ctx, s, n.holderSQL, c.instance.String()).Scan(&holderPID, &claimed); {
		case errors.Is(err, pgx.ErrNoRows):
			return true // freed meanwhile: the next claim takes it
		case err != nil:
			return n.failed(ctx, s, "holder", err)
		}
		c.duplicate, c.stranger = claimed, !claimed
	}
	c.send(nodeMessage{Op: nodeOpState, Duplicate: c.duplicate, Stranger: c.stranger, Listening: n.listening.Load()})
	return true
}

// verify proves the session (a session-level lock is released only by its own session:
// while the backend that took the locks answers, it holds them) and returns the server's
// clock. It returns false when the session must be dropped.
func (n *NodeAgent) verify(ctx context.Context, s *nodeSession) (time.Time, bool) {
	var pid int64
	var ok *bool
	var clock time.Time
	s.lastVerify = time.Now()
	n.proofs.Add(1)
	if err := n.query(ctx, s, n.verifySQL, uuid.Max.String()).Scan(&pid, &ok, &clock); err != nil {
		return time.Time{}, n.failed(ctx, s, "verify", err)
	}
	if pid != int64(s.conn.PgConn().PID()) {
		n.condition.Log(n.log, slog.LevelError, "pooled",
			"node agent: statements on its session run on another backend than the one the server opened "+
				"for it: the direct DSN most likely points at a pooler; point it at PostgreSQL itself")
		return time.Time{}, false
	}
	return clock, true
}

// syncMembers listens to the members channel while an attached process wants it.
func (n *NodeAgent) syncMembers(ctx context.Context, s *nodeSession) bool {
	want := false
	for c := range s.clients {
		if c.wantMembers.Load() {
			want = true
			break
		}
	}
	if want == s.members || !n.listening.Load() {
		return true
	}
	sql := n.unmembersSQL
	if want {
		sql = n.membersSQL
	}
	var channel string
	if err := n.query(ctx, s, sql).Scan(&channel); err != nil {
		return n.failed(ctx, s, "members", err)
	}
	s.members = want
	if want {
		// What happened before the LISTEN is lost: the processes read again.
		n.broadcast(event{Kind: eventResync})
	}
	return true
}

// query sends sql on the session with the alive lock's statement deadline.
func (n *NodeAgent) query(ctx context.Context, s *nodeSession, sql string, args ...any) pgx.Row {
	qctx, cancel := context.WithTimeout(ctx, max(aliveLockStatementTimeout, n.clientUserTimeout+aliveLockStatementTimeout))
	row := s.conn.QueryRow(qctx, sql, args...)
	return cancelingRow{row, cancel}
}

type cancelingRow struct {
	pgx.Row
	cancel context.CancelFunc
}

func (r cancelingRow) Scan(dest ...any) error {
	defer r.cancel()
	return r.Row.Scan(dest...)
}

// failed logs a statement's failure and says whether the session may go on: a server
// error (a missing function, say) keeps it, a broken connection does not.
func (n *NodeAgent) failed(ctx context.Context, s *nodeSession, what string, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && !s.conn.IsClosed() {
		n.condition.Log(n.log, slog.LevelError, "error:"+what+":"+pgErr.Code, "node agent statement failed", "statement", what, "error", err)
		return true
	}
	n.condition.Log(n.log, slog.LevelWarn, "lost", "node agent session lost; reconnecting", "error", err)
	return false
}

// wait waits on the idle session until the next verification or claim is due or a
// request comes; a notification is handed on meanwhile (OnNotification), and a dropped
// session is noticed at once. It returns false when the session must be dropped.
func (n *NodeAgent) wait(ctx context.Context, s *nodeSession) bool {
	due := s.lastVerify.Add(n.verifyEvery)
	if slices.ContainsFunc(mapKeys(s.clients), func(c *nodeClient) bool { return !c.held }) {
		due = earliest(due, s.lastReclaim.Add(reclaimEvery))
	}
	for time.Now().Before(due) {
		wctx, cancel := context.WithDeadline(ctx, due)
		n.mu.Lock()
		if n.rung || len(n.queue) > 0 {
			n.mu.Unlock()
			cancel()
			return true
		}
		rctx, ring := context.WithCancelCause(wctx)
		n.wakeWait = ring
		n.mu.Unlock()
		err := s.conn.PgConn().WaitForNotification(rctx)
		rung := context.Cause(rctx) == errRung
		n.mu.Lock()
		n.wakeWait = nil
		n.mu.Unlock()
		ring(nil)
		cancel()
		switch {
		case ctx.Err() != nil:
			return false
		case rung && !s.conn.IsClosed():
			return true
		case err == nil:
			continue // a notification, handed on
		case pgconn.Timeout(err) && !s.conn.IsClosed():
			return true
		default:
			n.condition.Log(n.log, slog.LevelWarn, "lost", "node agent session lost; reconnecting", "error", err)
			return false
		}
	}
	return true
}

// peerOf names a process's connection by its credentials (SO_PEERCRED), for the logs.
func peerOf(c *net.UnixConn) string {
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

func mapKeys[K comparable, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// nodeClient is one process's connection.
type nodeClient struct {
	conn        net.Conn
	peer        string
	control     chan nodeMessage // state, proof, error: never dropped (a client that lets them pile up is dropped)
	events      chan nodeMessage // notifications: dropped when full, then a resync
	dropped     atomic.Bool
	attached    atomic.Bool
	wantMembers atomic.Bool
	closeOnce   sync.Once
	done        chan struct{}
	sentLast    chan struct{} // closed by closeAfterSend: close once control is drained

	// Owned by the session goroutine.
	instance            uuid.UUID
	database            string
	held                bool
	claim               uint64
	duplicate, stranger bool
	askedHolder         time.Time
}

// nodeClientQueue bounds a client's pending messages of each kind.
const nodeClientQueue = 64

func newNodeClient(conn net.Conn) *nodeClient {
	c := &nodeClient{conn: conn, control: make(chan nodeMessage, nodeClientQueue),
		events: make(chan nodeMessage, nodeClientQueue), done: make(chan struct{}), sentLast: make(chan struct{})}
	if uc, ok := conn.(*net.UnixConn); ok {
		c.peer = peerOf(uc)
	}
	return c
}

// send queues a control message; a process that does not read them is dropped (its
// connection closed, which lets its lock go).
func (c *nodeClient) send(m nodeMessage) {
	select {
	case c.control <- m:
	default:
		c.close()
	}
}

// event queues a notification, or notes that one was dropped.
func (c *nodeClient) event(m nodeMessage) {
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

// read hands each message to handle until the connection ends.
func (c *nodeClient) read(handle func(nodeMessage)) {
	d := newNodeDecoder(c.conn)
	for {
		m, err := d.next()
		if err != nil {
			return
		}
		handle(m)
	}
}

// write sends the queued messages, control first, until the connection ends.
func (c *nodeClient) write(ctx context.Context) {
	for {
		select {
		case m := <-c.control:
			if writeNodeMessage(c.conn, m) != nil {
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
			if writeNodeMessage(c.conn, m) != nil {
				c.close()
				return
			}
		case <-c.sentLast:
			if len(c.control) == 0 {
				c.close()
				return
			}
		case m := <-c.events:
			if writeNodeMessage(c.conn, m) != nil {
				c.close()
				return
			}
			if len(c.events) == 0 && c.dropped.Swap(false) {
				c.event(nodeMessage{Op: nodeOpEvent, Kind: eventResync})
			}
		}
	}
}
