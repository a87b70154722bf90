package liveness

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
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

	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// Defaults of the alive lock's session (AgentConfig.Keepalive*, VerifyInterval). With them the server drops a half-open client's session,
// and so frees its lock, after about 25–30 s instead of Linux's two hours: 10 s idle, then
// 3 probes 5 s apart, and unacknowledged data gives up after 30 s.
const (
	DefaultKeepaliveIdle     = 10 * time.Second
	DefaultKeepaliveInterval = 5 * time.Second
	DefaultKeepaliveCount    = 3
	DefaultUserTimeout       = 30 * time.Second
	DefaultVerifyInterval    = 10 * time.Second
)

const (
	aliveLockStatementTimeout = 5 * time.Second
	aliveLockConnectTimeout   = 10 * time.Second
	aliveLockCloseTimeout     = 5 * time.Second
	reconnectBackoffMin       = 250 * time.Millisecond
	reconnectBackoffMax       = 10 * time.Second
	// reclaimEvery is how often a lock that is not held is claimed again.
	reclaimEvery = time.Second
)

// aliveLockConfig configures an AliveLock. Zero keepalive and verify settings take the
// package defaults.
type aliveLockConfig struct {
	// DSN of PostgreSQL itself (--db.direct-dsn), not of a transaction-mode pooler.
	DSN         string
	Schema      string // where the migrations put the objects; DefaultSchema if empty
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
	idle, err := wholeSeconds("KeepaliveIdle", c.KeepaliveIdle, DefaultKeepaliveIdle)
	if err != nil {
		return nil, 0, err
	}
	interval, err := wholeSeconds("KeepaliveInterval", c.KeepaliveInterval, DefaultKeepaliveInterval)
	if err != nil {
		return nil, 0, err
	}
	count, err := orDefault("KeepaliveCount", c.KeepaliveCount, DefaultKeepaliveCount)
	if err != nil {
		return nil, 0, err
	}
	userTimeout, err := orDefault("UserTimeout", c.UserTimeout, DefaultUserTimeout)
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
		a.verifyEvery = DefaultVerifyInterval
	}
	a.leaderEvery = cmp.Or(cfg.LeaderVerifyInterval, a.verifyEvery)
	a.lockState.init()
	a.lockState.wake = a.wake
	return a, nil
}

// Run connects, claims, verifies and reconnects (with backoff and jitter) until ctx is
// done; it then closes its connection, which releases the lock, and returns nil. Failures
// are logged, never returned: the heartbeat carries liveness while the lock is not held.
func (a *aliveLock) Run(ctx context.Context) error {
	if !a.running.CompareAndSwap(false, true) {
		return errors.New("liveness: alive lock: Run is already running")
	}
	defer a.running.Store(false)
	attempt := 0
	for {
		began := time.Now()
		held := a.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		// A session that held the lock, or lasted, resets the backoff: the next loss is a
		// new incident, to be recovered from at once. A connection that keeps failing or
		// dropping at once backs off further.
		if held || time.Since(began) > reconnectBackoffMax {
			attempt = 0
		}
		attempt++
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff(attempt)):
		}
	}
}

// backoff doubles from reconnectBackoffMin up to reconnectBackoffMax, with jitter in the
// upper half so that a fleet does not reconnect in step after a server restart.
func backoff(attempt int) time.Duration {
	d := reconnectBackoffMax
	if attempt < 16 {
		d = min(reconnectBackoffMin<<(attempt-1), reconnectBackoffMax)
	}
	return d/2 + rand.N(d/2+1)
}

// session runs one connection in two states, as long as the connection lasts: claiming
// until the lock is held, then holding (verifying) until it is not, and claiming again.
// Between statements a read on the idle connection notices at once when the server ends
// the session. It reports whether the lock was held at some point.
func (a *aliveLock) session(ctx context.Context) (held bool) {
	cctx, cancel := context.WithTimeout(ctx, aliveLockConnectTimeout)
	conn, err := pgx.ConnectConfig(cctx, a.connCfg)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			a.connectFailed(err)
		}
		return
	}
	if a.connectedOnce {
		a.reconnects.Add(1)
	}
	a.connectedOnce = true
	defer func() {
		a.events.setListening(false)
		if ctx.Err() != nil {
			a.release() // shutting down: not a loss
		} else {
			a.setHeld(false)
		}
		closeCtx, cancel := context.WithTimeout(context.Background(), aliveLockCloseTimeout)
		defer cancel()
		_ = conn.Close(closeCtx) // ends the session, which releases the lock
	}()
	if a.afterConnect != nil {
		a.afterConnect(ctx, conn)
	}

	a.lastExchange = time.Now()
	listening := false
	a.members.Store(false) // a new session listens to nothing
	for {
		if !a.runClaimingState(ctx, conn) {
			return held
		}
		held = true
		if !listening && a.events != nil {
			listening = a.listen(ctx, conn)
		}
		if listening {
			a.syncMembers(ctx, conn)
		}
		if !a.runHoldingState(ctx, conn, listening) {
			return held
		}
	}
}

// runClaimingState claims the lock until it is held, and returns true then. While another
// session holds it (a duplicate, or this instance's previous backend that has not exited
// yet) or the server refuses the claim, it claims again every reclaimEvery (or
// verifyEvery, when shorter). It returns false when the connection must be dropped.
func (a *aliveLock) runClaimingState(ctx context.Context, conn *pgx.Conn) bool {
	var askedHolder time.Time
	for {
		ans, backendPID := a.ask(ctx, conn, a.claimSQL, a.instanceID, int64(conn.PgConn().PID()))
		switch ans {
		case answerDrop:
			return false
		case answerHeld:
			a.pid.Store(backendPID)
			a.noteProof(a.lastExchange, a.claims.Add(1))
			a.stranger.Store(false)
			a.setDuplicate(false)
			a.setHeld(true)
			a.report("held", slog.LevelInfo, "alive lock held", "backend_pid", backendPID)
			a.settledOnce()
			return true
		case answerNotHeld:
			// Whose session holds the key decides what this is: a pg_locks read, so asked
			// at the first refusal and then rarely.
			if askedHolder.IsZero() || time.Since(askedHolder) >= holderAskEvery {
				askedHolder = time.Now()
				if !a.judgeHolder(ctx, conn, backendPID) {
					return false
				}
			} else {
				a.reportHolder(backendPID, 0)
			}
			a.settledOnce()
		}
		if !a.wait(ctx, conn, min(a.verifyEvery, reclaimEvery)) {
			return false
		}
	}
}

// holderAskEvery is how often, while claims are refused, the session asks again who
// holds the key.
const holderAskEvery = 30 * time.Second

// judgeHolder asks who holds the key a claim found held, and reports it: a session the
// instance's row records as its claimant is this instance's (a duplicate, or its previous
// session not yet ended); any other is a stranger's, whose lock counts for nobody and
// which must not make this process give up as a duplicate would. It returns false when
// the connection must be dropped.
func (a *aliveLock) judgeHolder(ctx context.Context, conn *pgx.Conn, backendPID int64) bool {
	qctx, cancel := context.WithTimeout(ctx, a.statementTimeout())
	defer cancel()
	var holderPID int32
	var claimed bool
	err := conn.QueryRow(qctx, a.holderSQL, a.instanceID).Scan(&holderPID, &claimed)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return true // freed meanwhile: the next claim takes it
	case err != nil && (ctx.Err() != nil || conn.IsClosed()):
		return false
	case err != nil:
		// Not known: treat it as before this question existed, a duplicate.
		claimed = true
		a.log.Debug("cannot read who holds the alive lock's key", "error", err)
	}
	a.stranger.Store(!claimed)
	a.setDuplicate(claimed)
	a.reportHolder(backendPID, holderPID)
	return true
}

// reportHolder logs what the last look at the key's holder found (once per condition;
// repeats at debug level).
func (a *aliveLock) reportHolder(backendPID int64, holderPID int32) {
	if a.stranger.Load() {
		a.report("stranger", slog.LevelError,
			"alive lock's key held by a session that did not claim it for this instance (another role's "+
				"session, or an older binary's): that lock counts for nobody, and this instance is judged "+
				"by its heartbeat until the key is free; retrying",
			"backend_pid", backendPID, "holder_pid", holderPID)
		return
	}
	a.report("duplicate", slog.LevelWarn,
		"alive lock held by another session: a duplicate instance id, or this instance's previous "+
			"session not yet ended; retrying, the heartbeat goes on at the fast cadence",
		"backend_pid", backendPID, "holder_pid", holderPID)
}

// runHoldingState verifies every verifyEvery (leaderEvery while leading, and at once when
// a leadership begins or wants a proof), on the session's own backend, that the lock is
// still held. It returns true once it is not (it vanished, the server refused the
// verification, or the statements run on another backend), after the pause before the
// next claim, and false when the connection must be dropped.
func (a *aliveLock) runHoldingState(ctx context.Context, conn *pgx.Conn, listening bool) bool {
	for {
		every := a.verifyEvery
		if a.leading.Load() > 0 {
			every = a.leaderEvery
		}
		if !a.waitWakeable(ctx, conn, every) {
			return false
		}
		if listening {
			a.syncMembers(ctx, conn)
		}
		ans, backendPID := a.ask(ctx, conn, a.verifySQL, a.instanceID)
		switch ans {
		case answerDrop:
			return false
		case answerHeld:
			a.noteProof(a.lastExchange, a.claims.Load())
			a.setDuplicate(false)
			a.setHeld(true)
			a.report("held", slog.LevelInfo, "alive lock held", "backend_pid", backendPID)
			a.settledOnce()
			continue
		case answerNotHeld:
			a.setHeld(false)
			a.report("vanished", slog.LevelWarn, "alive lock no longer held by this session; re-claiming",
				"backend_pid", backendPID)
			a.settledOnce()
		}
		// Claim again soon, not at once: the backend that held it may just not have
		// exited yet.
		return a.wait(ctx, conn, min(a.verifyEvery, reclaimEvery))
	}
}

// wait waits d on the idle connection, whose read notices at once when the server ends
// the session. It returns false when ctx ended or the connection was lost (reported).
func (a *aliveLock) wait(ctx context.Context, conn *pgx.Conn, d time.Duration) bool {
	return a.waitFor(ctx, conn, d, false)
}

// waitWakeable is wait, cut short by wake.
func (a *aliveLock) waitWakeable(ctx context.Context, conn *pgx.Conn, d time.Duration) bool {
	return a.waitFor(ctx, conn, d, true)
}

// errWoken ends a wait that wake cut short.
var errWoken = errors.New("liveness: alive lock: proof wanted")

func (a *aliveLock) waitFor(ctx context.Context, conn *pgx.Conn, d time.Duration, wakeable bool) bool {
	deadline := time.Now().Add(d)
	for {
		pctx, wake := context.WithCancelCause(ctx)
		if wakeable {
			a.wakeMu.Lock()
			woken := a.woken
			a.woken, a.wakeWait = false, wake
			if woken {
				a.wakeWait = nil
			}
			a.wakeMu.Unlock()
			if woken {
				wake(nil)
				return true
			}
		}
		wctx, cancel := context.WithDeadline(pctx, deadline)
		err := conn.PgConn().WaitForNotification(wctx)
		cancel()
		if wakeable {
			// From here on a wake sets woken, for the next wait; one that came before
			// has cancelled pctx with errWoken.
			a.wakeMu.Lock()
			a.wakeWait = nil
			a.wakeMu.Unlock()
		}
		woken := context.Cause(pctx) == errWoken
		wake(nil)
		switch {
		case ctx.Err() != nil:
			return false
		case woken && !conn.IsClosed():
			return true // a proof is wanted now
		case err == nil:
			// A notification: OnNotification has handed it on. Wait on: a fleet's events
			// must not make every agent verify early.
			continue
		case pgconn.Timeout(err) && !conn.IsClosed():
			return true // time for the next statement
		default:
			a.report("lost", slog.LevelWarn, "alive lock connection lost; reconnecting",
				"held_before", a.held.Load(), "error", err)
			return false
		}
	}
}

// listen LISTENs on the schema's events channel on the session's own backend (the
// claim just proved it is), and wakes every waiter: notifications sent while no session
// listened are lost, so they read the state again. A failure is logged and left: the
// waiters poll.
func (a *aliveLock) listen(ctx context.Context, conn *pgx.Conn) bool {
	qctx, cancel := context.WithTimeout(ctx, aliveLockStatementTimeout)
	defer cancel()
	var channel string
	if err := conn.QueryRow(qctx, a.listenSQL).Scan(&channel); err != nil {
		if ctx.Err() == nil {
			a.log.Warn("cannot listen to the schema's events; waiters poll instead", "error", err)
		}
		return false
	}
	a.log.Debug("listening to the schema's events", "channel", channel)
	a.events.setListening(true)
	a.events.publish(event{Kind: eventResync})
	return true
}

// syncMembers listens to the members channel while something in the process waits for
// membership, and stops once nothing does (events.MembersWanted). A LISTEN that takes
// effect wakes the membership waiters, which may have missed events before it. A failure
// is logged at debug level and tried again at the next verification: the waiters poll.
func (a *aliveLock) syncMembers(ctx context.Context, conn *pgx.Conn) {
	want := a.events.MembersWanted()
	if want == a.members.Load() {
		return
	}
	sql := a.unmembersSQL
	if want {
		sql = a.membersSQL
	}
	qctx, cancel := context.WithTimeout(ctx, aliveLockStatementTimeout)
	defer cancel()
	var channel string
	if err := conn.QueryRow(qctx, sql).Scan(&channel); err != nil {
		a.log.Debug("cannot change listening to the members channel", "listen", want, "error", err)
		return
	}
	a.members.Store(want)
	if want {
		a.events.publish(event{Kind: eventResync})
	}
}

// wake makes the session verify the lock now, when it holds it: the wait before the next
// verification ends at once, or, if none runs, the next one does not begin. Safe from
// any goroutine.
func (a *aliveLock) wake() {
	if a == nil {
		return
	}
	a.wakeMu.Lock()
	defer a.wakeMu.Unlock()
	if a.wakeWait != nil {
		a.wakeWait(errWoken)
		return
	}
	a.woken = true
}

// noteProof records a claim or verification that answered "held", sent at sent, with
// the server's clock and the round trip of that statement.
func (a *aliveLock) noteProof(sent time.Time, claim uint64) {
	a.recordProof(lockProof{sent: sent, claim: claim, serverClock: a.lastServerClock, roundTrip: a.lastRoundTrip})
}

// answer is what a claim or a verification came to.
type answer int

const (
	// answerDrop: the connection failed, or ctx ended. Drop it and connect again.
	answerDrop answer = iota
	// answerNone: no answer to act on, already reported and Held cleared: the server
	// refused the statement (the objects may be missing), or it ran on another backend
	// than the session's own (a pooler). The connection stays.
	answerNone
	// answerHeld: this session holds the lock.
	answerHeld
	// answerNotHeld: it does not: another session holds it (a claim), or it vanished
	// (a verification).
	answerNotHeld
)

// ask sends the claim or the verification sql and checks that it ran on the session's
// own backend. With answerHeld and answerNotHeld it returns that backend's pid; the
// caller acts on the answer and then settles the first claim.
func (a *aliveLock) ask(ctx context.Context, conn *pgx.Conn, sql string, args ...any) (answer, int64) {
	// The server frees the lock of a client it has not heard from for its keepalive
	// time; the client socket gives up one probe earlier, counted from the last exchange.
	// A statement sent late in that span must not push this side's giving up past it.
	sent := time.Now()
	deadline := a.lastExchange.Add(a.clientUserTimeout)
	if limit := sent.Add(a.statementTimeout()); deadline.After(limit) {
		deadline = limit
	}
	if least := sent.Add(time.Second); deadline.Before(least) {
		deadline = least
	}
	qctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	startupPID := int64(conn.PgConn().PID())
	var backendPID int64
	var ok *bool // NULL from the claim when this is not our own session
	var serverClock time.Time
	err := conn.QueryRow(qctx, sql, args...).Scan(&backendPID, &ok, &serverClock)
	if err != nil {
		a.setHeld(false)
		if ctx.Err() != nil {
			return answerDrop, 0
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && !conn.IsClosed() {
			// The server answered, so the connection is fine; the objects may be missing
			// (migrations not applied yet). Try again on the next claim.
			a.settledOnce()
			a.report("error:"+pgErr.Code, slog.LevelError,
				"alive lock claim failed; the heartbeat goes on at the fast cadence",
				"error", err)
			return answerNone, 0
		}
		a.report("lost", slog.LevelWarn, "alive lock connection failed; reconnecting", "error", err)
		return answerDrop, 0
	}
	a.lastExchange = sent
	a.lastServerClock, a.lastRoundTrip = serverClock, time.Since(sent)
	if backendPID != startupPID {
		a.setHeld(false)
		a.report("pooled", slog.LevelError,
			"alive lock not held: statements on its connection run on another backend than the one the "+
				"server opened for it, so the direct DSN most likely points at PgBouncer in transaction "+
				"pooling mode (or another pooler); point the direct DSN at PostgreSQL itself",
			"startup_pid", startupPID, "backend_pid", backendPID)
		a.settledOnce()
		return answerNone, 0
	}
	if ok != nil && *ok {
		return answerHeld, backendPID
	}
	return answerNotHeld, backendPID
}

func (a *aliveLock) connectFailed(err error) {
	// The first claim has an answer too: there will be none for now. The heartbeat need
	// not wait for it.
	a.settledOnce()
	if strings.Contains(err.Error(), "unsupported startup parameter") {
		a.report("connect:pooler", slog.LevelError,
			"alive lock cannot connect: the server refused the keepalive startup parameters, so the "+
				"direct DSN most likely points at PgBouncer; point it at PostgreSQL itself",
			"error", err)
		return
	}
	a.report("connect", slog.LevelWarn, "alive lock cannot connect; retrying", "error", err)
}

// report logs once per condition: a repeat of the previous condition goes to debug.
func (a *aliveLock) report(condition string, level slog.Level, msg string, attrs ...any) {
	a.condition.Log(a.log, level, condition, msg, attrs...)
}
