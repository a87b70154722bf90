// The alive lock: its configuration, and the settings of its session that make the
// server free it within seconds of the client going silent.

package liveness

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sys/unix"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

const (
	aliveLockStatementTimeout = 5 * time.Second
	aliveLockConnectTimeout   = 10 * time.Second
	aliveLockCloseTimeout     = 5 * time.Second
	reconnectBackoffMin       = 250 * time.Millisecond
	reconnectBackoffMax       = 10 * time.Second
	// reclaimEvery is how often a lock that is not held is claimed again.
	reclaimEvery = time.Second
	// reclaimFast is how often it is claimed again while a session that claimed it for
	// this instance holds it (this process's previous session, not ended yet, or a
	// duplicate), for reclaimFastFor after the first refusal. After a network cut heals,
	// the previous session ends when its FIN reaches the server; the watcher stamps the
	// lock vanished then, and the new claim and the beat that records it must land within
	// the lock grace, or this live process is called dead. At reclaimEvery, the same 1 s
	// as the grace, they could not (a soak's false-dead after a 30 s cut).
	reclaimFast    = 50 * time.Millisecond
	reclaimFastFor = time.Minute
)

// aliveLockConfig configures an AliveLock. Zero keepalive and verify settings take the
// package defaults.
type aliveLockConfig struct {
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
	// LeaderVerifyInterval replaces VerifyInterval while the instance leads (lead): a
	// leader trusts its lock only briefly after the last proof (the Agent: a quarter of
	// the lock grace). Zero means VerifyInterval.
	LeaderVerifyInterval time.Duration

	// Logger receives the lock's lines, passwords removed; nil discards. The lock adds
	// no key of its own: an owner adds what names it (the Agent adds part=alive_lock).
	Logger *slog.Logger

	// Events, when set, receives the schema's notifications: the session LISTENs on the
	// events channel once it holds the lock (so only on the server's own session, never
	// on a pooled one).
	Events *events
}

// aliveLock holds the instance's session-level advisory lock on a dedicated connection.
// PostgreSQL releases the lock when the session ends, which makes it the fast liveness
// signal: at once on a clean exit or a crash, and after the keepalive settings on a
// half-open connection.
type aliveLock struct {
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
	events            *events
	log               *slog.Logger

	running atomic.Bool
	// serverBack cuts the pause before the next connection short: the database answers
	// again (the heartbeat got through), so the lock need not wait out its backoff.
	serverBack chan struct{}
	lockState
	// wakeWait ends the holding state's wait, so that a proof wanted now is not made to
	// wait for the verification interval; woken says one was wanted while no wait ran.
	wakeMu   sync.Mutex
	woken    bool
	wakeWait context.CancelCauseFunc

	// Owned by the Run goroutine.
	connectedOnce bool
	lastExchange  time.Time   // when the last statement that got an answer was sent
	members       atomic.Bool // whether the session listens to the members channel
	// The server's clock in that statement's answer, and its round trip (lockProof).
	lastServerClock time.Time
	lastRoundTrip   time.Duration
	condition       logging.Repeats

	// afterConnect lets tests inspect the lock's own session; nil otherwise.
	afterConnect func(ctx context.Context, conn *pgx.Conn)
}

// validate checks the configuration without connecting. Errors name the field at fault
// and never contain the password.
func (c aliveLockConfig) validate() error {
	_, _, err := c.connConfig()
	return err
}

// validateTiming checks what does not concern the connection: the verification
// interval, for a lock held through a node agent.
func (c aliveLockConfig) validateTiming() error {
	if c.VerifyInterval < 0 {
		return aliveLockErr("VerifyInterval", "(%s) must not be negative", c.VerifyInterval)
	}
	return nil
}

// connConfig validates c and builds the lock connection's configuration. It also returns
// the client socket's user timeout.
func (c aliveLockConfig) connConfig() (*pgx.ConnConfig, time.Duration, error) {
	if strings.TrimSpace(c.DSN) == "" {
		return nil, 0, aliveLockErr("DSN", "must not be empty")
	}
	if c.InstanceID == uuid.Nil {
		return nil, 0, aliveLockErr("InstanceID", "must not be the nil UUID")
	}
	if strings.TrimSpace(c.ServiceName) == "" {
		return nil, 0, aliveLockErr("ServiceName", "must not be empty")
	}
	idle, err := wholeSeconds("KeepaliveIdle", c.KeepaliveIdle, defaults.KeepaliveIdle)
	if err != nil {
		return nil, 0, err
	}
	interval, err := wholeSeconds("KeepaliveInterval", c.KeepaliveInterval, defaults.KeepaliveInterval)
	if err != nil {
		return nil, 0, err
	}
	count, err := orDefault("KeepaliveCount", c.KeepaliveCount, defaults.KeepaliveCount)
	if err != nil {
		return nil, 0, err
	}
	userTimeout, err := orDefault("UserTimeout", c.UserTimeout, defaults.UserTimeout)
	if err != nil {
		return nil, 0, err
	}
	if userTimeout < time.Millisecond {
		return nil, 0, aliveLockErr("UserTimeout", "(%s) must be at least 1ms", userTimeout)
	}
	if c.VerifyInterval < 0 {
		return nil, 0, aliveLockErr("VerifyInterval", "(%s) must not be negative", c.VerifyInterval)
	}

	cfg, err := pgx.ParseConfig(c.DSN)
	if err != nil {
		return nil, 0, &ConfigError{Field: "aliveLockConfig.DSN", Reason: logging.RedactError(err).Error()}
	}
	rp := cfg.RuntimeParams
	rp["application_name"] = c.ServiceName + ":alive-lock"
	rp["tcp_keepalives_idle"] = strconv.Itoa(int(idle / time.Second))
	rp["tcp_keepalives_interval"] = strconv.Itoa(int(interval / time.Second))
	rp["tcp_keepalives_count"] = strconv.Itoa(count)
	rp["tcp_user_timeout"] = strconv.FormatInt(userTimeout.Milliseconds(), 10)
	rp["idle_session_timeout"] = "0"
	// No named prepared statements: they would not survive a pooler, and then the
	// verification could not say what went wrong.
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	// The client side of the socket gets its own keepalive and user timeout, one probe
	// short of the server's, so that an agent cut off from the database stops trusting
	// its lock before the server frees it for someone else.
	clientCount := max(count-1, 1)
	clientUserTimeout := min(userTimeout, idle+interval*time.Duration(clientCount))
	dialer := &net.Dialer{
		Timeout: cfg.ConnectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: idle, Interval: interval, Count: clientCount,
		},
		Control: func(network, _ string, rc syscall.RawConn) error {
			if !strings.HasPrefix(network, "tcp") {
				// A unix socket (a server on this host) has no network to be cut
				// off by: the server's end of it closes when the session ends.
				return nil
			}
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(clientUserTimeout.Milliseconds()))
			})
			return cmp.Or(err, serr)
		},
	}
	cfg.DialFunc = dialer.DialContext
	return cfg, clientUserTimeout, nil
}

// statementTimeout bounds one claim or verification. A cut-off network is detected by the
// socket's keepalive and user timeout, so the deadline lies beyond them: a short network
// blip delays a verification instead of dropping a lock that the server still grants.
func (a *aliveLock) statementTimeout() time.Duration {
	return max(aliveLockStatementTimeout, a.clientUserTimeout+aliveLockStatementTimeout)
}

func aliveLockErr(field, format string, args ...any) error {
	return &ConfigError{Field: "aliveLockConfig." + field, Reason: fmt.Sprintf(format, args...)}
}

// orDefault is v, or def when v is zero; a negative v is refused.
func orDefault[T int | time.Duration](field string, v, def T) (T, error) {
	switch {
	case v < 0:
		return 0, aliveLockErr(field, "(%v) must not be negative", v)
	case v == 0:
		return def, nil
	}
	return v, nil
}

// wholeSeconds is orDefault for a setting PostgreSQL takes in whole seconds only.
func wholeSeconds(field string, d, def time.Duration) (time.Duration, error) {
	d, err := orDefault(field, d, def)
	if err == nil && d%time.Second != 0 {
		return 0, aliveLockErr(field, "(%s) must be a whole number of seconds", d)
	}
	return d, err
}

// newAliveLock validates cfg and prepares the lock. It does not connect; Run does.
func newAliveLock(cfg aliveLockConfig) (*aliveLock, error) {
	connCfg, clientUserTimeout, err := cfg.connConfig()
	if err != nil {
		return nil, err // a *ConfigError naming the aliveLockConfig field
	}
	a := &aliveLock{
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
			if e, ok := parseEvent(n.Payload); ok {
				a.events.publish(e)
			}
		}
		// Wanting membership or no longer wanting it takes a statement on this session.
		a.events.onMembersWantChanged(a.wake)
	}
	if a.verifyEvery == 0 {
		a.verifyEvery = defaults.VerifyInterval
	}
	a.leaderEvery = cmp.Or(cfg.LeaderVerifyInterval, a.verifyEvery)
	a.lockState.init()
	a.lockState.wake = a.wake
	return a, nil
}
