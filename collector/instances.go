package collector

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
	"github.com/pg-liveness/pg_liveness_exporter/internal/sqltag"
	"github.com/pg-liveness/pg_liveness_exporter/logging"
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

func (s *InstancesConfig) flags(app *kingpin.Application) {
	app.Flag("collector.instances.max-series",
		"Most pg_liveness_instance_heartbeat_age_seconds series to export; the oldest heartbeats are kept.").
		Default(strconv.Itoa(s.MaxSeries)).IntVar(&s.MaxSeries)
	app.Flag("collector.instances.max-services",
		`Most services whose instance counts are exported one by one, those with dead instances first; the rest are summed into service="other".`).
		Default(strconv.Itoa(s.MaxServices)).IntVar(&s.MaxServices)
}

func (s *InstancesConfig) check(c *Config) error {
	// A Whizbang source brings its own timing, checked with the source.
	whizbang := c.Source.Kind == SourceWhizbang
	if !whizbang && c.StaleThreshold <= 0 {
		return fmt.Errorf("--agent.stale-threshold must be positive, got %s", c.StaleThreshold)
	}
	if !whizbang && c.DefinitiveDeadCutoff <= c.StaleThreshold {
		return fmt.Errorf("--agent.definitive-dead-cutoff (%s) must be above --agent.stale-threshold (%s)",
			c.DefinitiveDeadCutoff, c.StaleThreshold)
	}
	if s.MaxSeries < 0 {
		return fmt.Errorf("--collector.instances.max-series must be 0 or more, got %d", s.MaxSeries)
	}
	if s.MaxServices < 0 {
		return fmt.Errorf("--collector.instances.max-services must be 0 or more, got %d", s.MaxServices)
	}
	return nil
}

// Instance states, as the migrations' instance_state_verdicts defines them (the one definition):
// alive (lock held, fresh heartbeat), lock_only (lock held, stale heartbeat), lock_lost
// (lock vanished moments ago, proving life within its grace), heartbeat_only (no lock,
// fresh heartbeat), stale (dead: stale heartbeat, or the lock vanished with no proof of
// life within the grace), zombie (dead: lock held, heartbeat past the definitive-dead
// cutoff).
var instanceStates = []string{"alive", "lock_only", "lock_lost", "heartbeat_only", "stale", "zombie"}

// instancesSQL returns one summary row per service (state counts and the oldest
// heartbeat, by the one definition of states) followed by the max-series instances with
// the oldest heartbeats, so that 10,000 instances never leave the server. The first row
// says whether the server is a standby, where the verdict rests on heartbeats alone. The
// verdict is plain SQL that the planner inlines here, so the counting is one pass over
// the instances and the granted locks (each row's state evaluated once, below the OFFSET
// 0 fence); the oldest heartbeats come off the last_heartbeat_at index.
//
// {verdicts} is instance_state_verdicts for our schema, or a Whizbang source's subquery
// (the same rule, expanded). Vanished locks are then stamped ({stamp}, our schema only)
// from the instances the verdict called lock_lost: an unstamped absence counts as just
// seen, so the states are those of stamping first; with none, and no stamp standing, the
// stamping reads nothing more. {key_shared} counts instances whose alive-lock key
// another shares (a Whizbang source's 32-bit keys; false for ours).
//
// $1 stale threshold and $2 definitive-dead cutoff (intervals), for rows that carry no
// timing of their own; $3 max series; $4 a Whizbang source's lock key prefix.
const instancesSQL = `WITH ` + sqltag.Instances + ` services AS MATERIALIZED (
    SELECT s.service_name,
           count(*) FILTER (WHERE s.state = 'alive') AS alive,
           count(*) FILTER (WHERE s.state = 'lock_only') AS lock_only,
           count(*) FILTER (WHERE s.state = 'lock_lost') AS lock_lost,
           count(*) FILTER (WHERE s.state = 'heartbeat_only') AS heartbeat_only,
           count(*) FILTER (WHERE s.state = 'stale') AS stale,
           count(*) FILTER (WHERE s.state = 'zombie') AS zombie,
           count(*) FILTER (WHERE s.key_shared) AS key_shared,
           min(s.last_heartbeat_at) AS oldest,
           array_agg(s.instance_id) FILTER (WHERE s.state = 'lock_lost') AS lost
      FROM (SELECT v.instance_id, v.service_name, v.state, v.last_heartbeat_at, {key_shared} AS key_shared
              FROM {verdicts} v
            OFFSET 0) s -- so that each row's state is evaluated once, not once per count
     GROUP BY s.service_name)
SELECT NULL::text, NULL::text, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
       NULL::float8, pg_catalog.pg_is_in_recovery(), (SELECT sum(v.key_shared) FROM services v)::bigint
  FROM (SELECT {stamp}) stamp
UNION ALL
SELECT v.service_name, NULL::text, v.alive, v.lock_only, v.lock_lost, v.heartbeat_only, v.stale, v.zombie,
       extract(epoch FROM now() - v.oldest)::float8, NULL, NULL
  FROM services v
UNION ALL
(SELECT i.service_name, i.instance_id::text, NULL, NULL, NULL, NULL, NULL, NULL,
        extract(epoch FROM now() - i.last_heartbeat_at)::float8, NULL, NULL
   FROM {instances} i
  ORDER BY i.last_heartbeat_at, i.instance_id
  LIMIT $3)`

// instancesStatement renders instancesSQL for the source and returns it with its
// arguments after the max series.
func instancesStatement(schema string, cfg Config) (sql string, extra []any, stale, dead time.Duration, err error) {
	if cfg.Source.Kind != SourceWhizbang {
		r := strings.NewReplacer(
			"{verdicts}", "{schema}.instance_state_verdicts($1::interval, $2::interval)",
			"{stamp}", "{schema}.stamp_alive_lock_absences_seen(ARRAY(SELECT unnest(v.lost) FROM services v))",
			"{key_shared}", "false",
			"{instances}", "{schema}.instances")
		return strings.ReplaceAll(r.Replace(instancesSQL), "{schema}", schema), nil, cfg.StaleThreshold, cfg.DefinitiveDeadCutoff, nil
	}
	w := cfg.Source.Whizbang
	verdicts, err := w.Verdicts("$1::interval", "$2::interval", "$4::text")
	if err != nil {
		return "", nil, 0, 0, err
	}
	r := strings.NewReplacer("{verdicts}", verdicts, "{stamp}", "NULL::integer", "{key_shared}", "v.key_shared", "{instances}", w.Table())
	return r.Replace(instancesSQL), []any{w.LockKeyPrefix}, w.StaleThreshold, w.DefinitiveDeadCutoff, nil
}

type instancesCollector struct {
	pool               *pgxpool.Pool
	sql                string
	extraArgs          []any // after the max series: a Whizbang source's lock key prefix
	stale, dead        time.Duration
	maxSeries          int
	maxServices        int
	countDesc, ageDesc *exposition.Family
	oldestDesc         *exposition.Family
	recoveryDesc       *exposition.Family
	foldedDesc         *exposition.Family
	keySharedDesc      *exposition.Family // a Whizbang source only
	log                *slog.Logger
	standby            logging.Repeats // logged when the database becomes a standby, and stops being one
}

func newInstancesCollector(d deps) (Collector, error) {
	cfg := d.cfg
	sql, extra, stale, dead, err := instancesStatement(d.schema(), *cfg)
	if err != nil {
		return nil, err
	}
	c := &instancesCollector{
		log:         d.logger,
		pool:        d.pool,
		sql:         sql,
		extraArgs:   extra,
		stale:       stale,
		dead:        dead,
		maxSeries:   cfg.Instances.MaxSeries,
		maxServices: cfg.Instances.MaxServices,
		foldedDesc: gauge("instance_services_folded",
			`Services beyond --collector.instances.max-services whose instances are counted under service="other".`),
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
	if cfg.Source.Kind == SourceWhizbang {
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
	rows, err := c.pool.Query(ctx, c.sql, append([]any{c.stale, c.dead, c.maxSeries}, c.extraArgs...)...)
	if err != nil {
		return err
	}
	defer rows.Close()
	var (
		services []serviceRow
		service  pgtype.Text    // NULL on the standby row
		id       pgtype.Text    // set on per-instance rows
		counts   [6]pgtype.Int8 // set on per-service rows, in instanceStates order
		age      pgtype.Float8
		recovery pgtype.Bool // set on the standby row
		shared   pgtype.Int8 // on the standby row: a Whizbang source's instances sharing a held key
	)
	for rows.Next() {
		if err := rows.Scan(&service, &id, &counts[0], &counts[1], &counts[2], &counts[3], &counts[4], &counts[5],
			&age, &recovery, &shared); err != nil {
			return err
		}
		switch {
		case recovery.Valid:
			c.reportRecovery(recovery.Bool)
			out.Add(c.recoveryDesc, boolFloat(recovery.Bool))
			if c.keySharedDesc != nil {
				out.Add(c.keySharedDesc, float64(shared.Int64)) // NULL (no service) is 0
			}
		case id.Valid:
			// A service name from a SQL_ASCII database may hold any bytes: one such row
			// must not cost the others their metrics.
			svc, _ := labelValue(service.String)
			out.Add(c.ageDesc, age.Float64, svc, id.String)
		default:
			r := serviceRow{oldest: age.Float64}
			r.name, _ = labelValue(service.String)
			for i := range counts {
				r.counts[i] = float64(counts[i].Int64)
			}
			services = append(services, r)
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
