package collector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/alecthomas/kingpin/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
	"github.com/pg-liveness/pg_liveness_exporter/internal/sqltag"
	"github.com/pg-liveness/pg_liveness_exporter/logging"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
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

func (s *LeasesConfig) flags(app *kingpin.Application) {
	app.Flag("collector.leases.table",
		`Leases table, as "table" or "schema.table" (default: <db.schema>.leases; with --source=whizbang, none unless given). A plain table without an epoch column works too.`).
		PlaceHolder("TABLE").StringVar(&s.Table)
	app.Flag("collector.leases.max-series",
		`Most leases exported one by one, the most urgent first; the rest are exported together as lease="other".`).
		Default(strconv.Itoa(s.MaxSeries)).IntVar(&s.MaxSeries)
}

func (s *LeasesConfig) check(c *Config) error {
	if _, err := parseTable(s.Table, c.Schema); err != nil {
		return fmt.Errorf("--collector.leases.table: %w", err)
	}
	if s.MaxSeries < 0 {
		return fmt.Errorf("--collector.leases.max-series must be 0 or more, got %d", s.MaxSeries)
	}
	return nil
}

// parseTable renders "table" or "schema.table" as a quoted identifier.
func parseTable(s, schema string) (string, error) {
	if s == "" {
		return pgx.Identifier{schema, "leases"}.Sanitize(), nil
	}
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf(`%q: want "table" or "schema.table"`, s)
	}
	for i, p := range parts {
		kind, what := migrations.TableName, "table"
		if i == 0 && len(parts) == 2 {
			kind, what = migrations.SchemaName, "schema"
		}
		if p == "" {
			return "", fmt.Errorf(`%q: want "table" or "schema.table"`, s)
		}
		if err := migrations.ValidateIdentifier(kind, p); err != nil {
			return "", fmt.Errorf("%q: the %s name %w", s, what, err)
		}
	}
	return pgx.Identifier(parts).Sanitize(), nil
}

// leasesSQL reads the leases by the database clock, folded in the database so that only
// the exported rows travel. Nothing is assumed of a foreign table: names may repeat and
// any column may be NULL. One row per name counts ({best}); of those, the max-series most
// urgent ($2: expired longest ago, then soonest to expire, NULL last, then by name) come
// one row each, in that order, followed by one summary row: the folded leases (how many,
// how many unexpired, the soonest expiry, the earliest taken_at), the anomalies (rows
// without a name, named rows with a NULL holder, taken_at or expires_at, and extra rows
// of a name), and the table's shape ($1, the table, as a regclass): which of the optional
// columns it has, and "unique name" when a unique index guarantees one row per name.
//
// {table} is a quoted identifier. The optional columns {epoch}, {holder_instance_id} and
// {holder_host} are the table's columns, or NULL when it has none (a plain leases table
// without an epoch, or one from before holder identities). leasesFor renders them and
// {best} for the table's shape, and the summary row tells when the shape changed.
const leasesSQL = `WITH ` + sqltag.Leases + ` best AS {best}, kept AS MATERIALIZED (
    SELECT b.* FROM best b ORDER BY b.expires_at, b.name LIMIT $2
)
(SELECT k.name, k.holder::text, k.epoch::bigint, k.holder_instance_id::text, k.holder_host::text,
        extract(epoch FROM k.expires_at - now())::float8, k.expires_at >= now(),
        extract(epoch FROM now() - k.taken_at)::float8,
        NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::text[]
   FROM kept k
  ORDER BY k.expires_at, k.name)
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL,
       extract(epoch FROM f.soonest - now())::float8, NULL, extract(epoch FROM now() - f.first_taken)::float8,
       f.n, f.held, a.null_names, a.null_values, a.named - f.n - (SELECT count(*) FROM kept),
       ARRAY(SELECT c.attname::text FROM pg_catalog.pg_attribute c
              WHERE c.attrelid = $1::regclass AND c.attnum > 0 AND NOT c.attisdropped
                AND c.attname IN ('epoch', 'holder_instance_id', 'holder_host')
             UNION ALL
             (SELECT 'unique name' FROM pg_catalog.pg_index x
                JOIN pg_catalog.pg_attribute c ON c.attrelid = x.indrelid AND c.attnum = x.indkey[0]
               WHERE x.indrelid = $1::regclass AND x.indisunique AND x.indisvalid AND x.indnkeyatts = 1
                 AND x.indpred IS NULL AND c.attname = 'name'
               LIMIT 1))
  FROM (SELECT count(*) FILTER (WHERE l.name IS NULL) AS null_names,
               count(*) FILTER (WHERE l.name IS NOT NULL AND (l.holder IS NULL OR l.expires_at IS NULL OR l.taken_at IS NULL)) AS null_values,
               count(*) FILTER (WHERE l.name IS NOT NULL) AS named
          FROM {table} AS l) a,
       (SELECT min(b.expires_at) AS soonest, min(b.taken_at) AS first_taken, count(*) AS n,
               count(*) FILTER (WHERE b.expires_at >= now()) AS held
          FROM best b
         WHERE b.name NOT IN (SELECT k.name FROM kept k)) f`

// leasesBestSQL is {best} for a table whose names may repeat: of a name's rows, the one
// expiring last, then the higher epoch, then the holder.
const leasesBestSQL = `MATERIALIZED (
    SELECT DISTINCT ON (l.name::text COLLATE "C")
           l.name::text COLLATE "C" AS name, l.holder, {epoch} AS epoch, {holder_instance_id} AS holder_instance_id,
           {holder_host} AS holder_host, l.expires_at, l.taken_at
      FROM {table} AS l
     WHERE l.name IS NOT NULL
     ORDER BY l.name::text COLLATE "C", l.expires_at DESC NULLS LAST, 3 DESC NULLS LAST, l.holder::text COLLATE "C" DESC NULLS LAST
)`

// leasesUniqueSQL is {best} for a table with a unique index on name, as ours has: every
// named row, without sorting them all; the most urgent come off an index on expires_at
// when there is one.
const leasesUniqueSQL = `NOT MATERIALIZED (
    SELECT l.name::text COLLATE "C" AS name, l.holder, {epoch} AS epoch, {holder_instance_id} AS holder_instance_id,
           {holder_host} AS holder_host, l.expires_at, l.taken_at
      FROM {table} AS l
     WHERE l.name IS NOT NULL
)`

// uniqueName is the shape entry leasesSQL reports for a table with a unique index on name.
const uniqueName = "unique name"

// ourLeasesShape is our own leases table's shape, as leasesSQL reports it (sorted).
var ourLeasesShape = []string{"epoch", "holder_host", "holder_instance_id", uniqueName}

// leasesFor renders leasesSQL for a table of the given shape.
func leasesFor(table string, shape []string) string {
	best := leasesBestSQL
	if slices.Contains(shape, uniqueName) {
		best = leasesUniqueSQL
	}
	s := strings.ReplaceAll(leasesSQL, "{best}", best)
	s = strings.ReplaceAll(s, "{table}", table)
	for _, col := range []string{"epoch", "holder_instance_id", "holder_host"} {
		expr := "NULL::text"
		if col == "epoch" {
			expr = "NULL::bigint"
		}
		if slices.Contains(shape, col) {
			expr = "l." + col
		}
		s = strings.ReplaceAll(s, "{"+col+"}", expr)
	}
	return s
}

// otherLease is the lease label of the leases folded beyond --collector.leases.max-series.
const otherLease = "other"

// Lease row anomalies, counted per scrape in pg_liveness_lease_row_anomalies{kind}.
var leaseAnomalies = []string{"duplicate_name", "null_name", "null_value", "invalid_utf8"}

type leasesCollector struct {
	pool                                    *pgxpool.Pool
	table                                   string // quoted identifier
	maxSeries                               int
	logger                                  *slog.Logger
	expiresIn, held, epoch, holder, heldFor *exposition.Family
	folded, anomalies                       *exposition.Family

	anomalyLog logging.Repeats // the kinds of anomalies, logged when they change

	mu    sync.Mutex
	shape []string // the table's shape sql was rendered for
	sql   string
}

func newLeasesCollector(d deps) (Collector, error) {
	const lease = "lease"
	table, err := parseTable(d.cfg.Leases.Table, d.cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("--collector.leases.table: %w", err)
	}
	return &leasesCollector{
		pool:      d.pool,
		table:     table,
		shape:     ourLeasesShape, // corrected by the first scrape for another table
		sql:       leasesFor(table, ourLeasesShape),
		maxSeries: d.cfg.Leases.MaxSeries,
		logger:    d.logger,
		expiresIn: gauge("lease_expires_in_seconds",
			`Seconds until the lease expires by the database clock; negative once expired. For lease="other", the soonest of the folded leases.`, lease),
		held: gauge("lease_held",
			`1 while the lease has not expired (expires_at >= now()), else 0. For lease="other", how many folded leases are held.`, lease),
		epoch: gauge("lease_epoch",
			"Fencing token of the lease's current acquisition; absent for a table without an epoch column.", lease),
		holder: gauge("lease_holder_info",
			"The lease's holder: its instance id (empty for a holder that records none) and host (the holder_host column, else the holder up to its first colon).",
			lease, "holder_instance_id", "holder_host"),
		heldFor: gauge("lease_held_for_seconds",
			`Seconds since the lease was taken, by the database clock. For lease="other", the longest of the folded leases.`, lease),
		folded: gauge("leases_folded",
			`Leases beyond --collector.leases.max-series, exported together as lease="other".`),
		anomalies: gauge("lease_row_anomalies",
			"Rows of the leases table that are not one clean lease, in this scrape: duplicate_name (extra rows of a name; the one expiring last is exported), "+
				"null_name (rows skipped), null_value (a NULL holder, taken_at or expires_at; the rest is exported), invalid_utf8 (bytes replaced in an exported label).",
			"kind"),
	}, nil
}

// leaseRow is one row of leasesSQL: an exported lease, or the summary (Folded set). The
// NULLs of a foreign table stay invalid.
type leaseRow struct {
	Name, Holder, HolderInstanceID, HolderHost pgtype.Text
	Epoch                                      pgtype.Int8
	ExpiresIn                                  pgtype.Float8 // the summary's: the soonest folded expiry
	Held                                       pgtype.Bool
	HeldFor                                    pgtype.Float8 // the summary's: the longest held folded lease
	Folded, FoldedHeld                         pgtype.Int8
	NullNames, NullValues, Duplicates          pgtype.Int8
	Shape                                      []string // the table's optional columns, and "unique name"
}

func (c *leasesCollector) Update(ctx context.Context, out *exposition.Builder) error {
	c.mu.Lock()
	shape, sql := c.shape, c.sql
	c.mu.Unlock()
	var (
		sum    leaseRow
		counts map[string]int64
		err    error
	)
	for attempt := 1; ; attempt++ {
		out.Reset() // what an earlier attempt added
		sum, counts, err = c.read(ctx, sql, out)
		var pgErr *pgconn.PgError
		if err != nil && errors.As(err, &pgErr) && pgErr.Code == "42703" && len(shape) > 0 && attempt == 1 {
			// An optional column is missing: read without any, which tells the shape.
			shape, sql = nil, leasesFor(c.table, nil)
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
		shape, sql = sum.Shape, leasesFor(c.table, sum.Shape)
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

// read runs leasesSQL once, adds the exported leases to out as their rows arrive, and
// returns the summary row and the anomalies found in the exported rows.
func (c *leasesCollector) read(ctx context.Context, sql string, out *exposition.Builder) (leaseRow, map[string]int64, error) {
	var r leaseRow
	counts := map[string]int64{}
	rows, err := c.pool.Query(ctx, sql, c.table, c.maxSeries)
	if err != nil {
		return r, nil, err
	}
	defer rows.Close()
	seen := map[string]bool{}
	for rows.Next() {
		r = leaseRow{}
		if err := rows.Scan(&r.Name, &r.Holder, &r.Epoch, &r.HolderInstanceID, &r.HolderHost, &r.ExpiresIn, &r.Held, &r.HeldFor,
			&r.Folded, &r.FoldedHeld, &r.NullNames, &r.NullValues, &r.Duplicates, &r.Shape); err != nil {
			return r, nil, err
		}
		if r.Folded.Valid { // the summary, last
			continue
		}
		name, bad := labelValue(r.Name.String)
		if seen[name] { // two names that differ only in invalid bytes
			counts["duplicate_name"]++
			continue
		}
		seen[name] = true
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
