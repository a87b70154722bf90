package collector

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// leasesSQL reads every lease by the database clock. The epoch goes through to_jsonb so
// that the same statement reads our leases table and a plain one without an epoch
// column (the epoch is then NULL). {table} is a quoted identifier.
const leasesSQL = `
SELECT l.name::text, l.holder::text, (pg_catalog.to_jsonb(l) ->> 'epoch')::bigint,
       extract(epoch FROM l.expires_at - now())::float8,
       l.expires_at >= now(),
       extract(epoch FROM now() - l.taken_at)::float8
  FROM {table} AS l`

type leasesCollector struct {
	pool                                    *pgxpool.Pool
	sql                                     string
	expiresIn, held, epoch, holder, heldFor *prometheus.Desc
}

func newLeasesCollector(pool *pgxpool.Pool, table string) *leasesCollector {
	lease := []string{"lease"}
	return &leasesCollector{
		pool: pool,
		sql:  strings.ReplaceAll(leasesSQL, "{table}", table),
		expiresIn: prometheus.NewDesc(namespace+"_lease_expires_in_seconds",
			"Seconds until the lease expires by the database clock; negative once expired.", lease, nil),
		held: prometheus.NewDesc(namespace+"_lease_held",
			"1 while the lease has not expired (expires_at >= now()), else 0.", lease, nil),
		epoch: prometheus.NewDesc(namespace+"_lease_epoch",
			"Fencing token of the lease's current acquisition; absent for a table without an epoch column.", lease, nil),
		holder: prometheus.NewDesc(namespace+"_lease_holder_info",
			"Host of the lease's holder: the holder up to its first colon.", []string{"lease", "holder_host"}, nil),
		heldFor: prometheus.NewDesc(namespace+"_lease_held_for_seconds",
			"Seconds since the lease was taken, by the database clock.", lease, nil),
	}
}

func (c *leasesCollector) Update(ctx context.Context, ch chan<- prometheus.Metric) error {
	rows, err := c.pool.Query(ctx, c.sql)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			name, holder       string
			epoch              *int64
			expiresIn, heldFor float64
			held               bool
		)
		if err := rows.Scan(&name, &holder, &epoch, &expiresIn, &held, &heldFor); err != nil {
			return err
		}
		host, _, _ := strings.Cut(holder, ":") // never the pid or random part
		ch <- prometheus.MustNewConstMetric(c.expiresIn, prometheus.GaugeValue, expiresIn, name)
		ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, boolFloat(held), name)
		if epoch != nil {
			ch <- prometheus.MustNewConstMetric(c.epoch, prometheus.GaugeValue, float64(*epoch), name)
		}
		ch <- prometheus.MustNewConstMetric(c.holder, prometheus.GaugeValue, 1, name, host)
		ch <- prometheus.MustNewConstMetric(c.heldFor, prometheus.GaugeValue, heldFor, name)
	}
	return rows.Err()
}
