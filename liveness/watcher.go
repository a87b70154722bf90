package liveness

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/logging"
	"github.com/pg-liveness/pg_liveness_exporter/store"
)

// WatcherLeases are the lease names of the fleet's two watchers. Every Agent campaigns
// for both (unless AgentConfig.DisableWatcher), and leads at most one of them at a time,
// so that with two agents or more the two watchers run in different processes: each
// records the other's crash within a tick, where a single watcher's own crash would be
// noticed only by its followers' next try.
var WatcherLeases = [2]string{"pg_liveness.watcher.a", "pg_liveness.watcher.b"}

const (
	// WatchInterval is how often a watcher reads the digest of the alive locks: a crashed
	// instance is stamped at most this long after PostgreSQL freed its lock, and is dead
	// for everyone its lock grace after that. Each tick is one statement that reads
	// pg_locks and, unless a lock appeared or vanished since the previous tick, nothing
	// else, and it writes nothing then.
	WatchInterval = 250 * time.Millisecond
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
	// Events are the Agent's notifications: an instance that joined makes the next tick
	// stamp whatever the digest says (see watch). nil without.
	Events *events

	// The Agent's: the campaigns end when the Agent stops. Zero values are campaigns of
	// their own (tests).
	gate     leadGate
	windDown time.Duration
	every    time.Duration // WatchInterval if zero
}

// watcher records the vanishing of alive locks when it happens: while it leads one of
// the WatcherLeases it reads the digest every WatchInterval, stamps absences when the
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
}

func newWatcher(cfg watcherConfig) *watcher {
	cfg.Logger = logging.Wrap(cfg.Logger)
	if cfg.gate == nil {
		cfg.gate = openGate{}
	}
	if cfg.windDown == 0 {
		cfg.windDown = DefaultJobWindDown
	}
	if cfg.every == 0 {
		cfg.every = WatchInterval
	}
	return &watcher{cfg: cfg, watchSQL: store.WatchAliveLocks.In(cfg.Schema).SQL,
		notifySQL: store.NotifyDeadInstances.In(cfg.Schema).SQL, freshSQL: store.WatchFresh.In(cfg.Schema).SQL}
}

// unwatched reports whether no watcher has ticked within the last second. An
// unanswered question is not a reason to stand in.
func (w *watcher) unwatched(ctx context.Context) bool {
	qctx, cancel := context.WithTimeout(ctx, watchStatementTimeout)
	defer cancel()
	var fresh bool
	if err := w.cfg.Pool.QueryRow(qctx, w.freshSQL).Scan(&fresh); err != nil {
		if ctx.Err() == nil {
			w.cfg.Logger.Debug("watcher: cannot read whether a watcher ticks", "err", err)
		}
		return false
	}
	return !fresh
}

// standInFor is how long the guard ticks in the watchers' place before it asks again
// whether one ticks (its own ticks answer yes meanwhile).
const standInFor = 10 * time.Second

// guard runs while this Agent leads the reaper, one process of the fleet. When both
// watchers die at once nobody notifies their leases free, nor stamps the vanished
// locks, and their followers poll every 30 s: a crash would be dead only then. So every
// tick (WatchInterval), unless this process leads a watcher itself, the guard asks
// whether a watcher ticks; when none does, it ticks in their place for standInFor (or
// until it sees a watcher lease taken): it stamps the vanished locks, the watchers'
// included, and once their grace has passed notifies the deaths and the dead holders'
// leases free, which wakes the fleet's watcher followers. It costs the database one
// trivial statement a tick, for the fleet.
func (w *watcher) guard(ctx context.Context) {
	taken, unsubscribe := w.cfg.Events.subscribe(func(ev event) bool {
		return ev.Kind == eventTaken && slices.Contains(WatcherLeases[:], ev.ID)
	})
	defer unsubscribe()
	t := time.NewTicker(w.cfg.every)
	defer t.Stop()
	var (
		st         watchState
		standUntil time.Time // zero: not standing in
		failing    logging.Repeats
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-taken:
			standUntil = time.Time{}
			continue
		case <-t.C:
		}
		switch {
		case w.slot.Load() == slotLeading:
			standUntil = time.Time{}
			continue
		case standUntil.IsZero() || time.Now().After(standUntil):
			standUntil = time.Time{}
			if !w.unwatched(ctx) {
				continue
			}
			w.cfg.Logger.Info("no watcher ticks; the reaper's leader ticks in their place")
			standUntil, st = time.Now().Add(standInFor), watchState{due: map[uuid.UUID]time.Time{}}
		}
		if err := w.tick(ctx, &st); err != nil && ctx.Err() == nil {
			st.digest = nil
			failing.Log(w.cfg.Logger, slog.LevelWarn, "failed", "stand-in watcher tick failed", "err", err)
		} else {
			failing.Clear(w.cfg.Logger, "stand-in watcher ticks succeed again")
		}
	}
}

// Run campaigns for both watcher leases until ctx ends.
func (w *watcher) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, len(WatcherLeases))
	for i, name := range WatcherLeases {
		wg.Go(func() {
			errs[i] = w.cfg.Leases.elect(ctx, ElectorConfig{
				Lease: name, RetryPeriod: watcherRetryPeriod, QuietPeriod: watcherRetryPeriod, slot: &w.slot,
				OnStartedLeading: func(ctx context.Context, _ Leadership) { w.watch(ctx) },
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
	// A lock that appears and vanishes between two ticks leaves the digest as it was: an
	// instance that crashes within a tick of its start. Its row's insertion is notified,
	// so the tick after it stamps whatever the digest says.
	joined, unsubscribe := w.cfg.Events.subscribeMembers(func(ev event) bool { return ev.Kind == eventJoined })
	defer unsubscribe()
	t := time.NewTicker(w.cfg.every)
	defer t.Stop()
	var failing logging.Repeats
	for {
		select {
		case <-joined:
			st.digest = nil
		default:
		}
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
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// watchState is what one leadership of a watcher remembers between ticks.
type watchState struct {
	digest *string                 // the previous tick's; nil: stamp and read everything
	due    map[uuid.UUID]time.Time // standing absences not yet notified, and when their grace ends
	told   map[uuid.UUID]bool      // standing absences notified
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
	got := time.Now() // after the server's now(), so deadlines counted from it are not early
	full = st.digest == nil || *st.digest != digest
	st.digest = &digest
	if full {
		if st.told == nil {
			st.told = map[uuid.UUID]bool{}
		}
		for id := range st.due {
			if _, ok := standing[id]; !ok {
				delete(st.due, id) // cleared: the instance proved life, or left
			}
		}
		for id := range st.told {
			if _, ok := standing[id]; !ok {
				delete(st.told, id)
			}
		}
		for id, deadIn := range standing {
			if _, ok := st.due[id]; !ok && !st.told[id] {
				st.due[id] = got.Add(time.Duration(deadIn * float64(time.Second)))
			}
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

// notify tells the waiters about the instances of ids that are dead by the verdict. An
// instance still alive has proved life (its absence is cleared at the next stamp), or
// the clocks disagree by a little: it is asked again for a second, then let go.
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
		switch {
		case dead[id]:
			st.told[id] = true
			delete(st.due, id)
			w.notified.Add(1)
		case now.Sub(st.due[id]) > time.Second:
			delete(st.due, id)
		}
	}
	if len(dead) > 0 {
		w.cfg.Logger.Info("instances dead after their lock vanished; notified", "count", len(dead))
	}
	return nil
}
