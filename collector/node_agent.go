package collector

import (
	"context"

	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
	"github.com/pg-liveness/pg_liveness_exporter/internal/nodeagent"
)

// NodeAgentSource is what the node agent collector reads; the node agent's server
// (nodeagent.Server) implements it.
type NodeAgentSource interface {
	Snapshot() nodeagent.Snapshot
}

// NodeAgentConfig configures the node agent collector. It only runs when Source is set
// (the binary runs with --node-agent.socket or --node-agent.listen-address).
type NodeAgentConfig struct {
	Enabled bool
	// Source is the node agent. Not a flag: the binary sets it.
	Source NodeAgentSource
}

func (s *NodeAgentConfig) enabled() *bool      { return &s.Enabled }
func (s *NodeAgentConfig) defaults()           {}
func (s *NodeAgentConfig) check(*Config) error { return nil }

// nodeAgentCollector reports the node agent from its snapshot; it does not touch the
// database.
type nodeAgentCollector struct {
	node                                       NodeAgentSource
	attached, locks, up, listening             *exposition.Family
	proofs, asked, reconnects, claims, refused *exposition.Family
	acceptErrors, protocolErrors, impostors    *exposition.Family
	unauthenticated                            *exposition.Family
}

func newNodeAgentCollector(d deps) (collector, error) {
	if d.cfg.NodeAgent.Source == nil {
		return nil, nil
	}
	desc := func(name, help string) *exposition.Family { return gauge("node_agent_"+name, help) }
	count := func(name, help string) *exposition.Family { return counter("node_agent_"+name, help) }
	return &nodeAgentCollector{node: d.cfg.NodeAgent.Source,
		attached: desc("attached_processes", "Processes of this node attached to the node agent (one connection per instance)."),
		locks:    desc("locks_held", "Alive locks the node agent's session holds for the attached processes."),
		up:       desc("session_up", "1 while the node agent's direct session to the database is up."),
		listening: desc("listening", "1 while the node agent's session listens to the schema's channels for the attached "+
			"processes."),
		proofs: count("verifications_total", "Verifications of the node agent's session sent: its own, and one for every batch of "+
			"proofs the attached leaders asked for."),
		asked:      count("proofs_total", "Proofs of their locks the attached processes asked for and got."),
		reconnects: count("session_reconnects_total", "Sessions the node agent opened after the first."),
		claims:     count("claims_total", "Alive locks the node agent claimed for attached processes."),
		refused: count("attaches_refused_total", "Attaches refused (a process of another schema or database) and "+
			"connections refused past --node-agent.max-connections."),
		acceptErrors: count("accept_errors_total", "Accepts of the node agent's socket that failed (out of file descriptors, "+
			"say); each is retried with back-off."),
		protocolErrors: count("protocol_errors_total", "What processes sent that is not the node agent's protocol: lines that "+
			"do not parse or are too long (their connection closed), unknown ops, proofs asked before attaching."),
		impostors: count("impostors_refused_total", "Attaches refused because they named an instance another process "+
			"claimed: one that still runs, or one that ended and is not dead yet by the verdict."),
		unauthenticated: count("unauthenticated_total", "TCP connections (--node-agent.listen-address) closed before "+
			"attaching: their first line was not an attach with the node agent's token and a process secret, or none came "+
			"within 10 s."),
	}, nil
}

func (c *nodeAgentCollector) Update(_ context.Context, out *exposition.Builder) error {
	s := c.node.Snapshot()
	out.Add(c.attached, float64(s.Attached))
	out.Add(c.locks, float64(s.LocksHeld))
	out.Add(c.up, boolFloat(s.SessionUp))
	out.Add(c.listening, boolFloat(s.Listening))
	out.Add(c.proofs, float64(s.Proofs))
	out.Add(c.asked, float64(s.ProveAsked))
	out.Add(c.reconnects, float64(s.Reconnects))
	out.Add(c.claims, float64(s.Claims))
	out.Add(c.refused, float64(s.Refused))
	out.Add(c.acceptErrors, float64(s.AcceptErrors))
	out.Add(c.protocolErrors, float64(s.ProtocolErrors))
	out.Add(c.impostors, float64(s.Impostors))
	out.Add(c.unauthenticated, float64(s.Unauthenticated))
	return nil
}
