package main

// Every call into the liveness package is in this file, so that a change of the library's
// API touches only here.

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// The library's defaults of a campaign, which the lease flags default to, so that the
// suite measures what a service gets.
const (
	defaultLeaseTTL   = defaults.ElectorTTL
	defaultLeaseRetry = defaults.ElectorRetryPeriod
)

// leaseHandle is what a holder knows of the lease it holds.
type leaseHandle struct {
	Name  string
	Epoch int64
	// FenceDeadline is the library's: when, on the server's clock, fenced writes must be
	// refused.
	FenceDeadline func() time.Time
	// BeginFunc is the library's fenced transaction (Lease.BeginFunc).
	BeginFunc func(context.Context, *pgxpool.Pool, func(pgx.Tx) error) error
}

// timing mirrors the exporter's --agent.* flags, with the same names and defaults, so the
// suite can start this program with exactly the flags it reads from the exporter's help.
type timing struct {
	interval, slowInterval, stale, definitiveDead time.Duration
	keepIdle, keepInterval, userTimeout           time.Duration
	keepCount                                     int
	reaper                                        bool
	reaperInterval, reaperTTL                     time.Duration
	waitForSchema                                 bool
}

func (t *timing) addFlags() {
	flag.DurationVar(&t.interval, "agent.heartbeat-interval", 30*time.Second, "fast heartbeat cadence")
	flag.DurationVar(&t.slowInterval, "agent.heartbeat-slow-interval", 60*time.Second, "slow heartbeat cadence")
	flag.DurationVar(&t.stale, "agent.stale-threshold", 90*time.Second, "stale threshold")
	flag.DurationVar(&t.definitiveDead, "agent.definitive-dead-cutoff", 5*time.Minute, "definitive-dead cutoff")
	flag.DurationVar(&t.keepIdle, "agent.tcp-keepalive-idle", 10*time.Second, "server-side tcp_keepalives_idle")
	flag.DurationVar(&t.keepInterval, "agent.tcp-keepalive-interval", 5*time.Second, "server-side tcp_keepalives_interval")
	flag.IntVar(&t.keepCount, "agent.tcp-keepalive-count", 3, "server-side tcp_keepalives_count")
	flag.DurationVar(&t.userTimeout, "agent.tcp-user-timeout", 30*time.Second, "server-side tcp_user_timeout")
	flag.BoolVar(&t.reaper, "agent.reaper", true, "run the reaper")
	flag.DurationVar(&t.reaperInterval, "agent.reaper-interval", 30*time.Second, "reaper cadence")
	flag.DurationVar(&t.reaperTTL, "agent.reaper-lease-ttl", 2*time.Minute, "reaper lease ttl")
	// Not an exporter flag: without it, an instance started while the database is away
	// stops at once (ErrSchemaNotReady), as the library documents.
	flag.BoolVar(&t.waitForSchema, "agent.wait-for-schema", false, "wait for the database and the schema at start (AgentConfig.WaitForSchema) instead of stopping")
}

// participant is one instance's use of the library: an Agent (alive lock, heartbeat,
// reaper) that campaigns for the lease, or Leases alone with --agent=false.
type participant struct {
	agent  *liveness.Agent
	leases *liveness.Leases // without an agent
	log    *slog.Logger
}

func newParticipant(c config, id uuid.UUID, service string, pool *pgxpool.Pool, logger *slog.Logger) (*participant, error) {
	if !c.agent {
		leases, err := liveness.NewLeases(liveness.LeasesConfig{Pool: pool, Schema: c.schema, Logger: logger})
		return &participant{leases: leases, log: logger}, err
	}
	host, _ := os.Hostname()
	agent, err := liveness.NewAgent(liveness.AgentConfig{
		Pool:            pool,
		DirectDSN:       c.directDSN,
		NodeAgentSocket: c.nodeAgentSocket,
		Schema:          c.schema,
		InstanceID:      id,
		ServiceName:     service,
		HostName:        host,
		ProcessID:       os.Getpid(),
		Mode:            liveness.ModeAdvisoryLockWhenAvailable,
		Timing: liveness.Timing{HeartbeatInterval: c.timing.interval, HeartbeatSlowInterval: c.timing.slowInterval,
			StaleThreshold: c.timing.stale, DefinitiveDeadCutoff: c.timing.definitiveDead},
		KeepaliveIdle:     c.timing.keepIdle,
		KeepaliveInterval: c.timing.keepInterval,
		KeepaliveCount:    c.timing.keepCount,
		UserTimeout:       c.timing.userTimeout,
		Reaper:            c.timing.reaper,
		ReaperInterval:    c.timing.reaperInterval,
		ReaperLeaseTTL:    c.timing.reaperTTL,
		WaitForSchema:     c.timing.waitForSchema,
		Logger:            logger,
	})
	if err != nil {
		return nil, err
	}
	return &participant{agent: agent, log: logger}, nil
}

// compete holds the lease whenever it can, running hold while it does, until ctx ends:
// an agent campaigns (Agent.Elect, retrying every retry); without one, Leases.Run is
// tried every retry. hold gets the process's context and the lease's.
func (p *participant) compete(ctx context.Context, name string, ttl, retry time.Duration,
	hold func(procCtx, leaseCtx context.Context, lease leaseHandle) error, acquireFailed func(error)) {
	if p.agent != nil {
		err := p.agent.Elect(ctx, liveness.ElectorConfig{Lease: name, TTL: ttl, RetryPeriod: retry,
			OnStartedLeading: func(lctx context.Context, self *liveness.Lease) {
				_ = hold(ctx, lctx, leaseHandle{Name: self.Name, Epoch: self.Epoch, FenceDeadline: self.FenceDeadline,
					BeginFunc: self.BeginFunc})
			}})
		if err != nil && ctx.Err() == nil {
			p.log.Error("campaign stopped", "err", err)
		}
		return
	}
	for ctx.Err() == nil {
		ran, err := p.leases.Run(ctx, name, ttl, func(lctx context.Context, lease *liveness.Lease) error {
			return hold(ctx, lctx, leaseHandle{Name: lease.Name, Epoch: lease.Epoch, FenceDeadline: lease.FenceDeadline,
				BeginFunc: lease.BeginFunc})
		})
		if err != nil && !ran && ctx.Err() == nil {
			acquireFailed(err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(retry):
		}
	}
}

func (p *participant) run(ctx context.Context) {
	if p.agent == nil {
		<-ctx.Done()
		return
	}
	if err := p.agent.Run(ctx); err != nil {
		p.log.Error("agent stopped", "err", err)
	}
}

func (p *participant) lockHeld() bool { return p.agent.Snapshot().AliveLock.Held }

// Snapshot is the agent's snapshot as a stale leader sees itself: with
// --lease.ignore-loss, a lease it lost and goes on leading is reported held under the
// epoch it believes in. Otherwise it is the agent's own.
func (in *instance) Snapshot() liveness.AgentSnapshot {
	s := in.parts.agent.Snapshot()
	for name, epoch := range in.beliefs() {
		i := slices.IndexFunc(s.Leases, func(l liveness.LeaseStats) bool { return l.Name == name })
		if i < 0 {
			s.Leases = append(s.Leases, liveness.LeaseStats{Name: name})
			i = len(s.Leases) - 1
		}
		if !s.Leases[i].Held {
			s.Leases[i].Held, s.Leases[i].Epoch = true, epoch
		}
	}
	slices.SortFunc(s.Leases, func(a, b liveness.LeaseStats) int { return strings.Compare(a.Name, b.Name) })
	return s
}
