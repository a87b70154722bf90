package collector

import (
	"cmp"
	"context"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// InstancesConfig configures the instances collector.
type InstancesConfig struct {
	Enabled bool
	// MaxSeries caps pg_liveness_instance_heartbeat_age_seconds; the oldest heartbeats
	// are kept. 0 exports none.
	MaxSeries int
	// MaxServices caps the services exported one by one, those with dead instances first,
	// then the largest; the rest are summed into service="other". 0 folds every service.
	MaxServices int
}

func (s *InstancesConfig) enabled() *bool { return &s.Enabled }

// Defaults of InstancesConfig.
const (
	defaultMaxSeries   = 500
	defaultMaxServices = 500
)

func (s *InstancesConfig) defaults() {
	s.MaxSeries, s.MaxServices = defaultMaxSeries, defaultMaxServices
}

func (s *InstancesConfig) limits() []limit {
	return []limit{{"Config.Instances.MaxSeries", &s.MaxSeries, 0}, {"Config.Instances.MaxServices", &s.MaxServices, 0}}
}

func (s *InstancesConfig) check(*Config) error {
	for _, l := range s.limits() {
		if err := l.check(); err != nil {
			return err
		}
	}
	return nil
}

// Instance states, as the migrations' instance_state_verdicts defines them (the one definition):
// alive (lock held, fresh heartbeat), lock_only (lock held, stale heartbeat), lock_lost
// (lock vanished moments ago, proving life within its grace), heartbeat_only (no lock,
// fresh heartbeat), stale (dead: stale heartbeat, or the lock vanished with no proof of
// life within the grace), zombie (dead: lock held, heartbeat past the definitive-dead
// cutoff).
var instanceStates = store.InstanceStates()

// instancesCollector sends the instances statement (internal/store/sql/collectors.sql) for the
// source: one summary row per service and the oldest heartbeats; with Config.Locks, its
// variant that judges the server's shared read of the locks (store.InstancesOfLocks).
type instancesCollector struct {
	pool               *pgxpool.Pool
	query              store.Query
	maxSeries          int
	maxServices        int
	countDesc, ageDesc *exposition.Family
	oldestDesc         *exposition.Family
	recoveryDesc       *exposition.Family
	foldedDesc         *exposition.Family
	keySharedDesc      *exposition.Family // a Whizbang source only
	log                *slog.Logger
	standby            logging.Repeats // logged when the database becomes a standby, and stops being one

	// With Config.Locks: the verdict of the server's snapshot of locks, unless the schema
	// predates it (migration 0008), which is logged once and checked again after
	// ofLocksRecheck.
	serverLocks LocksSource
	ofLocks     store.Query
	ofLocksMu   sync.Mutex
	noOfLocks   time.Time // when the schema was last found without it; zero: not found so
}

// ofLocksRecheck is how long a schema found older than migration 0008 keeps its own read
// of pg_locks before the verdict of given locks is tried again (a migration applied since).
const ofLocksRecheck = 10 * time.Minute

func newInstancesCollector(d deps) (collector, error) {
	cfg := d.cfg
	c := &instancesCollector{
		log:         d.logger,
		pool:        d.pool,
		query:       store.Instances.For(cfg.Source),
		maxSeries:   cfg.Instances.MaxSeries,
		maxServices: cfg.Instances.MaxServices,
		serverLocks: cfg.Locks,
		ofLocks:     store.InstancesOfLocks(cfg.Source),
		foldedDesc: gauge("instance_services_folded",
			`Services beyond --collector.instances.max-services whose instances are counted under the service label other.`),
		countDesc: gauge("instances",
			"Instances by service and liveness state: alive (lock held, fresh heartbeat), lock_only (lock held, stale heartbeat), "+
				"lock_lost (lock vanished, proving life within its grace), heartbeat_only (no lock, fresh heartbeat), "+
				"stale (dead: stale heartbeat, or lock vanished without proof of life), zombie (dead: lock held, heartbeat past the definitive-dead cutoff).",
			"service", "state"),
		recoveryDesc: gauge("database_in_recovery",
			"1 when the database is a hot standby: its pg_locks does not show the primary's alive locks, so instance states "+
				"rest on heartbeats alone. Point observers at the primary."),
		ageDesc: gauge("instance_heartbeat_age_seconds",
			"Age of an instance's last heartbeat by the database clock; only the oldest --collector.instances.max-series instances are exported.",
			"service", "instance_id"),
		oldestDesc: gauge("instance_oldest_heartbeat_age_seconds",
			"Age of the oldest heartbeat of a service's instances, by the database clock.",
			"service"),
	}
	if cfg.Source.Kind() == store.SourceWhizbang {
		c.keySharedDesc = gauge("instances_sharing_lock_key",
			"Instances whose 32-bit Whizbang alive-lock key is held and is another instance's key too: the lock cannot say "+
				"which of them holds it, so they are judged by their heartbeats alone.")
	}
	return c, nil
}

// serviceRow is one service's state counts (in instanceStates order) and oldest age.
type serviceRow struct {
	name   string
	counts [6]float64
	oldest float64
}

func (r serviceRow) dead() float64 { return r.counts[4] + r.counts[5] } // stale + zombie
func (r serviceRow) total() (n float64) {
	for _, c := range r.counts {
		n += c
	}
	return n
}

func (c *instancesCollector) Update(ctx context.Context, out *exposition.Builder) error {
	if c.useOfLocks() {
		if part, err := c.serverLocks(ctx); err == nil {
			classids, objids, pids := part.exclusiveGranted()
			err := c.update(ctx, out, c.ofLocks, c.ofLocks.Args(c.maxSeries, classids, objids, pids))
			if !isUndefinedFunction(err) { // a parse error: nothing was added to out
				return err
			}
			c.ofLocksMissing()
		}
	}
	return c.update(ctx, out, c.query, c.query.Args(c.maxSeries))
}

func (c *instancesCollector) useOfLocks() bool {
	if c.serverLocks == nil {
		return false
	}
	c.ofLocksMu.Lock()
	defer c.ofLocksMu.Unlock()
	return c.noOfLocks.IsZero() || time.Since(c.noOfLocks) >= ofLocksRecheck
}

func (c *instancesCollector) ofLocksMissing() {
	c.ofLocksMu.Lock()
	first := c.noOfLocks.IsZero()
	c.noOfLocks = time.Now()
	c.ofLocksMu.Unlock()
	if first {
		c.log.Info("the schema predates migration 0012 (instance_state_verdicts_of_locks with the holders' pids): this database's verdict reads "+
			"pg_locks itself, not the server's locks read once per scrape; apply the migrations to share the read",
			"recheck", ofLocksRecheck.String())
	}
}

// update sends query and adds the instance metrics it reads.
func (c *instancesCollector) update(ctx context.Context, out *exposition.Builder, query store.Query, args []any) error {
	rows, err := c.pool.Query(ctx, query.SQL, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	var services []serviceRow
	var sc rowScanner[store.InstancesRow]
	for rows.Next() {
		r, err := sc.scan(rows)
		if err != nil {
			return err
		}
		switch {
		case r.InRecovery.Valid: // the first row: the server's state
			c.reportRecovery(r.InRecovery.Bool)
			out.Add(c.recoveryDesc, boolFloat(r.InRecovery.Bool))
			if c.keySharedDesc != nil {
				out.Add(c.keySharedDesc, float64(r.KeyShared.Int64)) // NULL (no service) is 0
			}
		case r.InstanceID.Valid:
			// A service name from a SQL_ASCII database may hold any bytes: one such row
			// must not cost the others their metrics.
			svc, _ := labelValue(r.ServiceName.String)
			out.Add(c.ageDesc, r.Age.Float64, svc, r.InstanceID.String)
		default:
			s := serviceRow{oldest: r.Age.Float64}
			s.name, _ = labelValue(r.ServiceName.String)
			for i, n := range [...]pgtype.Int8{r.Alive, r.LockOnly, r.LockLost, r.HeartbeatOnly, r.Stale, r.Zombie} {
				s.counts[i] = float64(n.Int64)
			}
			services = append(services, s)
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	kept, other, folded := foldServices(services, c.maxServices)
	for _, r := range kept {
		c.emitService(out, r)
	}
	if folded > 0 || other.total() > 0 { // folded services, or a real service named "other"
		c.emitService(out, other)
	}
	out.Add(c.foldedDesc, float64(folded))
	return nil
}

func (c *instancesCollector) emitService(out *exposition.Builder, r serviceRow) {
	for i, state := range instanceStates {
		out.Add(c.countDesc, r.counts[i], r.name, state)
	}
	out.Add(c.oldestDesc, r.oldest, r.name)
}

// foldServices keeps at most max services, those with dead instances first, then the
// largest, then by name; the rest are summed into service="other" (the oldest age is the
// largest of theirs). Sanitised names can collide, and a real service may be called
// "other": rows with the same name are merged the same way.
func foldServices(rows []serviceRow, max int) (kept []serviceRow, other serviceRow, folded int) {
	slices.SortFunc(rows, func(a, b serviceRow) int {
		return cmp.Or(cmp.Compare(b.dead(), a.dead()), cmp.Compare(b.total(), a.total()), cmp.Compare(a.name, b.name))
	})
	other.name = "other"
	merge := func(into *serviceRow, r serviceRow) {
		for i := range r.counts {
			into.counts[i] += r.counts[i]
		}
		into.oldest = math.Max(into.oldest, r.oldest)
	}
	byName := map[string]int{}
	for _, r := range rows {
		if i, ok := byName[r.name]; ok {
			merge(&kept[i], r)
			continue
		}
		if len(kept) < max && r.name != "other" {
			byName[r.name] = len(kept)
			kept = append(kept, r)
			continue
		}
		if r.name != "other" {
			folded++
		}
		merge(&other, r)
	}
	return kept, other, folded
}

// reportRecovery logs when the database becomes a standby, and when it stops being one.
func (c *instancesCollector) reportRecovery(inRecovery bool) {
	if inRecovery {
		c.standby.Log(c.log, slog.LevelWarn, "standby", "the database is a hot standby: its pg_locks does not show the primary's alive locks, so instance "+
			"states rest on heartbeats alone and lock holders are not seen; point the exporter at the primary")
		return
	}
	c.standby.Clear(c.log, "the database is no longer a standby: instance states use the alive locks again")
}
