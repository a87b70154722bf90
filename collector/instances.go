package collector

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Instance states, as the migrations' instance_states defines them (the one definition):
// alive (lock held, fresh heartbeat), lock_only (lock held, stale heartbeat), lock_lost
// (lock vanished moments ago, proving life within its grace), heartbeat_only (no lock,
// fresh heartbeat), stale (dead: stale heartbeat, or the lock vanished with no proof of
// life within the grace), zombie (dead: lock held, heartbeat past the definitive-dead
// cutoff).
var instanceStates = []string{"alive", "lock_only", "lock_lost", "heartbeat_only", "stale", "zombie"}

// instancesSQL returns one summary row per service (state counts and the oldest
// heartbeat, from instance_states) followed by the max-series instances with the oldest
// heartbeats, so that 10,000 instances never leave the server. The oldest heartbeats come
// off the last_heartbeat_at index. The first row only says whether the server is a
// standby, where instance_states gives no lock-based verdict.
//
// $1 stale threshold and $2 definitive-dead cutoff in seconds, for rows that carry no
// timing of their own; $3 max series.
const instancesSQL = `/* pg_liveness:instances */
SELECT NULL::text, NULL::text, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
       NULL::float8, pg_catalog.pg_is_in_recovery()
UNION ALL
SELECT s.service_name, NULL::text,
       count(*) FILTER (WHERE s.state = 'alive'),
       count(*) FILTER (WHERE s.state = 'lock_only'),
       count(*) FILTER (WHERE s.state = 'lock_lost'),
       count(*) FILTER (WHERE s.state = 'heartbeat_only'),
       count(*) FILTER (WHERE s.state = 'stale'),
       count(*) FILTER (WHERE s.state = 'zombie'),
       extract(epoch FROM now() - min(s.last_heartbeat_at))::float8, NULL
  FROM {schema}.instance_states(make_interval(secs => $1::float8), make_interval(secs => $2::float8)) s
 GROUP BY s.service_name
UNION ALL
(SELECT i.service_name, i.instance_id::text, NULL, NULL, NULL, NULL, NULL, NULL,
        extract(epoch FROM now() - i.last_heartbeat_at)::float8, NULL
   FROM {schema}.instances i
  ORDER BY i.last_heartbeat_at, i.instance_id
  LIMIT $3)`

type instancesCollector struct {
	pool               *pgxpool.Pool
	sql                string
	stale, dead        float64 // seconds
	maxSeries          int
	countDesc, ageDesc *prometheus.Desc
	oldestDesc         *prometheus.Desc
	recoveryDesc       *prometheus.Desc
	log                *slog.Logger
	inRecovery         atomic.Bool // as of the last scrape; logged on change
}

func newInstancesCollector(pool *pgxpool.Pool, schema string, cfg Config, log *slog.Logger) *instancesCollector {
	return &instancesCollector{
		log:       log,
		pool:      pool,
		sql:       strings.ReplaceAll(instancesSQL, "{schema}", schema),
		stale:     cfg.StaleThreshold.Seconds(),
		dead:      cfg.DefinitiveDeadCutoff.Seconds(),
		maxSeries: cfg.Instances.MaxSeries,
		countDesc: prometheus.NewDesc(namespace+"_instances",
			"Instances by service and liveness state: alive (lock held, fresh heartbeat), lock_only (lock held, stale heartbeat), "+
				"lock_lost (lock vanished, proving life within its grace), heartbeat_only (no lock, fresh heartbeat), "+
				"stale (dead: stale heartbeat, or lock vanished without proof of life), zombie (dead: lock held, heartbeat past the definitive-dead cutoff).",
			[]string{"service", "state"}, nil),
		recoveryDesc: prometheus.NewDesc(namespace+"_database_in_recovery",
			"1 when the database is a hot standby: its pg_locks does not show the primary's alive locks, so instance states "+
				"rest on heartbeats alone. Point observers at the primary.",
			nil, nil),
		ageDesc: prometheus.NewDesc(namespace+"_instance_heartbeat_age_seconds",
			"Age of an instance's last heartbeat by the database clock; only the oldest --collector.instances.max-series instances are exported.",
			[]string{"service", "instance_id"}, nil),
		oldestDesc: prometheus.NewDesc(namespace+"_instance_oldest_heartbeat_age_seconds",
			"Age of the oldest heartbeat of a service's instances, by the database clock.",
			[]string{"service"}, nil),
	}
}

func (c *instancesCollector) Update(ctx context.Context, ch chan<- prometheus.Metric) error {
	rows, err := c.pool.Query(ctx, c.sql, c.stale, c.dead, c.maxSeries)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			service  *string   // NULL on the standby row
			id       *string   // set on per-instance rows
			counts   [6]*int64 // set on per-service rows, in instanceStates order
			age      *float64
			recovery *bool // set on the standby row
		)
		if err := rows.Scan(&service, &id, &counts[0], &counts[1], &counts[2], &counts[3], &counts[4], &counts[5],
			&age, &recovery); err != nil {
			return err
		}
		switch {
		case recovery != nil:
			c.reportRecovery(*recovery)
			ch <- prometheus.MustNewConstMetric(c.recoveryDesc, prometheus.GaugeValue, boolFloat(*recovery))
		case id != nil:
			ch <- prometheus.MustNewConstMetric(c.ageDesc, prometheus.GaugeValue, *age, *service, *id)
		default:
			for i, state := range instanceStates {
				ch <- prometheus.MustNewConstMetric(c.countDesc, prometheus.GaugeValue, float64(*counts[i]), *service, state)
			}
			ch <- prometheus.MustNewConstMetric(c.oldestDesc, prometheus.GaugeValue, *age, *service)
		}
	}
	return rows.Err()
}

// reportRecovery logs when the database becomes a standby, and when it stops being one.
func (c *instancesCollector) reportRecovery(inRecovery bool) {
	if c.inRecovery.Swap(inRecovery) == inRecovery {
		return
	}
	if inRecovery {
		c.log.Warn("the database is a hot standby: its pg_locks does not show the primary's alive locks, so instance " +
			"states rest on heartbeats alone and lock holders are not seen; point the exporter at the primary")
		return
	}
	c.log.Info("the database is no longer a standby: instance states use the alive locks again")
}
