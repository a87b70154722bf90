package liveness

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// maxLoggedIDs bounds the ids one log line names.
const maxLoggedIDs = 10

// reaperConfig configures a reaper.
type reaperConfig struct {
	Pool                 *pgxpool.Pool
	Leases               *Leases
	Schema               string
	Interval             time.Duration // how often to reap while leading
	LeaseTTL             time.Duration // of the reaper's lease, renewed every LeaseTTL/4
	StaleThreshold       time.Duration // rows older than this go unless their lock is held
	DefinitiveDeadCutoff time.Duration // rows older than this go even with the lock held
	// HistoryRetention: history rows older than this go, historyPruneBatch a round;
	// 7 days if zero.
	HistoryRetention time.Duration
	Logger           *slog.Logger // passwords removed; nil discards

	// The Agent's: its campaign ends when the Agent stops, which waits for it to let go
	// of its lease. Zero values are a campaign of its own (tests).
	gate     leadGate
	windDown time.Duration
	// whileLeading, when set, runs beside the rounds while this process leads, until the
	// leadership ends (the Agent's watcher: its sentry asks every tick meanwhile whether
	// a watcher ticks).
	whileLeading func(ctx context.Context)
}

// historyPruneBatch bounds the history rows one reaper round deletes: a few
// milliseconds of work, and 28 million rows a day at the default interval, far more than
// a fleet writes, so that a backlog (a retention shortened, rows loaded by hand) drains
// in bounded steps.
const historyPruneBatch = 10000

// reaper runs cleanup_stale_instances periodically as a lease-protected singleton, and
// prunes the history.
type reaper struct {
	cfg      reaperConfig
	sql      string
	pruneSQL string
	reaped   atomic.Uint64
	pruned   atomic.Uint64
	// noHistory is set once the schema turned out to predate the history (migration
	// 0020): the rounds stop trying to prune it.
	noHistory atomic.Bool
	ahead     logging.Repeats // rows dated ahead of the server's clock, logged when first seen
}

// newReaper checks the configuration; errors are *ConfigError naming the field.
func newReaper(cfg reaperConfig) (*reaper, error) {
	if cfg.Pool == nil || cfg.Leases == nil {
		return nil, &ConfigError{Field: "reaperConfig.Pool", Reason: "and reaperConfig.Leases must be set"}
	}
	if cfg.Interval <= 0 {
		return nil, &ConfigError{Field: "reaperConfig.Interval", Reason: fmt.Sprintf("(%s) must be positive", cfg.Interval)}
	}
	if cfg.LeaseTTL/4 <= 0 {
		return nil, &ConfigError{Field: "reaperConfig.LeaseTTL", Reason: fmt.Sprintf("(%s) is too short: it is renewed every ttl/4", cfg.LeaseTTL)}
	}
	if cfg.StaleThreshold <= 0 {
		return nil, &ConfigError{Field: "reaperConfig.StaleThreshold", Reason: fmt.Sprintf("(%s) must be positive", cfg.StaleThreshold)}
	}
	if cfg.DefinitiveDeadCutoff <= cfg.StaleThreshold {
		return nil, &ConfigError{Field: "reaperConfig.DefinitiveDeadCutoff", Reason: fmt.Sprintf("(%s) must be above reaperConfig.StaleThreshold (%s)",
			cfg.DefinitiveDeadCutoff, cfg.StaleThreshold)}
	}
	cfg.Logger = logging.Wrap(cfg.Logger)
	if cfg.gate == nil {
		cfg.gate = openGate{}
	}
	cfg.windDown = cmp.Or(cfg.windDown, defaults.JobWindDown)
	cfg.HistoryRetention = cmp.Or(cfg.HistoryRetention, defaults.HistoryRetention)
	if cfg.HistoryRetention < time.Minute {
		return nil, &ConfigError{Field: "reaperConfig.HistoryRetention", Reason: fmt.Sprintf("(%s) must be at least 1m", cfg.HistoryRetention)}
	}
	return &reaper{cfg: cfg, sql: store.Cleanup.In(cfg.Schema).SQL, pruneSQL: store.HistoryPrune.In(cfg.Schema).SQL}, nil
}

// Reaped counts the instances this reaper deleted.
func (r *reaper) Reaped() uint64 { return r.reaped.Load() }

// reaperMaxRetryPeriod bounds how long a follower of the reaper's lease waits between
// tries while its Agent does not listen: a reap Interval is long, a missing reaper should
// not be.
const reaperMaxRetryPeriod = 5 * time.Second

// Run campaigns for the reaper's lease until ctx ends, and reaps every Interval while
// it leads. A dead reaper's lease is notified free by the watcher (or a sentry standing
// in for it), which wakes the followers; they poll at the elector's QuietPeriod besides,
// and every Interval (at most every 5 s) while their Agent does not listen.
func (r *reaper) Run(ctx context.Context) error {
	return r.cfg.Leases.elect(ctx, ElectorConfig{
		Lease:       defaults.ReaperLease,
		TTL:         r.cfg.LeaseTTL,
		RetryPeriod: min(r.cfg.Interval, reaperMaxRetryPeriod),
		OnStartedLeading: func(ctx context.Context, _ *Lease) {
			if r.cfg.whileLeading != nil {
				var beside sync.WaitGroup
				defer beside.Wait()
				beside.Go(func() { r.cfg.whileLeading(ctx) })
			}
			t := time.NewTicker(r.cfg.Interval)
			defer t.Stop()
			var failing logging.Repeats
			for {
				_, err := r.reap(ctx)
				switch {
				case ctx.Err() != nil:
				case err != nil:
					failing.Log(r.cfg.Logger, slog.LevelWarn, "failed", "reaper round failed", "err", err)
				default:
					failing.Clear(r.cfg.Logger, "reaper rounds succeed again")
				}
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		},
	}, r.cfg.windDown, r.cfg.gate)
}

// reap runs cleanup_stale_instances once and counts and logs what it deleted.
func (r *reaper) reap(ctx context.Context) ([]uuid.UUID, error) {
	ctx, cancel := context.WithTimeout(ctx, min(r.cfg.LeaseTTL/2, 30*time.Second))
	defer cancel()
	rows, err := r.cfg.Pool.Query(ctx, r.sql, r.cfg.StaleThreshold.Seconds(), r.cfg.DefinitiveDeadCutoff.Seconds())
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, err
	}
	if len(ids) > 0 {
		r.reaped.Add(uint64(len(ids)))
		// A backlog can be thousands of rows; a log line names a few.
		r.cfg.Logger.Info("reaped stale instances", "count", len(ids), "instance_ids", ids[:min(len(ids), maxLoggedIDs)])
	}
	return ids, r.pruneHistory(ctx)
}

// pruneHistory deletes one batch of the history's rows past the retention. A schema
// that predates the history has none to prune: said once at debug, and not asked again.
func (r *reaper) pruneHistory(ctx context.Context) error {
	if r.noHistory.Load() {
		return nil
	}
	var pruned, ahead int64
	err := r.cfg.Pool.QueryRow(ctx, r.pruneSQL, r.cfg.HistoryRetention.Seconds(), historyPruneBatch).Scan(&pruned, &ahead)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && (pgErr.Code == "42883" || pgErr.Code == "42P01") {
		// undefined_function, undefined_table
		r.noHistory.Store(true)
		r.cfg.Logger.Debug("the schema has no history to prune (it predates migration 0020)")
		return nil
	}
	if err != nil {
		return fmt.Errorf("liveness: prune the history: %w", err)
	}
	r.pruned.Add(uint64(pruned))
	if ahead > 0 {
		r.ahead.Log(r.cfg.Logger, slog.LevelWarn, "ahead", "deleted history rows dated more than a day ahead of the database's clock: "+
			"a clock that jumped back, or rows written by hand", "count", ahead)
	} else {
		r.ahead.Clear(r.cfg.Logger, "no more history rows dated ahead of the database's clock")
	}
	if pruned == historyPruneBatch {
		r.cfg.Logger.Debug("pruned a full batch of history; the next round goes on", "count", pruned)
	}
	return nil
}

// RunOnce runs one round under the lease and returns the deleted ids; none when another
// agent holds the lease.
func (r *reaper) RunOnce(ctx context.Context) ([]uuid.UUID, error) {
	var ids []uuid.UUID
	_, err := r.cfg.Leases.Run(ctx, defaults.ReaperLease, r.cfg.LeaseTTL, func(ctx context.Context, _ *Lease) error {
		var err error
		ids, err = r.reap(ctx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return ids, nil
}
