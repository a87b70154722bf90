package liveness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/lifegate"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// beatTimeout is a beat's deadline: half the fast interval, at most
// heartbeatMaxStatementTimeout. A beat in flight when the heartbeat stops finishes
// within it, so it is a step of the Agent's shutdown budget.
func beatTimeout(interval time.Duration) time.Duration {
	return min(interval/2, heartbeatMaxStatementTimeout)
}

const (
	// heartbeatMaxStatementTimeout caps a beat's deadline, which is otherwise half the
	// fast interval.
	heartbeatMaxStatementTimeout = 10 * time.Second
	// heartbeatMaxFirstRetry caps the first retry after a failed beat, which is otherwise a
	// quarter of the fast interval.
	heartbeatMaxFirstRetry = 5 * time.Second
	// proofRetry is the retry period of a beat that proves life after the alive lock was
	// lost: observers call the instance dead once its lock grace has run out.
	proofRetry = 250 * time.Millisecond
	// proofMinTimeout is the least deadline of a beat that proves life, which is otherwise
	// a third of the lock grace.
	proofMinTimeout = 100 * time.Millisecond
)

// errBeatPastDeadline is a beat that reached the server after its deadline and wrote
// nothing.
var errBeatPastDeadline = errors.New("liveness: heartbeat: the beat reached the server after its deadline and wrote nothing")

// lockSource tells the heartbeat whether the alive lock is held and verified. An
// alivelock.Lock is one. If the source also has a Changed() <-chan struct{} method, as
// an alivelock.Lock does, losing the lock triggers a beat at once.
type lockSource interface {
	Held() bool
}

// lockHolder tells the backend pid of the session that holds the lock (0 while none
// does), which the heartbeat records: only that session's lock counts for the instance.
// An alivelock.Lock is one; a source that is not records none (NULL: any holder counts).
type lockHolder interface {
	HeldPID() int64
}

type lockNotifier interface {
	Changed() <-chan struct{}
}

// duplicateSource says whether another session holds this instance's lock, so that a
// second process with the same instance id never writes the row. An alivelock.Lock is one.
type duplicateSource interface {
	Duplicate() bool
	Settled() <-chan struct{}
}

// settleWait bounds how long the first beat waits for the lock's first claim: a direct
// DSN that cannot connect must not hold back the heartbeat fallback.
const settleWait = 10 * time.Second

// clock is the worker's time source; tests replace it to drive the cadence.
type clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// heartbeatConfig configures a heartbeatWorker.
type heartbeatConfig struct {
	Pool        *pgxpool.Pool // the service's pool; the worker borrows a connection per beat
	Schema      string        // "liveness" if empty
	InstanceID  uuid.UUID
	ServiceName string
	HostName    string // os.Hostname() if empty
	ProcessID   int    // os.Getpid() if zero

	Mode   Mode   // ModeAdvisoryLockWhenAvailable if empty
	Timing Timing // zero fields take the defaults; recorded in the row

	// Lock is the alive lock, or nil; without one the cadence is always fast.
	Lock lockSource

	Metadata map[string]any // stored in the row's metadata column; must marshal to JSON
	// recovered, when set, is called when a beat gets through after failures: the Agent's
	// lock session then reconnects at once.
	recovered func()
	// Logger receives the worker's lines, passwords removed; nil discards. The worker
	// adds no key of its own: an owner adds what names it (the Agent adds part=heartbeat).
	Logger *slog.Logger

	clock clock // nil is the real clock
}

// validate checks identity, mode and timing (defaults filled) without touching the
// database. Errors are *ConfigError naming the heartbeatConfig field at fault.
func (c heartbeatConfig) validate() error {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: "heartbeatConfig." + field, Reason: fmt.Sprintf(format, args...)}
	}
	if c.InstanceID == uuid.Nil {
		return bad("InstanceID", "must not be the nil UUID")
	}
	if strings.TrimSpace(c.ServiceName) == "" {
		return bad("ServiceName", "must not be empty")
	}
	if c.Mode != "" {
		if _, ok := parseMode(string(c.Mode)); !ok {
			return bad("Mode", "%q is unknown (want %s or %s)", c.Mode, ModeAdvisoryLockWhenAvailable, ModeHeartbeatTableOnly)
		}
	}
	return checkTiming(timingWithDefaults(c.Timing), "heartbeatConfig.Timing")
}

// heartbeatWorker upserts the instance's row on an adaptive cadence: slow while the alive
// lock is held and verified, fast otherwise.
type heartbeatWorker struct {
	pool       *pgxpool.Pool
	upsertSQL  string
	deleteSQL  string
	instanceID string
	service    string
	host       string
	pid        int
	mode       Mode
	metadata   string
	lock       lockSource
	notifier   lockNotifier
	dup        duplicateSource // nil without a lock source that reports duplicates
	clock      clock
	log        *slog.Logger
	recovered  func() // heartbeatConfig.recovered

	fast, slow   time.Duration
	timing       [5]*float64   // what the row records: interval, slow, stale, dead, grace in seconds
	watchdog     time.Duration // the longest wait between the starts of two beats
	stmtTimeout  time.Duration
	proofTimeout time.Duration // a beat's deadline while it proves life (the lock is gone)
	firstRetry   time.Duration
	maxRetryWait time.Duration

	running   atomic.Bool
	mu        sync.Mutex
	stats     heartbeatStats
	lastSent  time.Time // monotonic send time of the last successful beat
	lastHolds bool      // what that beat recorded as holds_alive_lock
	// The server's stamp of that beat, and its round trip (lifeMonitor.fenceDeadline).
	lastStamp     time.Time
	lastRoundTrip time.Duration

	// Owned by the Run goroutine.
	rowHoldsLock bool // what the last successful beat recorded as holds_alive_lock
	// The last reading of the server's clock by a beat, landed or not: when it was sent,
	// the reading and its round trip. Each beat's deadline on the server is timed from it.
	serverClock lifegate.Anchor
}

// newHeartbeatWorker validates cfg and prepares the worker. It does not touch the
// database; Run does.
func newHeartbeatWorker(cfg heartbeatConfig) (*heartbeatWorker, error) {
	if err := cfg.validate(); err != nil {
		return nil, err // a *ConfigError naming the heartbeatConfig field
	}
	if cfg.Pool == nil {
		return nil, &ConfigError{Field: "heartbeatConfig.Pool", Reason: "must not be nil"}
	}
	t := timingWithDefaults(cfg.Timing)
	meta := []byte("{}")
	if len(cfg.Metadata) > 0 {
		var err error
		if meta, err = json.Marshal(cfg.Metadata); err != nil {
			return nil, &ConfigError{Field: "heartbeatConfig.Metadata", Reason: "does not marshal to JSON: " + err.Error()}
		}
	}
	h := &heartbeatWorker{
		pool:         cfg.Pool,
		upsertSQL:    store.Heartbeat.In(cfg.Schema).SQL,
		deleteSQL:    store.HeartbeatDelete.In(cfg.Schema).SQL,
		instanceID:   cfg.InstanceID.String(),
		service:      cfg.ServiceName,
		host:         cfg.HostName,
		pid:          cfg.ProcessID,
		mode:         cfg.Mode,
		metadata:     string(meta),
		lock:         cfg.Lock,
		clock:        cfg.clock,
		log:          logging.Wrap(cfg.Logger),
		recovered:    cfg.recovered,
		fast:         t.HeartbeatInterval,
		slow:         t.HeartbeatSlowInterval,
		watchdog:     t.StaleThreshold - t.HeartbeatInterval,
		stmtTimeout:  beatTimeout(t.HeartbeatInterval),
		proofTimeout: min(beatTimeout(t.HeartbeatInterval), max(t.LockGrace/3, proofMinTimeout)),
		firstRetry:   min(t.HeartbeatInterval/4, heartbeatMaxFirstRetry),
		maxRetryWait: t.HeartbeatInterval / 2,
	}
	secs := func(d time.Duration) *float64 {
		if d <= 0 {
			return nil
		}
		v := d.Seconds()
		return &v
	}
	h.timing = [5]*float64{secs(t.HeartbeatInterval), secs(t.HeartbeatSlowInterval), secs(t.StaleThreshold),
		secs(t.DefinitiveDeadCutoff), secs(t.LockGrace)}
	if h.host == "" {
		h.host, _ = os.Hostname()
	}
	if h.pid == 0 {
		h.pid = os.Getpid()
	}
	if h.mode == "" {
		h.mode = ModeAdvisoryLockWhenAvailable
	}
	// With a lock source, another process's row is never written. The Agent gives one
	// only in ModeAdvisoryLockWhenAvailable; in table-only mode the cadence would ignore
	// it anyway.
	if d, ok := cfg.Lock.(duplicateSource); ok {
		h.dup = d
	}
	if n, ok := cfg.Lock.(lockNotifier); ok {
		h.notifier = n
	}
	if h.mode == ModeHeartbeatTableOnly {
		h.lock = nil // the cadence ignores the lock
	}
	if h.clock == nil {
		h.clock = realClock{}
	}
	h.stats.Interval = h.fast
	return h, nil
}

// Stats returns the worker's counters and cadence. Safe from any goroutine.
func (h *heartbeatWorker) Stats() heartbeatStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stats
}

// Run beats at once and then on the adaptive cadence until ctx is done, when it returns
// nil. Failed beats are logged and retried sooner than a full interval, never returned.
//
// Each beat records whether the alive lock is held. When the lock changes the worker beats
// at once: a claim so that observers can trust the lock from now on, a loss to prove that
// the process lives although its session ended. Such a proof is retried every
// proofRetry until it lands, because observers call the instance dead once its lock
// grace has run out.
func (h *heartbeatWorker) Run(ctx context.Context) error {
	if !h.running.CompareAndSwap(false, true) {
		return errors.New("liveness: heartbeat: Run is already running")
	}
	defer h.running.Store(false)
	if h.mode == ModeAdvisoryLockWhenAvailable && h.lock == nil {
		h.log.Warn("no alive lock source: the heartbeat stays at the fast cadence")
	}
	if h.dup != nil {
		select {
		case <-ctx.Done():
			return nil
		case <-h.dup.Settled():
		case <-time.After(settleWait):
		}
	}
	failures := 0
	var failing, duplicate logging.Repeats
	for ctx.Err() == nil {
		began := h.clock.Now()
		// Take the change channel before reading Held, so that no change is missed.
		var changed <-chan struct{}
		if h.notifier != nil {
			changed = h.notifier.Changed()
		}
		if h.dup != nil && h.dup.Duplicate() {
			duplicate.Log(h.log, slog.LevelError, "duplicate",
				"not writing the instance row: another session holds this instance's alive lock "+
					"(a second process with the same instance id, or this one's previous session not yet ended)")
			h.setDuplicate(true)
			if !h.wait(ctx, h.fast, changed) {
				return nil
			}
			continue
		}
		if duplicate.Clear(h.log, "the alive lock is this process's again: writing the instance row") {
			h.setDuplicate(false)
		}
		holds, lockPID := h.lockState()
		proving := h.rowHoldsLock && !holds
		timeout := h.stmtTimeout
		if proving {
			// The grace is short: an attempt stuck on a connection that a network cut left
			// behind gives way to the next, which takes another connection or dials afresh.
			// The deadline on the server keeps it from landing later.
			timeout = h.proofTimeout
		}
		sent := time.Now() // the row's time is later: the server sets it
		at, inserted, err := h.beat(ctx, holds, lockPID, sent, timeout)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			failures++
			retry := min(h.firstRetry<<min(failures-1, 16), h.maxRetryWait)
			if proving {
				retry = min(retry, proofRetry)
				if errors.Is(err, context.DeadlineExceeded) {
					retry = 0 // the attempt's own deadline was the wait
				}
			}
			h.failed()
			failing.Log(h.log, slog.LevelWarn, "failed", "heartbeat failed; retrying",
				"failures", failures, "retry_in", retry, "error", err)
			if !h.wait(ctx, retry, changed) {
				return nil
			}
			continue
		}
		if failing.Clear(h.log, "heartbeat recovered", "failures", failures) && h.recovered != nil {
			h.recovered()
		}
		failures = 0
		if inserted && h.Stats().Beats > 0 {
			h.log.Warn("instance row was gone: it was removed as dead while this process was not beating " +
				"(hung, paused or cut off); registered it again")
		}
		h.rowHoldsLock = holds
		interval := h.fast
		if holds {
			interval = h.slow
		}
		// The watchdog: whatever the cadence, the next beat starts within stale − fast of
		// this one, so the row never gets closer to stale than one fast interval.
		interval = min(interval, h.watchdog)
		h.succeeded(at, interval, sent, holds)
		if !h.wait(ctx, interval-h.clock.Now().Sub(began), changed) {
			return nil
		}
	}
	return nil
}

// wait returns true when it is time to beat: after d, or at once when changed fires (the
// alive lock was claimed or lost). It returns false when ctx is done.
func (h *heartbeatWorker) wait(ctx context.Context, d time.Duration, changed <-chan struct{}) bool {
	select {
	case <-ctx.Done():
		return false
	case <-h.clock.After(d):
		return true
	case <-changed:
		switch {
		case h.lock == nil:
		case h.lock.Held():
			h.log.Debug("alive lock claimed: beating at once")
		default:
			h.log.Info("alive lock lost: beating at once to prove life")
		}
		return true
	}
}

// beat upserts the row; it gives up after timeout from sent. It is not cut short when
// Run's context ends: a cancelled statement can still commit on the server after Run has
// returned, and an upsert landing after Remove's DELETE would bring the row back.
//
// The statement carries its deadline by the server's clock, so that a beat given up on
// never lands later than the next one is sent: the server's clock at the moment this
// process gives up is at least the last reading plus the time since it was sent, less its
// round trip (less a drift of 1 ms a second between the two clocks). Before the first
// reading there is no deadline.
func (h *heartbeatWorker) beat(ctx context.Context, holdsLock bool, lockPID *int64, sent time.Time, timeout time.Duration) (at time.Time, inserted bool, err error) {
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), sent.Add(timeout))
	defer cancel()
	var deadline *time.Time
	if c := h.serverClock; !c.Sent.IsZero() {
		since := sent.Sub(c.Sent)
		d := c.Server.Add(since + timeout - c.RoundTrip - since/1000)
		deadline = &d
	}
	t := h.timing
	var landed *time.Time
	var server time.Time
	err = h.pool.QueryRow(ctx, h.upsertSQL, h.instanceID, h.service, h.host, h.pid, string(h.mode),
		h.metadata, holdsLock, t[0], t[1], t[2], t[3], t[4], lockPID, deadline).Scan(&landed, &inserted, &server)
	if err != nil {
		return time.Time{}, false, err
	}
	h.serverClock = lifegate.Anchor{Sent: sent, Server: server, RoundTrip: time.Since(sent)}
	if landed == nil {
		return time.Time{}, false, errBeatPastDeadline
	}
	return *landed, inserted, nil
}

// lockState is whether the lock is held and, when the source tells, by which backend
// (0 while not held; nil when the source does not tell). One reading: the pid is that of
// the session that holds the lock when holds is true.
func (h *heartbeatWorker) lockState() (holds bool, lockPID *int64) {
	if h.lock == nil {
		return false, nil
	}
	if src, ok := h.lock.(lockHolder); ok {
		pid := src.HeldPID()
		return pid != 0, &pid
	}
	return h.lock.Held(), nil
}

func (h *heartbeatWorker) setDuplicate(v bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stats.Duplicate = v
}

func (h *heartbeatWorker) succeeded(at time.Time, interval time.Duration, sent time.Time, holds bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stats.Beats++
	h.stats.LastBeat = at
	h.stats.Interval = interval
	h.lastSent, h.lastHolds = sent, holds
	h.lastStamp, h.lastRoundTrip = at, time.Since(sent)
}

// lastAnchor is the last successful beat as a statement that returned the server's
// clock: when it was sent, its stamp and its round trip (zero before the first).
func (h *heartbeatWorker) lastAnchor() lifegate.Anchor {
	h.mu.Lock()
	defer h.mu.Unlock()
	return lifegate.Anchor{Sent: h.lastSent, Server: h.lastStamp, RoundTrip: h.lastRoundTrip}
}

// lastProof returns when the last successful beat was sent, by this host's monotonic
// clock (zero before the first), and whether it recorded the alive lock as held.
func (h *heartbeatWorker) lastProof() (sent time.Time, holdsLock bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lastSent, h.lastHolds
}

// failed counts a failed beat.
func (h *heartbeatWorker) failed() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stats.Failures++
}

// Remove deletes this instance's row, so that other instances see it gone at once. Call
// it on graceful shutdown, after Run has returned; ctx bounds it (the Agent gives it
// AgentConfig.ShutdownTimeout).
func (h *heartbeatWorker) Remove(ctx context.Context) error {
	if _, err := h.pool.Exec(ctx, h.deleteSQL, h.instanceID); err != nil {
		return fmt.Errorf("liveness: heartbeat: remove instance row: %w", logging.RedactError(err))
	}
	return nil
}
