// An Agent's configuration: AgentConfig, its defaults and Validate, the shutdown budget,
// and the configurations of the parts the Agent builds from it.

package liveness

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/alivelock"
	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/lease"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/nodeagent/proto"
	"github.com/pg-liveness/pg_liveness_exporter/internal/notify"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// AgentConfig configures an Agent: one instance that takes part in the fleet. Zero values
// take the defaults (the Default* constants); Pool, InstanceID and ServiceName must be
// set, and DirectDSN too unless Mode is ModeHeartbeatTableOnly or NodeAgentSocket is set.
type AgentConfig struct {
	// Pool runs every short statement: the heartbeat, the leases, the reaper. It may go
	// through PgBouncer.
	Pool *pgxpool.Pool
	// DirectDSN reaches PostgreSQL itself, never a pooler in transaction mode: the alive
	// lock's own connection. Unused in ModeHeartbeatTableOnly, and with NodeAgentSocket.
	DirectDSN string
	// NodeAgentSocket, when set, is where the node agent of this host listens (the
	// pg_liveness_exporter binary run with --node-agent.socket or
	// --node-agent.listen-address): the path of its unix socket, or "tcp://host:port" for
	// its TCP listener, with NodeAgentToken (in Kubernetes, a Service with
	// internalTrafficPolicy Local in front of the node agents). The alive
	// lock is held on the node agent's one session for every process of the node, instead
	// of on a session of this process's own, and the schema's events arrive through it.
	// The lock is let go when this process's connection to the node agent closes, however
	// the process ends. While the node agent cannot be reached (it restarts, say) the
	// instance is judged by its heartbeat and leads nothing, and it attaches again as
	// soon as the node agent answers. Unused in ModeHeartbeatTableOnly.
	NodeAgentSocket string
	// NodeAgentToken is the node agent's token (the file of its --node-agent.token-file),
	// which a process presents to attach over TCP; unused with a unix socket. Never
	// logged.
	NodeAgentToken string
	Schema         string // "liveness" if empty
	InstanceID     uuid.UUID
	ServiceName    string
	HostName       string // os.Hostname() if empty
	ProcessID      int    // os.Getpid() if zero
	Mode           Mode   // ModeAdvisoryLockWhenAvailable if empty

	// Timing is recorded in the instance's row, and the fleet judges the instance by it.
	Timing Timing
	// VerifyInterval is how often the alive lock is verified on its own backend while
	// the agent holds no lease; 30 s if zero. While it holds any (a
	// campaign's, the reaper's, a watcher's) the lock is verified every quarter of
	// Timing.LockGrace (or VerifyInterval, if shorter): a leader trusts its lock only
	// three quarters of the lock grace after the last verification was sent (see "What a
	// leader guarantees" in the package documentation).
	VerifyInterval time.Duration
	// Metadata is stored in the instance row's metadata column; it must marshal to JSON.
	Metadata map[string]any

	// The alive lock's session: server-side TCP keepalive and user timeout. Zero takes
	// 10 s idle, then 3 probes 5 s apart, and a 30 s user timeout: the server then ends
	// a half-open client's session, and so frees its lock, after about 25-30 s instead of
	// Linux's two hours.
	KeepaliveIdle     time.Duration
	KeepaliveInterval time.Duration
	KeepaliveCount    int
	UserTimeout       time.Duration

	// Reaper runs cleanup_stale_instances every ReaperInterval (30 s if zero) on one
	// agent at a time, under the lease "pg_liveness.reaper" (ReaperLeaseTTL, 2 min if zero).
	Reaper         bool
	ReaperInterval time.Duration
	ReaperLeaseTTL time.Duration
	// HistoryRetention is how long the schema's history of leaderships and deaths
	// (migration 0020) keeps a row: the reaper deletes older ones, a bounded batch per
	// round. 7 days if zero.
	HistoryRetention time.Duration

	// DisableWatcher keeps this agent out of the watchers' campaigns (the leases
	// "pg_liveness.watcher.a" and ".b"). By
	// default every agent takes part, and two of them, in two processes, record the
	// vanishing of any alive lock within 250 ms and notify the waiters; without a
	// watcher the first look records it, and a crash is dead a lock grace after that
	// look instead of after the crash.
	DisableWatcher bool

	// JobWindDown is how long a campaign's OnStartedLeading may take to return after its
	// context was cancelled because the campaign ended (Elect's context or Run's): its
	// lease stays renewed meanwhile, and Run keeps the instance alive. Past it the lease
	// is left to expire. 10 s if zero.
	JobWindDown time.Duration
	// ShutdownTimeout bounds the deletion of the instance row on the way out;
	// 5 s if zero.
	ShutdownTimeout time.Duration
	// DuplicateTimeout is how long the agent waits, writing nothing, while another session
	// holds its instance's alive lock, before Run gives up with ErrDuplicateInstance.
	// A restarted process may find its previous session's lock for up to the keepalive
	// bound (about 30 s); a second process with the same id finds it for good.
	// 2 min if zero.
	DuplicateTimeout time.Duration
	// WaitForSchema makes Run wait for the migrations to be applied (by another process)
	// instead of failing at once when the schema is missing or older than this library.
	WaitForSchema bool
	// Logger receives the agent's lines, passwords removed; nil discards. The agent adds
	// no key naming itself: add what tells agents apart (an instance id) with With. Its
	// parts' lines carry part=alive_lock, heartbeat, leases or reaper.
	Logger *slog.Logger
}

// shutdownSteps are the deadlines of Run's clean-up, one after the other, once its
// context ends; ShutdownBudget is their sum, and Run uses these very values.
type shutdownSteps struct {
	windDown  time.Duration // the campaigns' jobs return, their leases still renewed
	letGo     time.Duration // their leases are released, or left to expire
	beat      time.Duration // a beat in flight finishes
	removeRow time.Duration // the instance row is deleted
	closeLock time.Duration // the alive lock's session is closed
}

func (c AgentConfig) shutdownSteps() shutdownSteps {
	c = c.withDefaults()
	s := shutdownSteps{windDown: c.JobWindDown, letGo: lease.ReleaseTimeout, beat: beatTimeout(c.Timing.HeartbeatInterval),
		removeRow: c.ShutdownTimeout, closeLock: alivelock.CloseTimeout}
	if c.Mode == ModeHeartbeatTableOnly {
		s.closeLock = 0 // no lock, no session
	}
	return s
}

func (s shutdownSteps) total() time.Duration {
	return s.windDown + s.letGo + s.beat + s.removeRow + s.closeLock
}

// ShutdownBudget is the longest Run takes to return once its context ends, with this
// configuration (defaults filled in). The steps run one after the other, each under its
// own deadline: the campaigns' jobs get JobWindDown to return while their leases are
// still renewed and the instance still proves life, then their leases are released (or
// left to expire) within 5 s; a beat in flight finishes (half the heartbeat interval, at
// most 10 s); the instance row is deleted (ShutdownTimeout); the alive lock's session is
// closed (5 s). With the defaults that is 10 + 5 + 10 + 5 + 5 = 35 s. Give a process that
// runs an Agent at least this long between SIGTERM and SIGKILL, plus whatever else it
// does on the way out.
func (c AgentConfig) ShutdownBudget() time.Duration { return c.shutdownSteps().total() }

// withDefaults fills zero values with the documented defaults. Negative values stay, for
// Validate to refuse.
func (c AgentConfig) withDefaults() AgentConfig {
	c.Schema = cmp.Or(c.Schema, defaults.Schema)
	c.Mode = cmp.Or(c.Mode, ModeAdvisoryLockWhenAvailable)
	c.Timing = timingWithDefaults(c.Timing)
	c.ReaperInterval = cmp.Or(c.ReaperInterval, defaults.ReaperInterval)
	c.ReaperLeaseTTL = cmp.Or(c.ReaperLeaseTTL, defaults.ReaperLeaseTTL)
	c.HistoryRetention = cmp.Or(c.HistoryRetention, defaults.HistoryRetention)
	c.JobWindDown = cmp.Or(c.JobWindDown, defaults.JobWindDown)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, defaults.ShutdownTimeout)
	c.DuplicateTimeout = cmp.Or(c.DuplicateTimeout, defaults.DuplicateTimeout)
	return c
}

// lockMode reports whether the agent holds an alive lock.
func (c AgentConfig) lockMode() bool { return c.Mode != ModeHeartbeatTableOnly }

// aliveLockFields names, for each field of the alive lock's session configuration, the
// AgentConfig field it comes from, so that an Agent's errors name what its caller set.
var aliveLockFields = map[string]string{
	alivelock.Field("DSN"):               "AgentConfig.DirectDSN",
	alivelock.Field("InstanceID"):        "AgentConfig.InstanceID",
	alivelock.Field("ServiceName"):       "AgentConfig.ServiceName",
	alivelock.Field("KeepaliveIdle"):     "AgentConfig.KeepaliveIdle",
	alivelock.Field("KeepaliveInterval"): "AgentConfig.KeepaliveInterval",
	alivelock.Field("KeepaliveCount"):    "AgentConfig.KeepaliveCount",
	alivelock.Field("UserTimeout"):       "AgentConfig.UserTimeout",
	alivelock.Field("VerifyInterval"):    "AgentConfig.VerifyInterval",
}

// asAgentError renames the alive lock's session's *store.ConfigError to the AgentConfig
// fields, as a *ConfigError.
func asAgentError(err error) error {
	var se *store.ConfigError
	if !errors.As(err, &se) {
		return err
	}
	out := &ConfigError{Field: se.Field, Reason: se.Reason}
	if f, ok := aliveLockFields[out.Field]; ok {
		out.Field = f
	}
	for from, to := range aliveLockFields {
		out.Reason = strings.ReplaceAll(out.Reason, from, to)
	}
	return out
}

// Validate refuses configuration that NewAgent would refuse: a missing Pool or
// identity, or timing that would make an alive instance look dead or a dead one look
// alive, after filling zero values with the defaults. Errors are *ConfigError naming the
// AgentConfig field.
func (c AgentConfig) Validate() error {
	c = c.withDefaults()
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: "AgentConfig." + field, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case c.Pool == nil:
		return bad("Pool", "must be set")
	case strings.TrimSpace(c.ServiceName) == "":
		return bad("ServiceName", "must not be empty")
	case c.InstanceID == uuid.Nil:
		return bad("InstanceID", "must not be the nil UUID")
	}
	if _, ok := parseMode(string(c.Mode)); !ok {
		return bad("Mode", "%q is unknown (want %s or %s)", c.Mode, ModeAdvisoryLockWhenAvailable, ModeHeartbeatTableOnly)
	}
	if err := checkTiming(c.Timing, "AgentConfig.Timing"); err != nil {
		return err
	}
	if len(c.Metadata) > 0 {
		if _, err := json.Marshal(c.Metadata); err != nil {
			return bad("Metadata", "does not marshal to JSON: %v", err)
		}
	}
	if c.Reaper {
		if c.ReaperInterval < 0 {
			return bad("ReaperInterval", "(%s) must be positive", c.ReaperInterval)
		}
		if c.ReaperLeaseTTL < time.Second {
			return bad("ReaperLeaseTTL", "(%s) must be at least 1s: it is renewed every ttl/4", c.ReaperLeaseTTL)
		}
		if c.HistoryRetention < time.Minute {
			return bad("HistoryRetention", "(%s) must be at least 1m", c.HistoryRetention)
		}
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"JobWindDown", c.JobWindDown}, {"ShutdownTimeout", c.ShutdownTimeout}, {"DuplicateTimeout", c.DuplicateTimeout}} {
		if f.d < 0 {
			return bad(f.name, "(%s) must not be negative", f.d)
		}
	}
	switch {
	case c.lockMode() && c.NodeAgentSocket != "":
		if strings.TrimSpace(c.NodeAgentSocket) != c.NodeAgentSocket {
			return bad("NodeAgentSocket", "(%q) must not begin or end with spaces", c.NodeAgentSocket)
		}
		if err := c.checkNodeAgentTCP(); err != nil {
			return err
		}
		if err := c.aliveLockConfig().Session().ValidateTiming(); err != nil {
			return asAgentError(err)
		}
	case c.lockMode():
		if err := c.aliveLockConfig().Session().Validate(); err != nil {
			return asAgentError(err)
		}
	}
	return nil
}

// checkNodeAgentTCP checks a NodeAgentSocket of the form tcp://host:port, and its token.
func (c AgentConfig) checkNodeAgentTCP() error {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: "AgentConfig." + field, Reason: fmt.Sprintf(format, args...)}
	}
	addr, ok := strings.CutPrefix(c.NodeAgentSocket, alivelock.NodeAgentTCPScheme)
	if !ok {
		if scheme, _, found := strings.Cut(c.NodeAgentSocket, "://"); found {
			return bad("NodeAgentSocket", "(%q): %s:// is not a node agent's; give a unix socket's path or tcp://host:port",
				c.NodeAgentSocket, scheme)
		}
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if p, perr := strconv.ParseUint(port, 10, 16); err != nil || host == "" || perr != nil || p == 0 {
		return bad("NodeAgentSocket", "(%q) is not tcp://host:port with a port number", c.NodeAgentSocket)
	}
	switch {
	case c.NodeAgentToken == "":
		return bad("NodeAgentToken", "must be set with a NodeAgentSocket of tcp://: the node agent takes no attach over "+
			"TCP without its token")
	case len(c.NodeAgentToken) < proto.TokenMin:
		return bad("NodeAgentToken", "must be at least %d bytes, as the node agent's is", proto.TokenMin)
	}
	return nil
}

// nodeLockConfig is the lock's configuration through a node agent.
func (c AgentConfig) nodeLockConfig(ev *notify.Hub) alivelock.NodeConfig {
	lc := c.aliveLockConfig()
	return alivelock.NodeConfig{Socket: c.NodeAgentSocket, Token: c.NodeAgentToken, InstanceID: c.InstanceID, Schema: c.Schema, Pool: c.Pool,
		LeaderVerifyInterval: lc.LeaderVerifyInterval, Events: ev, Logger: lc.Logger}
}

func (c AgentConfig) aliveLockConfig() alivelock.DirectConfig {
	return alivelock.DirectConfig{
		DSN:               c.DirectDSN,
		Schema:            c.Schema,
		InstanceID:        c.InstanceID,
		ServiceName:       c.ServiceName,
		KeepaliveIdle:     c.KeepaliveIdle,
		KeepaliveInterval: c.KeepaliveInterval,
		KeepaliveCount:    c.KeepaliveCount,
		UserTimeout:       c.UserTimeout,
		VerifyInterval:    c.VerifyInterval,
		// A leader trusts its lock only briefly after each proof (lifeMonitor).
		LeaderVerifyInterval: min(cmp.Or(c.VerifyInterval, defaults.VerifyInterval), leaderVerifyInterval(c.Timing.LockGrace)),
		Logger:               logging.Wrap(c.Logger).With("part", "alive_lock"),
	}
}

func (c AgentConfig) heartbeatConfig(lock lockSource) heartbeatConfig {
	return heartbeatConfig{
		Pool:        c.Pool,
		Schema:      c.Schema,
		InstanceID:  c.InstanceID,
		ServiceName: c.ServiceName,
		HostName:    c.HostName,
		ProcessID:   c.ProcessID,
		Mode:        c.Mode,
		Timing:      c.Timing,
		Lock:        lock,
		Metadata:    c.Metadata,
		Logger:      logging.Wrap(c.Logger).With("part", "heartbeat"),
	}
}
