// The node agent's session to the database: connect, listen, serve the queued requests
// and wait on the idle session, and reconnect after a drop.

package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pg-liveness/pg_liveness_exporter/internal/alivelock"
	"github.com/pg-liveness/pg_liveness_exporter/internal/nodeagent/proto"
	"github.com/pg-liveness/pg_liveness_exporter/internal/notify"
)

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
	lastPrune   time.Time
}

// bindingsPruneEvery is how often the node agent asks which of the instances whose
// claimant ended are dead, to forget them.
const bindingsPruneEvery = 30 * time.Second

// hold runs sessions until ctx ends: connect, listen, claim what is attached, serve the
// requests; after a drop, every attached process is told, and the next session claims
// their locks again.
func (n *Server) hold(ctx context.Context) {
	s := &nodeSession{byInstance: map[uuid.UUID]*nodeClient{}, clients: map[*nodeClient]struct{}{}}
	attempt, connectedOnce := 0, false
	for ctx.Err() == nil {
		began := time.Now()
		if n.session(ctx, s, &connectedOnce) || time.Since(began) > alivelock.ReconnectBackoffMax {
			attempt = 0
		}
		if ctx.Err() != nil {
			return
		}
		attempt++
		wait := time.NewTimer(alivelock.Backoff(attempt))
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

// serveWhileDown answers the requests that came while no session is up.
func (n *Server) serveWhileDown(s *nodeSession) {
	for _, r := range n.take() {
		c := r.client
		switch {
		case r.gone:
			n.forget(s, c)
		case r.msg.Op == proto.OpAttach:
			if n.attach(context.Background(), s, c, r.msg, false) {
				c.send(proto.Message{Op: proto.OpState})
			}
		case r.msg.Op == proto.OpProve:
			if !c.attached.Load() {
				n.protocolError(c, fmt.Errorf("%w: a proof asked before attaching", proto.ErrNotProtocol))
			}
			c.send(proto.Message{Op: proto.OpProof, Seq: r.msg.Seq})
		case r.msg.Op == proto.OpMembers:
			c.wantMembers.Store(r.msg.Want)
		default:
			n.protocolError(c, fmt.Errorf("%w: unknown op %q", proto.ErrNotProtocol, r.msg.Op))
		}
	}
	n.saveBindings()
}

// session runs one connection; it reports whether it held anything. The locks of the
// attached processes are claimed at its start and let go at its end (the session's end
// lets every lock go).
func (n *Server) session(ctx context.Context, s *nodeSession, connectedOnce *bool) (ok bool) {
	cctx, cancel := context.WithTimeout(ctx, alivelock.ConnectTimeout)
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
		var held []string
		for c := range s.clients {
			if c.held && s.byInstance[c.instance] == c {
				held = append(held, c.instance.String())
			}
			c.held, c.duplicate, c.stranger = false, false, false
			c.send(proto.Message{Op: proto.OpState})
		}
		if ctx.Err() != nil && !conn.IsClosed() {
			n.handOver(conn, held)
		}
		n.sessionUp.Store(false)
		n.listening.Store(false)
		n.backendPID.Store(0)
		n.locksHeld.Store(0)
		s.members = false
		closeCtx, cancel := context.WithTimeout(context.Background(), alivelock.CloseTimeout)
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
func (n *Server) serve(ctx context.Context, s *nodeSession) bool {
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
		case r.msg.Op == proto.OpAttach:
			if n.attach(ctx, s, c, r.msg, true) && !n.claim(ctx, s, c) {
				return false
			}
		case r.msg.Op == proto.OpProve && !c.held:
			// Nothing of this connection's is held (not attached, a duplicate, a stranger
			// on its key): the answer needs no verification, and costs the database nothing.
			if !c.attached.Load() {
				n.protocolError(c, fmt.Errorf("%w: a proof asked before attaching", proto.ErrNotProtocol))
			}
			c.send(proto.Message{Op: proto.OpProof, Seq: r.msg.Seq, Claim: c.claim})
		case r.msg.Op == proto.OpProve:
			proves = append(proves, r)
		case r.msg.Op == proto.OpMembers:
			c.wantMembers.Store(r.msg.Want)
		default:
			n.protocolError(c, fmt.Errorf("%w: unknown op %q", proto.ErrNotProtocol, r.msg.Op))
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
			r.client.send(proto.Message{Op: proto.OpProof, Seq: r.msg.Seq, Held: c.held, PID: n.backendPID.Load(),
				Claim: c.claim, ServerClock: clock})
		}
		n.proveAsked.Add(uint64(len(proves)))
	}
	if time.Since(s.lastPrune) >= bindingsPruneEvery {
		if !n.pruneBindings(ctx, s) {
			return false
		}
	} else {
		n.saveBindings()
	}
	if time.Since(s.lastReclaim) >= alivelock.ReclaimEvery {
		s.lastReclaim = time.Now()
		for c := range s.clients {
			if !c.held && !n.claim(ctx, s, c) {
				return false
			}
		}
	}
	return true
}

// syncMembers listens to the members channel while an attached process wants it.
func (n *Server) syncMembers(ctx context.Context, s *nodeSession) bool {
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
		n.broadcast(notify.Event{Kind: notify.Resync})
	}
	return true
}

// query sends sql on the session with the alive lock's statement deadline.
func (n *Server) query(ctx context.Context, s *nodeSession, sql string, args ...any) pgx.Row {
	qctx, cancel := context.WithTimeout(ctx, alivelock.StatementTimeoutFor(n.clientUserTimeout))
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
func (n *Server) failed(ctx context.Context, s *nodeSession, what string, err error) bool {
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
func (n *Server) wait(ctx context.Context, s *nodeSession) bool {
	due := s.lastVerify.Add(n.verifyEvery)
	if slices.ContainsFunc(mapKeys(s.clients), func(c *nodeClient) bool { return !c.held }) {
		due = alivelock.Earliest(due, s.lastReclaim.Add(alivelock.ReclaimEvery))
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

// handOverWait bounds how long a stopping node agent keeps its session, and with it the
// locks of its processes, waiting for their rows to stop claiming them.
const handOverWait = 2 * time.Second

// handOverPoll is how often a stopping node agent reads those rows.
const handOverPoll = 10 * time.Millisecond

// handOver runs when the node agent stops (a rolling update sends SIGTERM) with the locks
// of ids held: their processes' connections have closed, so each process knows its lock
// is going and beats at once, recording that it holds none. The session, and the locks,
// stay until no row of ids claims its lock any more, for at most handOverWait: a lock
// that vanished from under a row claiming it would leave the process a lock grace to prove
// life from wherever it is, while a lock that stays until the row stops claiming it leaves
// no moment in which an observer may call the process dead. A beat its process sent
// before it learned of the loss (a claim's, just after attaching) can still land after the
// rows stopped claiming; the process's next beat, sent at once, corrects the row.
func (n *Server) handOver(conn *pgx.Conn, ids []string) {
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), handOverWait)
	defer cancel()
	began := time.Now()
	for {
		var claiming int
		err := conn.QueryRow(ctx, n.claimingSQL, ids).Scan(&claiming)
		switch {
		case err == nil && claiming == 0:
			n.log.Info("node agent stopping: every attached process proved life by its heartbeat; letting the locks go",
				"processes", len(ids), "waited", time.Since(began).Round(time.Millisecond))
			return
		case err != nil && ctx.Err() == nil:
			n.log.Warn("node agent stopping: cannot read whether its processes proved life; letting the locks go",
				"processes", len(ids), "error", err)
			return
		}
		select {
		case <-ctx.Done():
			n.log.Warn("node agent stopping: some attached processes did not prove life by their heartbeats in time; "+
				"letting the locks go (each has its lock grace to beat)", "processes", len(ids), "still_claiming", claiming,
				"waited", handOverWait)
			return
		case <-time.After(handOverPoll):
		}
	}
}

func mapKeys[K comparable, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
