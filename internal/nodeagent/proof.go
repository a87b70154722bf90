// What the node agent's session does for each process: attach it (or refuse it), claim
// its alive lock, forget it once it departs, and verify the session, which proves the
// locks it holds.

package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/alivelock"
	"github.com/pg-liveness/pg_liveness_exporter/internal/nodeagent/proto"
)

// attach takes an attach request: the process's schema and database must be the node
// agent's (checked once a session knows the database: live says one is up), and the
// instance its own (claimBindings). It reports whether the process is now attached.
func (n *Server) attach(ctx context.Context, s *nodeSession, c *nodeClient, m proto.Message, live bool) bool {
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
	if b, ok := n.bindings.byID[m.Instance]; !ok {
		n.bindings.bind(m.Instance, c)
	} else if !b.heldBy(c) {
		switch {
		case b.running(attachedSecrets(s)):
			return n.refuseImpostor(c, m.Instance, fmt.Sprintf("instance %s belongs to the process that claimed it (%s), "+
				"%s: use an instance id of this process's own", m.Instance, b.who(), b.runs()))
		case !live:
			return n.refuseImpostor(c, m.Instance, fmt.Sprintf("instance %s was claimed by a process that has ended (%s), "+
				"and the node agent cannot ask the database yet whether the fleet has called it dead: attach again",
				m.Instance, b.who()))
		}
		dead, err := n.deadInstances(ctx, s, []uuid.UUID{m.Instance})
		if err != nil {
			n.log.Warn("node agent: cannot ask whether an instance is dead", "instance_id", m.Instance, "error", err)
			return n.refuseImpostor(c, m.Instance, fmt.Sprintf("instance %s was claimed by a process that has ended (%s), "+
				"and the node agent could not ask the database whether the fleet has called it dead: attach again",
				m.Instance, b.who()))
		}
		if len(dead) == 0 {
			return n.refuseImpostor(c, m.Instance, fmt.Sprintf("instance %s was claimed by a process that has ended (%s) "+
				"and is not dead yet by the fleet's verdict: attach again once it is (its lock grace after its lock went, or "+
				"its stale threshold without one), or use a new instance id", m.Instance, b.who()))
		}
		// Its claimant ended and the fleet called it dead: the id may begin a new life.
		n.log.Info("node agent: instance claimed afresh: the process that claimed it ended and the fleet called it dead",
			"instance_id", m.Instance, "previous", b.who(), "peer", c.who())
		n.bindings.bind(m.Instance, c)
	}
	c.instance, c.database = m.Instance, m.Database
	c.attached.Store(true)
	s.clients[c] = struct{}{}
	n.attached.Store(int64(len(s.clients)))
	n.log.Debug("node agent: process attached", "instance_id", c.instance, "peer", c.peer)
	return true
}

// refuse tells a process why it may not attach, and closes its connection once told.
func (n *Server) refuse(c *nodeClient, instance uuid.UUID, reason string) bool {
	n.refused.Add(1)
	n.log.Warn("node agent: attach refused", "instance_id", instance, "peer", c.peer, "reason", reason)
	c.send(proto.Message{Op: proto.OpError, Error: reason})
	c.closeAfterSend()
	return false
}

// refuseImpostor refuses an attach that names another process's instance: counted,
// logged at warning (at most once every few seconds), and the process told why.
func (n *Server) refuseImpostor(c *nodeClient, instance uuid.UUID, reason string) bool {
	n.impostors.Add(1)
	n.refusedLog.warn(n.log, "node agent: attach refused: another process's instance", "instance_id", instance,
		"peer", c.who(), "reason", reason)
	c.send(proto.Message{Op: proto.OpError, Error: reason})
	c.closeAfterSend()
	return false
}

// deadInstances returns those of ids that are dead by the one verdict.
func (n *Server) deadInstances(ctx context.Context, s *nodeSession, ids []uuid.UUID) ([]uuid.UUID, error) {
	qctx, cancel := context.WithTimeout(ctx, alivelock.StatementTimeoutFor(n.clientUserTimeout))
	defer cancel()
	texts := make([]string, len(ids)) // as text: the session's exec mode sends no types
	for i, id := range ids {
		texts[i] = id.String()
	}
	rows, err := s.conn.Query(qctx, n.deadSQL, texts)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
}

// pruneBindings forgets the instances whose claimant ended and that the fleet has called
// dead (their ids may begin a new life with any process), and saves the bindings when
// they changed. It returns false when the session must be dropped.
func (n *Server) pruneBindings(ctx context.Context, s *nodeSession) bool {
	s.lastPrune = time.Now()
	if ended := n.bindings.ended(attachedSecrets(s)); len(ended) > 0 {
		dead, err := n.deadInstances(ctx, s, ended)
		if err != nil {
			return n.failed(ctx, s, "dead_instances", err)
		}
		for _, id := range dead {
			if owner := s.byInstance[id]; owner == nil {
				n.bindings.forget(id)
			}
		}
	}
	n.saveBindings()
	return true
}

// attachedSecrets are the hashes of the secrets of the processes attached now: their
// claims' claimants run (claimBinding.running).
func attachedSecrets(s *nodeSession) map[string]bool {
	out := map[string]bool{}
	for c := range s.clients {
		if c.secret != "" {
			out[c.secret] = true
		}
	}
	return out
}

// saveBindings writes the bindings if they changed; a failure is logged once while it
// lasts (they are written again at the next change or prune).
func (n *Server) saveBindings() {
	if err := n.bindings.save(); err != nil {
		n.condition.Log(n.log, slog.LevelError, "bindings", "node agent: cannot keep its claims beside its socket: after a "+
			"restart it could not tell a process's instance from an impostor's", "error", err)
	}
}

func (n *Server) otherDatabase(s *nodeSession, database string) string {
	return fmt.Sprintf("the node agent holds locks in database %q, not %q", s.database, database)
}

// forget removes a process that departed.
func (n *Server) forget(s *nodeSession, c *nodeClient) {
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
func (n *Server) claim(ctx context.Context, s *nodeSession, c *nodeClient) bool {
	if c.database != s.database {
		// Attached while no session knew the database: refused now.
		n.forget(s, c)
		n.refuse(c, c.instance, n.otherDatabase(s, c.database))
		return true
	}
	if owner := s.byInstance[c.instance]; owner != nil && owner != c {
		if !c.duplicate {
			c.duplicate, c.stranger = true, false
			c.send(proto.Message{Op: proto.OpState, Duplicate: true, Listening: n.listening.Load()})
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
		c.send(proto.Message{Op: proto.OpState, Held: true, PID: pid, Claim: c.claim, ServerClock: clock,
			Listening: n.listening.Load()})
		return true
	}
	// Held by another session: whose, at the first refusal and then rarely.
	if c.askedHolder.IsZero() || time.Since(c.askedHolder) >= alivelock.HolderAskEvery {
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
	c.send(proto.Message{Op: proto.OpState, Duplicate: c.duplicate, Stranger: c.stranger, Listening: n.listening.Load()})
	return true
}

// verify proves the session (a session-level lock is released only by its own session:
// while the backend that took the locks answers, it holds them) and returns the server's
// clock. It returns false when the session must be dropped.
func (n *Server) verify(ctx context.Context, s *nodeSession) (time.Time, bool) {
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
