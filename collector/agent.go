package collector

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// AgentConfig configures the agent collector. It only runs when New gets an agent.
type AgentConfig struct {
	Enabled bool
}

func (s *AgentConfig) enabled() *bool      { return &s.Enabled }
func (s *AgentConfig) defaults()           {}
func (s *AgentConfig) check(*Config) error { return nil }

// agentCollector reports the local agent from its snapshot; it does not touch the
// database.
type agentCollector struct {
	agent  AgentSource
	status store.StatusSource // may be nil: the agent then counts as started

	info, lockHeld, interval, configured, beats, failures, lastBeat, reconnects *exposition.Family
	leaseHeld, leaseEpoch, leasesLost, reaped, joined, duplicate, stranger      *exposition.Family
	fencedRefused                                                               *exposition.Family
	shardsOwned, shardMembers, shardMoves                                       *exposition.Family
}

// newAgentCollector builds the agent collector, or none without an agent.
func newAgentCollector(d deps) (collector, error) {
	if d.agent == nil {
		return nil, nil
	}
	desc := func(name, help string, labels ...string) *exposition.Family {
		return gauge("agent_"+name, help, labels...)
	}
	// The agent's counters count from zero, from its start: their OpenMetrics _created.
	created := time.Now()
	count := func(name, help string, labels ...string) *exposition.Family {
		return counter("agent_"+name, help, labels...).CreatedAt(created)
	}
	return &agentCollector{
		agent:  d.agent,
		status: d.cfg.Status,
		joined: desc("joined", "1 once the agent runs and has written its instance row (a successful heartbeat); 0 while it waits for "+
			"the database or the schema, or when it gave up (missing privilege, a schema that no longer serves this binary)."),
		duplicate: desc("duplicate_instance", "1 while another session holds the agent's instance id's alive lock: a second process "+
			"with the same --agent.instance-id (or this one's previous session not yet ended). The agent then writes nothing, "+
			"and exits non-zero after --agent.duplicate-timeout."),
		stranger: desc("alive_lock_stranger", "1 while a session that did not claim it for this instance (another role's, or an "+
			"older binary's) holds the agent's alive-lock key: that lock counts for nobody, and the instance is judged by its "+
			"heartbeat until the key is free."),
		info:     desc("info", "The local agent's identity; always 1.", "instance_id", "service", "mode"),
		lockHeld: desc("alive_lock_held", "1 while the agent holds its alive lock, verified on its own backend."),
		interval: desc("heartbeat_interval_seconds", "Heartbeat cadence chosen on the last tick."),
		configured: desc("heartbeat_configured_interval_seconds", "The configured heartbeat cadences: fast without a verified "+
			"alive lock (--agent.heartbeat-interval), slow with one (--agent.heartbeat-slow-interval).", "cadence"),
		beats:    count("heartbeats_total", "Successful heartbeat writes."),
		failures: count("heartbeat_failures_total", "Failed heartbeat writes."),
		lastBeat: desc("last_heartbeat_timestamp_seconds",
			"Database time of the last successful heartbeat, as a Unix timestamp; absent before the first."),
		reconnects: count("alive_lock_reconnects_total", "Direct connections opened for the alive lock after the first."),
		leaseHeld:  desc("lease_held", "1 while the agent holds the lease.", "lease"),
		leaseEpoch: desc("lease_epoch", "The fencing epoch the agent believes it holds the lease under; absent while it does not. "+
			"A value that differs from the lease row's pg_liveness_lease_epoch is a process that still believes it leads.", "lease"),
		leasesLost: count("leases_lost_total", "Leases the agent lost, by reason: expired, taken or error.", "lease", "reason"),
		reaped:     count("instances_reaped_total", "Stale instances removed by the agent's reaper."),
		fencedRefused: count("lease_fenced_writes_refused_total", "Writes fenced under the lease that were refused: the lease "+
			"was not held, or the fence or its COMMIT reached the server past the fence deadline.", "lease"),
		shardsOwned:  desc("shards_owned", "Shards of the set this agent owns now (Agent.Shards).", "set"),
		shardMembers: desc("shard_set_members", "Live members of the shard set, as this agent last read them.", "set"),
		shardMoves: count("shard_moves_total", "Shards of the set this agent came to own (acquired), gave up (released: moved to "+
			"another member, returned, or the set's part ended) or lost (its lease).", "set", "move"),
	}, nil
}

func (c *agentCollector) Update(_ context.Context, out *exposition.Builder) error {
	s := c.agent.Snapshot()
	gauge := func(f *exposition.Family, v float64, labels ...string) { out.Add(f, v, labels...) }
	counter := func(f *exposition.Family, v uint64, labels ...string) { out.Add(f, float64(v), labels...) }
	started := c.status == nil || c.status.Status().AgentStarted
	gauge(c.joined, boolFloat(started && s.Heartbeat.Beats > 0))
	gauge(c.info, 1, s.InstanceID.String(), s.ServiceName, string(s.Mode))
	gauge(c.lockHeld, boolFloat(s.AliveLock.Held))
	gauge(c.duplicate, boolFloat(s.AliveLock.Duplicate))
	gauge(c.stranger, boolFloat(s.AliveLock.Stranger))
	gauge(c.interval, s.Heartbeat.Interval.Seconds())
	gauge(c.configured, s.Timing.HeartbeatInterval.Seconds(), "fast")
	gauge(c.configured, s.Timing.HeartbeatSlowInterval.Seconds(), "slow")
	counter(c.beats, s.Heartbeat.Beats)
	counter(c.failures, s.Heartbeat.Failures)
	if !s.Heartbeat.LastBeat.IsZero() {
		gauge(c.lastBeat, float64(s.Heartbeat.LastBeat.UnixNano())/float64(time.Second))
	}
	counter(c.reconnects, s.AliveLock.Reconnects)
	for _, st := range s.Shards {
		gauge(c.shardsOwned, float64(st.Owned), st.Set)
		gauge(c.shardMembers, float64(st.Members), st.Set)
		counter(c.shardMoves, st.Acquired, st.Set, "acquired")
		counter(c.shardMoves, st.Released, st.Set, "released")
		counter(c.shardMoves, st.Lost, st.Set, "lost")
	}
	for _, l := range s.Leases {
		gauge(c.leaseHeld, boolFloat(l.Held), l.Name)
		if l.Held {
			gauge(c.leaseEpoch, float64(l.Epoch), l.Name)
		}
		// Lost has every reason, zero included, so that increase() sees the first loss.
		for _, r := range slices.Sorted(maps.Keys(l.Lost)) {
			counter(c.leasesLost, l.Lost[r], l.Name, r)
		}
		counter(c.fencedRefused, l.FencedRefused, l.Name)
	}
	counter(c.reaped, s.Reaped)
	return nil
}
