package collector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// LeasesConfig configures the leases collector.
type LeasesConfig struct {
	Enabled bool
	// Table is "table" or "schema.table"; "" means <Schema>.leases.
	Table string
	// MaxSeries caps the leases exported one by one, the most urgent (expired, or
	// soonest to expire) first; the rest are exported together as lease="other".
	MaxSeries int
}

func (s *LeasesConfig) enabled() *bool { return &s.Enabled }

// defaultMaxLeases is LeasesConfig.MaxSeries' default.
const defaultMaxLeases = 500

func (s *LeasesConfig) defaults() { s.MaxSeries = defaultMaxLeases }

func (s *LeasesConfig) maxSeries() limit {
	return limit{"Config.Leases.MaxSeries", &s.MaxSeries, 0}
}

func (s *LeasesConfig) check(c *Config) error {
	if _, err := leasesTable(s.Table, c.Source.Schema()); err != nil {
		return fmt.Errorf("Config.Leases.Table: %w", err)
	}
	return s.maxSeries().check()
}

// leasesTable is Config.Leases.Table, or <schema>.leases when it is empty.
func leasesTable(s, schema string) (store.Table, error) {
	if s == "" {
		return store.Table{Schema: schema, Name: "leases"}, nil
	}
	return store.ParseTable(s)
}

// otherLease is the lease label of the leases folded beyond --collector.leases.max-series.
const otherLease = "other"

// Lease row anomalies, counted per scrape in pg_liveness_lease_row_anomalies{kind}.
var leaseAnomalies = []string{"duplicate_name", "null_name", "null_value", "invalid_utf8"}

// leasesCollector sends the leases statement (internal/store/sql/collectors.sql), rendered for the
// table's shape: which optional columns it has, and whether its names are unique.
type leasesCollector struct {
	pool                                    *pgxpool.Pool
	table                                   store.Table
	maxSeries                               int
	logger                                  *slog.Logger
	expiresIn, held, epoch, holder, heldFor *exposition.Family
	folded, anomalies                       *exposition.Family

	anomalyLog logging.Repeats // the kinds of anomalies, logged when they change

	mu    sync.Mutex
	shape []string // the table's shape sql was rendered for
	sql   string
}

// leasesQuery is the leases statement for the table's shape.
func (c *leasesCollector) leasesQuery(shape []string) string {
	return store.LeasesFor(c.table, shape).SQL
}

func newLeasesCollector(d deps) (collector, error) {
	const lease = "lease"
	table, err := leasesTable(d.cfg.Leases.Table, d.cfg.Source.Schema())
	if err != nil {
		return nil, fmt.Errorf("Config.Leases.Table: %w", err)
	}
	shape := store.OurLeasesShape() // corrected by the first scrape for another table
	return &leasesCollector{
		pool:      d.pool,
		table:     table,
		shape:     shape,
		sql:       store.LeasesFor(table, shape).SQL,
		maxSeries: d.cfg.Leases.MaxSeries,
		logger:    d.logger,
		expiresIn: gauge("lease_expires_in_seconds",
			`Seconds until the lease expires by the database clock; negative once expired. For the lease label other, the soonest of the folded leases.`, lease),
		held: gauge("lease_held",
			`1 while the lease has not expired (expires_at >= now()), else 0. For the lease label other, how many folded leases are held.`, lease),
		epoch: gauge("lease_epoch",
			"Fencing token of the lease's current acquisition; absent for a table without an epoch column.", lease),
		holder: gauge("lease_holder_info",
			"The lease's holder: its instance id (empty for a holder that records none) and host (the holder_host column, else the holder up to its first colon).",
			lease, "holder_instance_id", "holder_host"),
		heldFor: gauge("lease_held_for_seconds",
			`Seconds since the lease was taken, by the database clock. For the lease label other, the longest of the folded leases.`, lease),
		folded: gauge("leases_folded",
			`Leases beyond --collector.leases.max-series, exported together under the lease label other.`),
		anomalies: gauge("lease_row_anomalies",
			"Rows of the leases table that are not one clean lease, in this scrape: duplicate_name (extra rows of a name; the one expiring last is exported), "+
				"null_name (rows skipped), null_value (a NULL holder, taken_at or expires_at; the rest is exported), invalid_utf8 (bytes replaced in an exported label).",
			"kind"),
	}, nil
}

func (c *leasesCollector) Update(ctx context.Context, out *exposition.Builder) error {
	c.mu.Lock()
	shape, sql := c.shape, c.sql
	c.mu.Unlock()
	var (
		sum    store.LeasesRow
		counts map[string]int64
		err    error
	)
	for attempt := 1; ; attempt++ {
		out.Reset() // what an earlier attempt added
		sum, counts, err = c.read(ctx, sql, out)
		var pgErr *pgconn.PgError
		if err != nil && errors.As(err, &pgErr) && pgErr.Code == "42703" && len(shape) > 0 && attempt == 1 {
			// An optional column is missing: read without any, which tells the shape.
			shape, sql = nil, c.leasesQuery(nil)
			continue
		}
		if err != nil {
			return err
		}
		slices.Sort(sum.Shape)
		if slices.Equal(sum.Shape, shape) || attempt > 2 {
			break
		}
		// The table's shape is not the one the statement was rendered for.
		shape, sql = sum.Shape, c.leasesQuery(sum.Shape)
	}
	c.mu.Lock()
	c.shape, c.sql = shape, sql
	c.mu.Unlock()

	if sum.Folded.Int64 > 0 {
		out.Add(c.held, float64(sum.FoldedHeld.Int64), otherLease)
		if sum.ExpiresIn.Valid {
			out.Add(c.expiresIn, sum.ExpiresIn.Float64, otherLease)
		}
		if sum.HeldFor.Valid {
			out.Add(c.heldFor, sum.HeldFor.Float64, otherLease)
		}
	}
	out.Add(c.folded, float64(sum.Folded.Int64))
	counts["null_name"], counts["null_value"] = sum.NullNames.Int64, sum.NullValues.Int64
	counts["duplicate_name"] += sum.Duplicates.Int64
	var summary []string
	for _, k := range leaseAnomalies {
		out.Add(c.anomalies, float64(counts[k]), k)
		if counts[k] > 0 {
			summary = append(summary, k)
		}
	}
	c.logAnomalies(strings.Join(summary, ","), counts)
	return nil
}

// read runs the leases statement once, adds the exported leases to out as their rows
// arrive, and returns the summary row and the anomalies found in the exported rows.
func (c *leasesCollector) read(ctx context.Context, sql string, out *exposition.Builder) (store.LeasesRow, map[string]int64, error) {
	var r store.LeasesRow
	counts := map[string]int64{}
	rows, err := c.pool.Query(ctx, sql, c.table.Quoted(), c.maxSeries)
	if err != nil {
		return r, nil, err
	}
	defer rows.Close()
	var seen map[string]bool // the names holding U+FFFD: see below
	var sc rowScanner[store.LeasesRow]
	for rows.Next() {
		row, err := sc.scan(rows)
		if err != nil {
			return r, nil, err
		}
		r = *row
		if r.Folded.Valid { // the summary, last
			continue
		}
		name, bad := labelValue(r.Name.String)
		// The statement returns each name once; two become one label value only where
		// invalid bytes became U+FFFD, so only such names need remembering.
		if strings.ContainsRune(name, utf8.RuneError) {
			if seen[name] {
				counts["duplicate_name"]++
				continue
			}
			if seen == nil {
				seen = map[string]bool{}
			}
			seen[name] = true
		}
		if r.ExpiresIn.Valid {
			out.Add(c.expiresIn, r.ExpiresIn.Float64, name)
		}
		out.Add(c.held, boolFloat(r.Held.Bool), name)
		if r.Epoch.Valid {
			out.Add(c.epoch, float64(r.Epoch.Int64), name)
		}
		if r.Holder.Valid || r.HolderHost.Valid || r.HolderInstanceID.Valid {
			host := r.HolderHost.String
			if !r.HolderHost.Valid {
				host, _, _ = strings.Cut(r.Holder.String, ":") // never the pid or random part
			}
			host, badHost := labelValue(host)
			id, badID := labelValue(r.HolderInstanceID.String)
			bad = bad || badHost || badID
			out.Add(c.holder, 1, name, id, host)
		}
		if r.HeldFor.Valid {
			out.Add(c.heldFor, r.HeldFor.Float64, name)
		}
		if bad {
			counts["invalid_utf8"]++
		}
	}
	if err := rows.Err(); err != nil {
		return r, nil, err
	}
	if !r.Folded.Valid {
		return r, nil, errors.New("the leases statement returned no summary row")
	}
	return r, counts, nil
}

// logAnomalies logs when the kinds of anomalies change, not on every scrape.
func (c *leasesCollector) logAnomalies(kinds string, counts map[string]int64) {
	if kinds == "" {
		c.anomalyLog.Clear(c.logger, "the leases table has no anomalous rows any more")
		return
	}
	c.anomalyLog.Log(c.logger, slog.LevelWarn, kinds, "the leases table has rows that are not one clean lease; exporting what they allow",
		"kinds", kinds, "duplicate_name", counts["duplicate_name"], "null_name", counts["null_name"],
		"null_value", counts["null_value"], "invalid_utf8", counts["invalid_utf8"])
}
