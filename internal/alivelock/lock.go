// The alive lock on a direct session of its own: its configuration, and its construction
// from the settings of its session (Config) that make the server free it within seconds of
// the client going silent.

package alivelock

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/notify"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

const (
	// reclaimFast is how often a lock is claimed again while a session that claimed it for
	// this instance holds it (this process's previous session, not ended yet, or a
	// duplicate), for reclaimFastFor after the first refusal. After a network cut heals,
	// the previous session ends when its FIN reaches the server; the watcher stamps the
	// lock vanished then, and the new claim and the beat that records it must land within
	// the lock grace, or this live process is called dead. At ReclaimEvery, the same 1 s
	// as the grace, they could not (a soak's false-dead after a 30 s cut).
	reclaimFast    = 50 * time.Millisecond
	reclaimFastFor = time.Minute
)

// DirectConfig configures a Direct lock. Zero keepalive and verify settings take the
// defaults (package defaults).
type DirectConfig struct {
	// DSN of PostgreSQL itself (--db.direct-dsn), not of a transaction-mode pooler.
	DSN         string
	Schema      string // where the migrations put the objects; "liveness" if empty
	InstanceID  uuid.UUID
	ServiceName string // names the connection: application_name is "<ServiceName>:alive-lock"

	// Server-side TCP keepalive and user timeout of the lock's session, passed as startup
	// parameters. Idle and Interval are whole seconds. The client socket gets the same
	// keepalive, so that this side notices a dead server too.
	KeepaliveIdle     time.Duration
	KeepaliveInterval time.Duration
	KeepaliveCount    int
	UserTimeout       time.Duration

	// VerifyInterval is how often the lock is re-verified (or, while not held, re-claimed).
	// A dropped connection is noticed at once, independently of it.
	VerifyInterval time.Duration
	// LeaderVerifyInterval replaces VerifyInterval while the instance leads (Lead): a
	// leader trusts its lock only briefly after the last proof (the Agent: a quarter of
	// the lock grace). Zero means VerifyInterval.
	LeaderVerifyInterval time.Duration

	// Logger receives the lock's lines, passwords removed; nil discards. The lock adds
	// no key of its own: an owner adds what names it (the Agent adds part=alive_lock).
	Logger *slog.Logger

	// Events, when set, receives the schema's notifications: the session LISTENs on the
	// events channel once it holds the lock (so only on the server's own session, never
	// on a pooled one).
	Events *notify.Hub
}

// Direct holds the instance's session-level advisory lock on a dedicated connection.
// PostgreSQL releases the lock when the session ends, which makes it the fast liveness
// signal: at once on a clean exit or a crash, and after the keepalive settings on a
// half-open connection. It is a Lock.
type Direct struct {
	connCfg     *pgx.ConnConfig
	instanceID  string
	verifyEvery time.Duration
	leaderEvery time.Duration // verifyEvery while leading > 0
	// clientUserTimeout is the socket's TCP_USER_TIMEOUT: how long unacknowledged data
	// may wait before the connection is given up.
	clientUserTimeout time.Duration
	claimSQL          string
	verifySQL         string
	holderSQL         string
	listenSQL         string
	membersSQL        string // LISTEN on the members channel
	unmembersSQL      string // UNLISTEN it
	events            *notify.Hub
	log               *slog.Logger

	running atomic.Bool
	// serverBack cuts the pause before the next connection short: the database answers
	// again (the heartbeat got through), so the lock need not wait out its backoff.
	serverBack chan struct{}
	state
	// wakeWait ends the holding state's wait, so that a proof wanted now is not made to
	// wait for the verification interval; woken says one was wanted while no wait ran.
	wakeMu   sync.Mutex
	woken    bool
	wakeWait context.CancelCauseFunc

	// Owned by the Run goroutine.
	connectedOnce bool
	lastExchange  time.Time   // when the last statement that got an answer was sent
	members       atomic.Bool // whether the session listens to the members channel
	// The server's clock in that statement's answer, and its round trip (Proof).
	lastServerClock time.Time
	lastRoundTrip   time.Duration
	condition       logging.Repeats

	// afterConnect lets tests inspect the lock's own session; nil otherwise.
	afterConnect func(ctx context.Context, conn *pgx.Conn)
}

// Session is the configuration of the lock's session: its errors name Config's fields,
// which the owner maps to its own config's.
func (c DirectConfig) Session() Config {
	return Config{DSN: c.DSN, InstanceID: c.InstanceID, ServiceName: c.ServiceName,
		KeepaliveIdle: c.KeepaliveIdle, KeepaliveInterval: c.KeepaliveInterval, KeepaliveCount: c.KeepaliveCount,
		UserTimeout: c.UserTimeout, VerifyInterval: c.VerifyInterval}
}

// statementTimeout bounds one claim or verification (StatementTimeoutFor).
func (a *Direct) statementTimeout() time.Duration {
	return StatementTimeoutFor(a.clientUserTimeout)
}

// NewDirect validates cfg and prepares the lock. It does not connect; Run does.
func NewDirect(cfg DirectConfig) (*Direct, error) {
	connCfg, clientUserTimeout, err := cfg.Session().ConnConfig()
	if err != nil {
		return nil, err // a *store.ConfigError naming the Config field
	}
	a := &Direct{
		connCfg:           connCfg,
		instanceID:        cfg.InstanceID.String(),
		verifyEvery:       cfg.VerifyInterval,
		clientUserTimeout: clientUserTimeout,
		claimSQL:          store.AliveLockClaim.In(cfg.Schema).SQL,
		verifySQL:         store.AliveLockVerify.In(cfg.Schema).SQL,
		holderSQL:         store.AliveLockHolder.In(cfg.Schema).SQL,
		listenSQL:         store.EventsListen.In(cfg.Schema).SQL,
		membersSQL:        store.MembersListen.In(cfg.Schema).SQL,
		unmembersSQL:      store.MembersUnlisten.In(cfg.Schema).SQL,
		events:            cfg.Events,
		log:               logging.Wrap(cfg.Logger),
		serverBack:        make(chan struct{}, 1),
	}
	if given, err := pgx.ParseConfig(cfg.DSN); err == nil {
		if name, ours := given.RuntimeParams["application_name"], connCfg.RuntimeParams["application_name"]; name != "" && name != ours {
			// The exporter's metrics label the alive locks by it, and a label value must
			// stay bounded: the service and the role, never an instance.
			a.log.Info("the alive lock's session is named by the library, not by the direct DSN's application_name: "+
				"it names the service and the role, a bounded label of the exporter's metrics",
				"application_name", ours, "dsn_application_name", name)
		}
	}
	if a.events != nil {
		// Called by pgconn whenever a notification arrives, while waiting or during a
		// statement.
		a.connCfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) {
			if e, ok := notify.Parse(n.Payload); ok {
				a.events.Publish(e)
			}
		}
		// Wanting membership or no longer wanting it takes a statement on this session.
		a.events.OnMembersWantChanged(a.wake)
	}
	if a.verifyEvery == 0 {
		a.verifyEvery = defaults.VerifyInterval
	}
	a.leaderEvery = cmp.Or(cfg.LeaderVerifyInterval, a.verifyEvery)
	a.state.init()
	a.state.wake = a.wake
	return a, nil
}

// Members reports whether the session listens to the members channel now: only while
// something in the process waits for membership (notify.Hub.MembersWanted), which the
// library's tests check.
func (a *Direct) Members() bool { return a.members.Load() }

// Logger is what the lock writes to: DirectConfig.Logger, passwords removed, which the
// library's tests check.
func (a *Direct) Logger() *slog.Logger { return a.log }
