package liveness

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/notify"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

const (
	// watcherRetryPeriod is how often a watcher's follower tries its lease. Every agent
	// follows, so the fleet's tries grow with its size: they are rare, and the wake-ups
	// do the work: a watcher's crash is noticed by the other watcher, which notifies its
	// leases as free, and a release is notified too.
	watcherRetryPeriod = 30 * time.Second
	// watchStatementTimeout bounds a tick's statements.
	watchStatementTimeout = 2 * time.Second
)

// watcherConfig configures a watcher.
type watcherConfig struct {
	Pool   *pgxpool.Pool
	Leases *Leases
	Schema string
	Logger *slog.Logger // passwords removed; nil discards
	// Events are the Agent's notifications: a watcher lease taken ends a sentry's stand-in,
	// and deaths are published here while the session does not listen. nil without.
	Events *notify.Hub

	// The Agent's: the campaigns end when the Agent stops. Zero values are campaigns of
	// their own (tests).
	gate     leadGate
	windDown time.Duration
	every    time.Duration // defaults.WatchInterval if zero
}

// watcher records the vanishing of alive locks when it happens: while it leads one of
// the defaults.WatcherLeases it reads the digest every defaults.WatchInterval, stamps absences when the
// digest changed, and once an absence's grace has passed notifies dead:<id> (and
// free:<lease> for the leases the dead instance held) when the verdict agrees.
type watcher struct {
	cfg       watcherConfig
	watchSQL  string
	notifySQL string
	freshSQL  string
	slot      campaignSlot // one of the two campaigns at a time
	ticks     atomic.Uint64
	notified  atomic.Uint64
	standIns  atomic.Uint64 // times the sentry began ticking in the watchers' place

	leadsReaper atomic.Bool   // this process leads the reaper: its sentry asks every tick
	reaperLeads chan struct{} // wakes the sentry when it begins to
	fleet       atomic.Int64  // the fleet's size (the watcher's lock count) as last read; 0: unknown
}

func newWatcher(cfg watcherConfig) *watcher {
	cfg.Logger = logging.Wrap(cfg.Logger)
	if cfg.gate == nil {
		cfg.gate = openGate{}
	}
	if cfg.windDown == 0 {
		cfg.windDown = defaults.JobWindDown
	}
	if cfg.every == 0 {
		cfg.every = defaults.WatchInterval
	}
	return &watcher{cfg: cfg, watchSQL: store.WatchAliveLocks.In(cfg.Schema).SQL,
		notifySQL: store.NotifyDeadInstances.In(cfg.Schema).SQL, freshSQL: store.WatchFresh.In(cfg.Schema).SQL,
		reaperLeads: make(chan struct{}, 1)}
}

// Sentry pacing. Every agent's sentry asks how long ago a watcher ticked (watch_fresh);
// together the fleet's sentries ask about once per sentrySpacing, whatever its size: each
// asks once per its count of peers times sentrySpacing, within [sentryMinPeriod,
// sentryMaxPeriod], at a random moment of that period so that they do not ask in step.
// The reaper's leader asks every defaults.WatchInterval.
const (
	sentrySpacing   = 100 * time.Millisecond
	sentryMinPeriod = defaults.WatchInterval
	sentryMaxPeriod = time.Minute
	// sentryUnknownFleet is the fleet size a sentry assumes before it has read one, so
	// that a fleet that starts all at once does not ask at the pace of a small one.
	sentryUnknownFleet = 100
	// watchStaleAfter is the age past which no watcher counts as ticking: two ticks
	// missed. A watcher slowed down by a busy server makes a sentry stand in for a while,
	// which costs a second reader of pg_locks, never a wrong verdict.
	watchStaleAfter = 2 * defaults.WatchInterval
)

// watchAge reads how long ago a watcher ticked and the lock count it saw then. ok is
// false when the question went unanswered: not a reason to stand in. ticked is false
// when no watcher has ticked in this server lifetime.
func (w *watcher) watchAge(ctx context.Context) (age time.Duration, locks int, ticked, ok bool) {
	qctx, cancel := context.WithTimeout(ctx, watchStatementTimeout)
	defer cancel()
	var ageSeconds float64
	var count *int32
	err := w.cfg.Pool.QueryRow(qctx, w.freshSQL).Scan(&ageSeconds, &count)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, 0, false, true
	case err != nil:
		if ctx.Err() == nil {
			w.cfg.Logger.Debug("watcher: cannot read whether a watcher ticks", "err", err)
		}
		return 0, 0, false, false
	}
	if count != nil {
		locks = int(*count)
	}
	return time.Duration(ageSeconds * float64(time.Second)), locks, true, true
}

// sentryPeriod is how long a sentry waits between two questions, given the lock count
// last seen (0: unknown): on average, for the fleet, one question per sentrySpacing.
func sentryPeriod(locks int) time.Duration {
	p := time.Duration(locks) * sentrySpacing
	return min(max(p, sentryMinPeriod), sentryMaxPeriod)
}

// standInFor is how long a sentry ticks in the watchers' place before it asks again
// whether one ticks (its own ticks answer yes meanwhile), unless it sees a watcher lease
// taken first.
const standInFor = 10 * time.Second

// sentry runs for as long as the Agent takes part. When both watchers die at once nobody
// notifies their leases free, nor stamps the vanished locks, and their followers wait
// for notifications: a crash would be dead only at a follower's rare poll. So, unless
// this process leads a watcher itself, the sentry asks now and then how long ago a
// watcher ticked (every defaults.WatchInterval while this process leads the reaper, else at the
// fleet-wide pace of sentryPeriod), and when none did within watchStaleAfter it ticks in
// their place for standInFor (or until it sees a watcher lease taken): it stamps the
// vanished locks, the watchers' included, and once their grace has passed notifies the
// deaths and the dead holders' leases free, which wakes the fleet's followers. It costs
// the database one trivial statement per question; the fleet's questions come about ten
// times a second in all.
func (w *watcher) sentry(ctx context.Context) {
	taken, unsubscribe := w.cfg.Events.Subscribe(func(ev notify.Event) bool {
		return ev.Kind == notify.Taken && slices.Contains(defaults.WatcherLeases[:], ev.ID)
	})
	defer unsubscribe()
	var (
		st         watchState
		standUntil time.Time // zero: not standing in
		locks      int       // the fleet's lock count, as last read
		failing    logging.Repeats
	)
	wait := w.sentryWait(sentryUnknownFleet) // a fleet that starts at once does not ask at once
	for {
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-taken:
			timer.Stop()
			standUntil = time.Time{}
			wait = w.sentryWait(locks)
			continue
		case <-w.reaperLeads:
			timer.Stop()
			wait = w.cfg.every
			continue
		case <-timer.C:
		}
		switch {
		case w.slot.Load() == slotLeading:
			standUntil, wait = time.Time{}, w.sentryWait(locks)
			continue
		case standUntil.IsZero() || time.Now().After(standUntil):
			standUntil = time.Time{}
			age, n, ticked, ok := w.watchAge(ctx)
			if ok && ticked && n > 0 {
				locks = n
				w.fleet.Store(int64(n))
			}
			// Before any watcher has ticked in this server lifetime (a fleet that starts, a
			// server just restarted) nobody is missed: the watchers' campaigns take their
			// leases within a try. Standing in then would have every agent of a starting
			// fleet read pg_locks.
			if !ok || !ticked || age < watchStaleAfter {
				if !ticked {
					locks = max(locks, sentryUnknownFleet)
				}
				wait = w.sentryWait(locks)
				continue
			}
			w.cfg.Logger.Info("no watcher ticks; ticking in their place", "last_tick_ago", age.Round(time.Millisecond))
			w.standIns.Add(1)
			standUntil, st = time.Now().Add(standInFor), watchState{due: map[uuid.UUID]time.Time{}}
		}
		if err := w.tick(ctx, &st); err != nil && ctx.Err() == nil {
			st.digest = nil
			failing.Log(w.cfg.Logger, slog.LevelWarn, "failed", "stand-in watcher tick failed", "err", err)
		} else {
			failing.Clear(w.cfg.Logger, "stand-in watcher ticks succeed again")
		}
		wait = st.nextTick(w.cfg.every)
	}
}

// sentryWait is the pause before a sentry's next question: every defaults.WatchInterval while
// this process leads the reaper, otherwise a random part of twice sentryPeriod (on
// average sentryPeriod, never in step with the others).
func (w *watcher) sentryWait(locks int) time.Duration {
	if w.leadsReaper.Load() {
		return w.cfg.every
	}
	p := sentryPeriod(locks)
	if w.cfg.every < defaults.WatchInterval { // tests run the watcher faster
		p = p * w.cfg.every / defaults.WatchInterval
	}
	return p/2 + rand.N(p)
}

// reaperLeading runs while this process leads the reaper (reaperConfig.whileLeading):
// its sentry asks every tick meanwhile, as the fleet's one fast sentry.
func (w *watcher) reaperLeading(ctx context.Context) {
	w.leadsReaper.Store(true)
	defer w.leadsReaper.Store(false)
	select {
	case w.reaperLeads <- struct{}{}:
	default:
	}
	<-ctx.Done()
}

// Run campaigns for both watcher leases, and keeps the sentry, until ctx ends.
func (w *watcher) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { w.sentry(ctx) })
	errs := make([]error, len(defaults.WatcherLeases))
	for i, name := range defaults.WatcherLeases {
		wg.Go(func() {
			errs[i] = w.cfg.Leases.elect(ctx, ElectorConfig{
				Lease: name, RetryPeriod: watcherRetryPeriod, slot: &w.slot,
				OnStartedLeading: func(ctx context.Context, _ *Lease) { w.watch(ctx) },
			}, w.cfg.windDown, w.cfg.gate)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// watch ticks until ctx ends.
func (w *watcher) watch(ctx context.Context) {
	st := watchState{due: map[uuid.UUID]time.Time{}}
	var failing logging.Repeats
	for {
		started := time.Now()
		err := w.tick(ctx, &st)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			st.digest = nil // read everything again once the database answers
			failing.Log(w.cfg.Logger, slog.LevelWarn, "failed", "watcher tick failed", "err", err)
		default:
			failing.Clear(w.cfg.Logger, "watcher ticks succeed again")
		}
		timer := time.NewTimer(st.nextTick(w.cfg.every) - time.Since(started))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
	}
}

// watchState is what one leadership of a watcher remembers between ticks. Which absences
// were notified is the schema's (each stamp once, whoever notifies it), not the watcher's.
type watchState struct {
	digest *string                 // the previous tick's; nil: stamp and read everything
	due    map[uuid.UUID]time.Time // standing absences not notified yet, and when to notify them
}

// nextTick is how long after a tick the next one comes: every, or sooner when a standing
// absence's grace ends before that, so that its death is notified when it happens rather
// than up to a tick later.
func (st *watchState) nextTick(every time.Duration) time.Duration {
	next := every
	for _, at := range st.due {
		next = min(next, max(time.Until(at), time.Millisecond))
	}
	return next
}

// tick reads the digest, and after a change the standing absences; then it notifies the
// absences whose grace has passed.
func (w *watcher) tick(ctx context.Context, st *watchState) error {
	w.ticks.Add(1)
	qctx, cancel := context.WithTimeout(ctx, watchStatementTimeout)
	defer cancel()
	rows, err := w.cfg.Pool.Query(qctx, w.watchSQL, st.digest)
	if err != nil {
		return err
	}
	var (
		digest   string
		full     bool
		standing = map[uuid.UUID]float64{}
	)
	for rows.Next() {
		var d string
		var id *uuid.UUID
		var deadIn *float64
		if err := rows.Scan(&d, &id, &deadIn); err != nil {
			rows.Close()
			return err
		}
		digest = d
		if id != nil && deadIn != nil {
			standing[*id] = *deadIn
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	got := time.Now()                             // after the server's now(), so deadlines counted from it are not early
	if n, _, ok := strings.Cut(digest, ":"); ok { // the digest starts with the lock count
		if locks, err := strconv.Atoi(n); err == nil && locks > 0 {
			w.fleet.Store(int64(locks))
		}
	}
	full = st.digest == nil || *st.digest != digest
	st.digest = &digest
	if full {
		// The digest covers the locks held, the locks the rows expect and the stamps: what
		// it leaves as it was cannot have changed which absences stand. When it changed,
		// the standing absences not notified yet are exactly those read now.
		clear(st.due)
		for id, deadIn := range standing {
			st.due[id] = got.Add(time.Duration(deadIn * float64(time.Second)))
		}
	}
	var ids []uuid.UUID
	for id, at := range st.due {
		if !got.Before(at) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	return w.notify(qctx, st, ids, got)
}

// notify tells the waiters about the instances of ids that are dead by the verdict (or
// were told already, by another watcher). An instance still alive by the verdict at its
// due time has proved life (its absence is cleared at the next stamp), or the clocks
// disagree: it is asked again a second later, for as long as its absence stands.
func (w *watcher) notify(ctx context.Context, st *watchState, ids []uuid.UUID, now time.Time) error {
	// As text: a pool behind PgBouncer in transaction mode runs in a query mode that
	// sends parameters in text format without asking the server their types, and pgx
	// has no text encoding of a []uuid.UUID of unknown type (the statement casts).
	texts := make([]string, len(ids))
	for i, id := range ids {
		texts[i] = id.String()
	}
	rows, err := w.cfg.Pool.Query(ctx, w.notifySQL, texts)
	if err != nil {
		return err
	}
	dead := map[uuid.UUID]bool{}
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		dead[id] = true
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, id := range ids {
		if dead[id] {
			delete(st.due, id)
			w.notified.Add(1)
		} else {
			st.due[id] = now.Add(time.Second)
		}
	}
	if len(dead) > 0 {
		w.cfg.Logger.Info("instances dead after their lock vanished; notified", "count", len(dead))
		// This process's own followers hear none of it while its session does not listen
		// (it is reconnecting): they are told here, or they would take the dead holders'
		// leases only at their next poll.
		if !w.cfg.Events.Listening() {
			w.cfg.Events.Publish(notify.Event{Kind: notify.DeadHere})
		}
	}
	return nil
}
