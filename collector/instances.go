package collector

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Instance states. An instance is alive while its alive lock is held and its heartbeat
// is fresh; a held lock with a stale heartbeat is lock_only until the definitive-dead
// cutoff, then zombie (an OOM-killed process on a half-open session); without the lock
// the heartbeat alone decides between heartbeat_only and stale.
var instanceStates = []string{"alive", "lock_only", "heartbeat_only", "stale", "zombie"}

// instancesSQL returns one summary row per service (state counts and the oldest
// heartbeat) followed by the max-series instances with the oldest heartbeats, so that
// 10,000 instances never leave the server. The lock test is a hash join on the view
// instance_alive_locks, the match is_instance_alive uses; the oldest heartbeats come off
// the last_heartbeat_at index. Ages and thresholds use the database clock, with the
// comparisons of is_instance_alive: fresh means last_heartbeat_at > now() - threshold.
//
// $1 stale threshold and $2 definitive-dead cutoff in seconds, $3 max series.
const instancesSQL = `
SELECT i.service_name, NULL::text,
       count(*) FILTER (WHERE a.locked AND i.last_heartbeat_at > now() - make_interval(secs => $1)),
       count(*) FILTER (WHERE a.locked AND i.last_heartbeat_at <= now() - make_interval(secs => $1)
                                       AND i.last_heartbeat_at > now() - make_interval(secs => $2)),
       count(*) FILTER (WHERE a.locked IS NULL AND i.last_heartbeat_at > now() - make_interval(secs => $1)),
       count(*) FILTER (WHERE a.locked IS NULL AND i.last_heartbeat_at <= now() - make_interval(secs => $1)),
       count(*) FILTER (WHERE a.locked AND i.last_heartbeat_at <= now() - make_interval(secs => $2)),
       extract(epoch FROM now() - min(i.last_heartbeat_at))::float8
  FROM {schema}.instances i
  LEFT JOIN (SELECT DISTINCT l.instance_id, true AS locked FROM {schema}.instance_alive_locks l) a
         ON a.instance_id = i.instance_id
 GROUP BY i.service_name
UNION ALL
(SELECT i.service_name, i.instance_id::text, NULL, NULL, NULL, NULL, NULL,
        extract(epoch FROM now() - i.last_heartbeat_at)::float8
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
}

func newInstancesCollector(pool *pgxpool.Pool, schema string, cfg Config) *instancesCollector {
	return &instancesCollector{
		pool:      pool,
		sql:       strings.ReplaceAll(instancesSQL, "{schema}", schema),
		stale:     cfg.StaleThreshold.Seconds(),
		dead:      cfg.DefinitiveDeadCutoff.Seconds(),
		maxSeries: cfg.Instances.MaxSeries,
		countDesc: prometheus.NewDesc(namespace+"_instances",
			"Instances by service and liveness state: alive (lock held, fresh heartbeat), lock_only (lock held, stale heartbeat), "+
				"heartbeat_only (no lock, fresh heartbeat), stale (no lock, stale heartbeat), zombie (lock held, heartbeat past the definitive-dead cutoff).",
			[]string{"service", "state"}, nil),
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
			service string
			id      *string   // set on per-instance rows
			counts  [5]*int64 // set on per-service rows, in instanceStates order
			age     float64
		)
		if err := rows.Scan(&service, &id, &counts[0], &counts[1], &counts[2], &counts[3], &counts[4], &age); err != nil {
			return err
		}
		if id != nil {
			ch <- prometheus.MustNewConstMetric(c.ageDesc, prometheus.GaugeValue, age, service, *id)
			continue
		}
		for i, state := range instanceStates {
			ch <- prometheus.MustNewConstMetric(c.countDesc, prometheus.GaugeValue, float64(*counts[i]), service, state)
		}
		ch <- prometheus.MustNewConstMetric(c.oldestDesc, prometheus.GaugeValue, age, service)
	}
	return rows.Err()
}
