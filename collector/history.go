package collector

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// HistoryConfig configures the history collector: the failover times of the schema's
// history (migration 0020) as histograms, and the leases nobody leads now.
type HistoryConfig struct {
	Enabled bool
	// LeaderlessObjective is how long a lease may go without a leader before
	// pg_liveness_lease_leaderless_objective_seconds says it is late (the alert
	// PgLivenessLeaseLeaderless compares the two), for a lease Objectives does not name.
	LeaderlessObjective time.Duration
	// Objectives are per-lease objectives, "NAME=DURATION", overriding
	// LeaderlessObjective for that lease; a name given twice keeps the last.
	Objectives []string

	objectives map[string]time.Duration // parsed by check
}

func (s *HistoryConfig) enabled() *bool { return &s.Enabled }

// defaultLeaderlessObjective: a crashed leader's lease moves within a few seconds at the
// library's defaults (docs/failover.md has the measured times), an expired one within its
// TTL; a minute without a leader is an incident, not a takeover in progress.
const defaultLeaderlessObjective = time.Minute

func (s *HistoryConfig) defaults() { s.LeaderlessObjective = defaultLeaderlessObjective }

func (s *HistoryConfig) check(*Config) error {
	if s.LeaderlessObjective <= 0 {
		return fmt.Errorf("Config.History.LeaderlessObjective must be positive, got %s", s.LeaderlessObjective)
	}
	s.objectives = map[string]time.Duration{}
	for _, o := range s.Objectives {
		name, d, ok := strings.Cut(o, "=")
		if i := strings.LastIndexByte(o, '='); ok && i >= 0 {
			name, d = o[:i], o[i+1:] // a lease name may hold '='; a duration never does
		}
		v, err := time.ParseDuration(d)
		switch {
		case !ok || name == "":
			return fmt.Errorf("Config.History.Objectives: %q is not NAME=DURATION", o)
		case err != nil:
			return fmt.Errorf("Config.History.Objectives: %q: %w", o, err)
		case v <= 0:
			return fmt.Errorf("Config.History.Objectives: %q: the objective must be positive", o)
		}
		s.objectives[name] = v
	}
	return nil
}

// objective is lease's objective.
func (s *HistoryConfig) objective(lease string) time.Duration {
	if d, ok := s.objectives[lease]; ok {
		return d
	}
	return s.LeaderlessObjective
}

// The history's kinds (migration 0020), each counted in pg_liveness_history_events_total.
var historyKinds = []string{"acquired", "ended", "joined", "left", "reaped", "lock_vanished", "lock_back", "dead"}

// Buckets of the failover histograms (classic; a scraper that asks for protobuf gets
// native ones too): a takeover at the defaults is about a second, an expiry's the ttl,
// an incident minutes.
var (
	failoverBuckets   = []float64{0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 10, 30, 60, 300, 900, 3600}
	leadershipBuckets = []float64{1, 10, 60, 300, 900, 3600, 14400, 86400, 604800}
)

const (
	// historyBatch rows are read per statement, and at most historyBatches statements a
	// scrape: a backlog (the exporter down for a while during a storm of moves) is worked
	// off over a few scrapes, never in one unbounded one.
	historyBatch   = 10000
	historyBatches = 5
)

// historyCollector reads the history rows written since its previous scrape and
// observes their failover times, by lease and by service: every value is the difference
// of two of the database's timestamps, so that every observer reports the same. It
// counts from its first scrape on, as any counter does. Its lease labels are capped at
// --collector.leases.max-series and its service labels at
// --collector.instances.max-services, first come first kept; the rest are "other".
type historyCollector struct {
	pool                         *pgxpool.Pool
	cfg                          *HistoryConfig
	maxLeases, maxServices       int
	sinceSQL, lastIDSQL, lessSQL string
	logger                       *slog.Logger

	leaderless, takeover, leadership, detection *exposition.Family
	leaderlessFor, objective, events            *exposition.Family

	mu         sync.Mutex // one scrape at a time reads and observes, so that none is counted twice
	started    bool       // the cursor was read
	cursor     int64      // the last row observed
	leases     map[string]bool
	services   map[string]bool
	hists      map[histogramKey]prometheus.Histogram
	eventCount map[string]uint64
	oldSchema  logging.Repeats // a schema without the history, said once
	skipped    logging.Repeats // rows whose times cannot be a duration
}

// histogramKey is one histogram series: its family and label values.
type histogramKey struct {
	f    *exposition.Family
	a, b string
}

func newHistoryCollector(d deps) (collector, error) {
	schema := d.cfg.Source.Schema()
	return &historyCollector{
		pool: d.pool, cfg: &d.cfg.History, maxLeases: d.cfg.Leases.MaxSeries, maxServices: d.cfg.Instances.MaxServices,
		sinceSQL:  store.HistorySince.In(schema).SQL,
		lastIDSQL: store.HistoryLastID.In(schema).SQL,
		lessSQL:   store.LeaseLeaderless.In(schema).SQL,
		logger:    d.logger,
		leaderless: histogram("lease_leaderless_seconds",
			"Time the lease had no leader, by the database's clock: from the end of a leadership (after: released, expired, or holder_dead from the holder's last sign of life) to the next acquisition; observed at that acquisition.",
			"lease", "after"),
		takeover: histogram("lease_takeover_seconds",
			"From the moment a dead holder became dead by the verdict's rule to the next acquisition of its lease: the fleet's reaction. A leaderless time after holder_dead is the holder's detection plus this.",
			"lease"),
		leadership: histogram("lease_leadership_seconds",
			"How long a leadership lasted, by how it ended: released, stepped_down (let go after its holder lost it), expired, holder_dead.",
			"lease", "ended"),
		detection: histogram("instance_death_detection_seconds",
			"From an instance's last sign of life (its alive lock's vanishing as stamped, or its last heartbeat) to its death by the verdict's rule, by how it died: lock_lost, heartbeat_stale, zombie.",
			"service", "how"),
		leaderlessFor: gauge("lease_leaderless_for_seconds",
			"Seconds since a lease that nobody leads now was last led: its row expired (after=expired) or its holder is dead by the verdict (after=holder_dead). Absent while it is led, and once let go.",
			"lease", "after"),
		objective: gauge("lease_leaderless_objective_seconds",
			"The lease's leaderless objective (--collector.history.leaderless-objective, or its --collector.history.lease-objective), beside each pg_liveness_lease_leaderless_for_seconds.",
			"lease"),
		events: counter("history_events_total",
			"Rows of the schema's history this exporter has read since it started, by kind.", "kind"),
		leases: map[string]bool{}, services: map[string]bool{},
		hists: map[histogramKey]prometheus.Histogram{}, eventCount: map[string]uint64{},
	}, nil
}

func histogram(name, help string, labels ...string) *exposition.Family {
	return exposition.NewFamily(namespace+"_"+name, help, exposition.Histogram, labels...)
}

func (c *historyCollector) Update(ctx context.Context, out *exposition.Builder) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.read(ctx)
	if undefined(err) {
		c.oldSchema.Log(c.logger, slog.LevelInfo, "old", "the schema has no history yet (it predates migration 0020): "+
			"no failover histograms until it is migrated")
		return nil
	}
	if err != nil {
		return err
	}
	c.oldSchema.Clear(c.logger, "the schema has a history: failover histograms from now on")
	if err := c.leaderlessNow(ctx, out); err != nil {
		return err
	}
	keys := make([]histogramKey, 0, len(c.hists))
	for k := range c.hists {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(x, y histogramKey) int {
		return cmp.Or(strings.Compare(x.f.Name(), y.f.Name()), strings.Compare(x.a, y.a), strings.Compare(x.b, y.b))
	})
	for _, k := range keys {
		var m dto.Metric
		if err := c.hists[k].Write(&m); err != nil {
			return err
		}
		if k.f == c.takeover {
			out.AddHistogram(k.f, m.Histogram, k.a)
		} else {
			out.AddHistogram(k.f, m.Histogram, k.a, k.b)
		}
	}
	for _, k := range historyKinds {
		out.Add(c.events, float64(c.eventCount[k]), k)
	}
	return nil
}

// undefined reports whether err says the schema lacks the history's table or functions.
func undefined(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42883")
}

// read observes the rows written since the previous scrape, a bounded number of them.
func (c *historyCollector) read(ctx context.Context) error {
	if !c.started {
		if err := c.pool.QueryRow(ctx, c.lastIDSQL).Scan(&c.cursor); err != nil {
			return err
		}
		c.started = true
	}
	for range historyBatches {
		rows, err := c.pool.Query(ctx, c.sinceSQL, c.cursor, historyBatch)
		if err != nil {
			return err
		}
		batch, err := pgx.CollectRows(rows, pgx.RowToStructByName[store.HistoryRow])
		if err != nil {
			return err
		}
		for i := range batch {
			c.observe(&batch[i])
			c.cursor = batch[i].ID
		}
		if len(batch) < historyBatch {
			return nil
		}
	}
	return nil
}

// observe counts one row and observes the durations it records. A duration that comes
// out negative (a clock that jumped back, a row written by hand) is no failover time: it
// is skipped and said.
func (c *historyCollector) observe(r *store.HistoryRow) {
	if !slices.Contains(historyKinds, r.Kind) {
		return
	}
	c.eventCount[r.Kind]++
	since := func(t time.Time, from pgtype.Timestamptz) (float64, bool) {
		if !from.Valid || from.InfinityModifier != pgtype.Finite { // the schema refuses infinities; a copy may not
			return 0, false
		}
		d := t.Sub(from.Time).Seconds()
		if d < 0 {
			c.skipped.Log(c.logger, slog.LevelWarn, "negative", "a history row's times run backwards (a clock that jumped back, "+
				"or a row written by hand); its duration is not observed", "id", r.ID, "kind", r.Kind, "at", r.At, "from", from.Time)
			return 0, false
		}
		return d, true
	}
	switch r.Kind {
	case "acquired":
		if r.LeaseName == "" { // written by hand: the schema's rows always name their lease
			return
		}
		if d, ok := since(r.At, r.Since); ok && r.How != "free" {
			c.observeIn(c.leaderless, c.leaseLabel(r.LeaseName), r.How, d)
		}
		if d, ok := since(r.At, r.DeadAt); ok && r.How == "holder_dead" {
			c.observeIn(c.takeover, c.leaseLabel(r.LeaseName), "", d)
		}
	case "ended":
		if r.LeaseName == "" {
			return
		}
		if d, ok := since(r.At, r.Since); ok {
			c.observeIn(c.leadership, c.leaseLabel(r.LeaseName), r.How, d)
		}
	case "dead":
		if d, ok := since(r.At, r.Since); ok {
			c.observeIn(c.detection, c.serviceLabel(r.Service), r.How, d)
		}
	}
}

func (c *historyCollector) observeIn(f *exposition.Family, a, b string, v float64) {
	a, _ = labelValue(a)
	b, _ = labelValue(b)
	k := histogramKey{f, a, b}
	h, ok := c.hists[k]
	if !ok {
		buckets := failoverBuckets
		if f == c.leadership {
			buckets = leadershipBuckets
		}
		h = prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: f.Name(), Help: f.Name(), Buckets: buckets,
			// Native buckets 10 % wide, at most 160 of them: a takeover's second and an
			// incident's hour in one histogram.
			NativeHistogramBucketFactor:    1.1,
			NativeHistogramMaxBucketNumber: 160,
		})
		c.hists[k] = h
	}
	h.Observe(v)
}

// leaseLabel is name, or "other" once maxLeases leases have their own series.
func (c *historyCollector) leaseLabel(name string) string {
	return capped(c.leases, name, c.maxLeases)
}

func (c *historyCollector) serviceLabel(name string) string {
	return capped(c.services, name, c.maxServices)
}

func capped(seen map[string]bool, name string, most int) string {
	if seen[name] {
		return name
	}
	if len(seen) >= most {
		return otherLease
	}
	seen[name] = true
	return name
}

// leaderlessNow exports the leases nobody leads now, the longest leaderless first; past
// the lease cap the rest are one series, lease="other", the longest of them.
func (c *historyCollector) leaderlessNow(ctx context.Context, out *exposition.Builder) error {
	rows, err := c.pool.Query(ctx, c.lessSQL)
	if err != nil {
		return err
	}
	less, err := pgx.CollectRows(rows, pgx.RowToStructByName[store.LeaderlessRow])
	if err != nil {
		return err
	}
	slices.SortFunc(less, func(x, y store.LeaderlessRow) int {
		return cmp.Or(cmp.Compare(y.LeaderlessFor, x.LeaderlessFor), strings.Compare(x.Name, y.Name))
	})
	folded := map[string]float64{} // after -> the longest folded
	seen := map[string]bool{}      // label values: two names with invalid bytes can make one
	for i, l := range less {
		if i >= c.maxLeases {
			folded[l.After] = max(folded[l.After], l.LeaderlessFor)
			continue
		}
		name, _ := labelValue(l.Name)
		if seen[name] {
			continue
		}
		seen[name] = true
		out.Add(c.leaderlessFor, l.LeaderlessFor, name, l.After)
		out.Add(c.objective, c.cfg.objective(l.Name).Seconds(), name)
	}
	for _, after := range []string{"expired", "holder_dead"} {
		if v, ok := folded[after]; ok {
			out.Add(c.leaderlessFor, v, otherLease, after)
		}
	}
	if len(folded) > 0 {
		out.Add(c.objective, c.cfg.LeaderlessObjective.Seconds(), otherLease)
	}
	return nil
}
