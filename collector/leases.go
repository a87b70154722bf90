package collector

import (
	"context"
	"log/slog"
	"math"
	"sort"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// leasesSQL reads every lease row by the database clock. The epoch goes through to_jsonb
// so that the same statement reads our leases table and a plain one without an epoch
// column (the epoch is then NULL). Nothing is assumed of a foreign table: names may
// repeat and any column may be NULL; Update sorts that out. {table} is a quoted
// identifier.
const leasesSQL = `
SELECT l.name::text, l.holder::text, (pg_catalog.to_jsonb(l) ->> 'epoch')::bigint,
       extract(epoch FROM l.expires_at - now())::float8,
       l.expires_at >= now(),
       extract(epoch FROM now() - l.taken_at)::float8
  FROM {table} AS l`

// otherLease is the lease label of the leases folded beyond --collector.leases.max-series.
const otherLease = "other"

// Lease row anomalies, counted per scrape in pg_liveness_lease_row_anomalies{kind}.
var leaseAnomalies = []string{"duplicate_name", "null_name", "null_value", "invalid_utf8"}

type leasesCollector struct {
	pool                                    *pgxpool.Pool
	sql                                     string
	maxSeries                               int
	logger                                  *slog.Logger
	expiresIn, held, epoch, holder, heldFor *prometheus.Desc
	folded, anomalies                       *prometheus.Desc

	mu          sync.Mutex
	lastAnomaly string // the anomalies last logged, "" while there are none
}

func newLeasesCollector(pool *pgxpool.Pool, table string, maxSeries int, logger *slog.Logger) *leasesCollector {
	lease := []string{"lease"}
	return &leasesCollector{
		pool:      pool,
		sql:       strings.ReplaceAll(leasesSQL, "{table}", table),
		maxSeries: maxSeries,
		logger:    logger,
		expiresIn: prometheus.NewDesc(namespace+"_lease_expires_in_seconds",
			`Seconds until the lease expires by the database clock; negative once expired. For lease="other", the soonest of the folded leases.`, lease, nil),
		held: prometheus.NewDesc(namespace+"_lease_held",
			`1 while the lease has not expired (expires_at >= now()), else 0. For lease="other", how many folded leases are held.`, lease, nil),
		epoch: prometheus.NewDesc(namespace+"_lease_epoch",
			"Fencing token of the lease's current acquisition; absent for a table without an epoch column.", lease, nil),
		holder: prometheus.NewDesc(namespace+"_lease_holder_info",
			"Host of the lease's holder: the holder up to its first colon.", []string{"lease", "holder_host"}, nil),
		heldFor: prometheus.NewDesc(namespace+"_lease_held_for_seconds",
			`Seconds since the lease was taken, by the database clock. For lease="other", the longest of the folded leases.`, lease, nil),
		folded: prometheus.NewDesc(namespace+"_leases_folded",
			`Leases beyond --collector.leases.max-series, exported together as lease="other".`, nil, nil),
		anomalies: prometheus.NewDesc(namespace+"_lease_row_anomalies",
			"Rows of the leases table that are not one clean lease, in this scrape: duplicate_name (extra rows of a name; the one expiring last is exported), "+
				"null_name (rows skipped), null_value (a NULL holder, epoch, taken_at or expires_at; the rest is exported), invalid_utf8 (bytes replaced in a label).",
			[]string{"kind"}, nil),
	}
}

type leaseRow struct {
	name, holder string
	hasHolder    bool
	epoch        *int64
	expiresIn    *float64
	held         bool
	heldFor      *float64
	dups         int
}

// better orders rows of one name: the one expiring last wins, then the higher epoch,
// then the holder; so the choice does not depend on the table's row order.
func (r *leaseRow) better(o *leaseRow) bool {
	a, b := math.Inf(-1), math.Inf(-1)
	if r.expiresIn != nil {
		a = *r.expiresIn
	}
	if o.expiresIn != nil {
		b = *o.expiresIn
	}
	if a != b {
		return a > b
	}
	var ea, eb int64 = math.MinInt64, math.MinInt64
	if r.epoch != nil {
		ea = *r.epoch
	}
	if o.epoch != nil {
		eb = *o.epoch
	}
	if ea != eb {
		return ea > eb
	}
	return r.holder > o.holder
}

func (c *leasesCollector) Update(ctx context.Context, ch chan<- prometheus.Metric) error {
	rows, err := c.pool.Query(ctx, c.sql)
	if err != nil {
		return err
	}
	defer rows.Close()
	counts := map[string]int{}
	byName := map[string]*leaseRow{}
	for rows.Next() {
		var (
			name, holder       *string
			r                  leaseRow
			expiresIn, heldFor *float64
			held               *bool
		)
		if err := rows.Scan(&name, &holder, &r.epoch, &expiresIn, &held, &heldFor); err != nil {
			return err
		}
		if name == nil {
			counts["null_name"]++
			continue
		}
		if holder == nil || expiresIn == nil || held == nil || heldFor == nil {
			counts["null_value"]++
		}
		var bad bool
		r.name, bad = labelValue(*name)
		if holder != nil {
			host, _, _ := strings.Cut(*holder, ":") // never the pid or random part
			var badHost bool
			r.holder, badHost = labelValue(host)
			r.hasHolder = true
			bad = bad || badHost
		}
		if bad {
			counts["invalid_utf8"]++
		}
		r.expiresIn, r.heldFor = expiresIn, heldFor
		r.held = held != nil && *held
		if prev, ok := byName[r.name]; ok {
			counts["duplicate_name"]++
			if !r.better(prev) {
				prev.dups++
				continue
			}
			r.dups = prev.dups + 1
		}
		byName[r.name] = &r
	}
	if err := rows.Err(); err != nil {
		return err
	}

	leases := make([]*leaseRow, 0, len(byName))
	for _, r := range byName {
		leases = append(leases, r)
	}
	// The most urgent first: expired longest ago, then soonest to expire; NULL last.
	sort.Slice(leases, func(i, j int) bool {
		a, b := leases[i], leases[j]
		if (a.expiresIn == nil) != (b.expiresIn == nil) {
			return b.expiresIn == nil
		}
		if a.expiresIn != nil && *a.expiresIn != *b.expiresIn {
			return *a.expiresIn < *b.expiresIn
		}
		return a.name < b.name
	})
	kept := leases
	if len(leases) > c.maxSeries {
		kept = leases[:c.maxSeries]
	}
	for _, r := range kept {
		if r.expiresIn != nil {
			ch <- prometheus.MustNewConstMetric(c.expiresIn, prometheus.GaugeValue, *r.expiresIn, r.name)
		}
		ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, boolFloat(r.held), r.name)
		if r.epoch != nil {
			ch <- prometheus.MustNewConstMetric(c.epoch, prometheus.GaugeValue, float64(*r.epoch), r.name)
		}
		if r.hasHolder {
			ch <- prometheus.MustNewConstMetric(c.holder, prometheus.GaugeValue, 1, r.name, r.holder)
		}
		if r.heldFor != nil {
			ch <- prometheus.MustNewConstMetric(c.heldFor, prometheus.GaugeValue, *r.heldFor, r.name)
		}
	}
	if rest := leases[len(kept):]; len(rest) > 0 {
		held, soonest, longest := 0.0, math.Inf(1), math.Inf(-1)
		for _, r := range rest {
			held += boolFloat(r.held)
			if r.expiresIn != nil {
				soonest = min(soonest, *r.expiresIn)
			}
			if r.heldFor != nil {
				longest = max(longest, *r.heldFor)
			}
		}
		ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, held, otherLease)
		if !math.IsInf(soonest, 1) {
			ch <- prometheus.MustNewConstMetric(c.expiresIn, prometheus.GaugeValue, soonest, otherLease)
		}
		if !math.IsInf(longest, -1) {
			ch <- prometheus.MustNewConstMetric(c.heldFor, prometheus.GaugeValue, longest, otherLease)
		}
	}
	ch <- prometheus.MustNewConstMetric(c.folded, prometheus.GaugeValue, float64(len(leases)-len(kept)))
	var summary []string
	for _, k := range leaseAnomalies {
		ch <- prometheus.MustNewConstMetric(c.anomalies, prometheus.GaugeValue, float64(counts[k]), k)
		if counts[k] > 0 {
			summary = append(summary, k)
		}
	}
	c.logAnomalies(strings.Join(summary, ","), counts)
	return nil
}

// logAnomalies logs once when the kinds of anomalies change, not on every scrape.
func (c *leasesCollector) logAnomalies(kinds string, counts map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if kinds == c.lastAnomaly {
		return
	}
	c.lastAnomaly = kinds
	if kinds == "" {
		c.logger.Info("the leases table has no anomalous rows any more")
		return
	}
	c.logger.Warn("the leases table has rows that are not one clean lease; exporting what they allow",
		"kinds", kinds, "duplicate_name", counts["duplicate_name"], "null_name", counts["null_name"],
		"null_value", counts["null_value"], "invalid_utf8", counts["invalid_utf8"])
}
