package collector

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

func leasesOnly(table string, maxSeries int) Config {
	return Config{Leases: LeasesConfig{Enabled: true, Table: table, MaxSeries: maxSeries}, ScrapeDefaultTimeout: 10 * time.Second}
}

// A foreign leases table without a unique name, with NULLs: one name's two rows export
// one lease (the one expiring last), a NULL name is skipped, NULL columns leave their
// metric out, everything else (pg_liveness_up included) is exported, and the anomalies
// are counted and logged once.
func TestLeasesForeignTableRows(t *testing.T) {
	db := pgtest.NewDB(t)
	db.Exec(t, `CREATE TABLE jobs_leases (name text, holder text, taken_at timestamptz, expires_at timestamptz);
		INSERT INTO jobs_leases VALUES
		  ('mail', 'node-1:1', now() - interval '100 s', now() + interval '50 s'),
		  ('mail', 'node-2:2', now() - interval '10 s', now() + interval '110 s'),
		  (NULL, 'node-3', now(), now() + interval '10 s'),
		  ('report', NULL, NULL, now() + interval '30 s'),
		  ('uptime', 'node-4', now() - interval '5 s', now() + interval '20 s')`)
	logger, logs := logbuf.Logger()
	e := newExporter(t, leasesOnly("jobs_leases", 10), exporterPool(t, db.DSN, 1, nil), nil, logger)
	var got = scrapeFamilies(t, e)
	got = scrapeFamilies(t, e)
	checkSamples(t, got, []sample{
		{"pg_liveness_up", nil, 1},
		{"pg_liveness_scrape_collector_success", []string{"collector", "leases"}, 1},
		{"pg_liveness_lease_held", []string{"lease", "mail"}, 1},
		{"pg_liveness_lease_held", []string{"lease", "report"}, 1},
		{"pg_liveness_lease_held", []string{"lease", "uptime"}, 1},
		{"pg_liveness_lease_holder_info", []string{"lease", "mail", "holder_host", "node-2"}, 1},
		{"pg_liveness_lease_row_anomalies", []string{"kind", "duplicate_name"}, 1},
		{"pg_liveness_lease_row_anomalies", []string{"kind", "null_name"}, 1},
		{"pg_liveness_lease_row_anomalies", []string{"kind", "null_value"}, 1},
		{"pg_liveness_lease_row_anomalies", []string{"kind", "invalid_utf8"}, 0},
	})
	if v := value(got, "pg_liveness_lease_expires_in_seconds", "lease", "mail"); !(v > 60) {
		t.Errorf("mail expires in %v s, want the later row's ~110 s", v)
	}
	if n := len(got["pg_liveness_lease_holder_info"].GetMetric()); n != 2 {
		t.Errorf("%d holder_info series, want 2 (report's holder is NULL)", n)
	}
	if v := value(got, "pg_liveness_lease_held_for_seconds", "lease", "report"); v == v { // not NaN
		t.Errorf("held_for of a lease with NULL taken_at = %v, want absent", v)
	}
	if n := strings.Count(logs.String(), `level=WARN msg="the leases table has rows that are not one clean lease`); n != 1 {
		t.Errorf("%d anomaly log lines over two scrapes, want 1:\n%s", n, logs)
	}
}

// A table and schema named like the statement's placeholders are read as themselves: the
// table enters the statement once, quoted, and nothing is filled in after it (the
// statement was once rendered with a second pass over text that held the table's name).
func TestLeasesTableNamedLikeAPlaceholder(t *testing.T) {
	db := pgtest.NewDB(t)
	db.Exec(t, `CREATE SCHEMA "{table}";
		CREATE TABLE "{table}"."{holder_host}" (name text PRIMARY KEY, holder text, epoch bigint, holder_host text,
		                                         taken_at timestamptz, expires_at timestamptz);
		INSERT INTO "{table}"."{holder_host}" VALUES ('mail', 'node-1:1', 7, 'node-1', now() - interval '10 s', now() + interval '50 s')`)
	got := scrapeFamilies(t, newExporter(t, leasesOnly("{table}.{holder_host}", 10), exporterPool(t, db.DSN, 1, nil), nil, discard()))
	checkSamples(t, got, []sample{
		{"pg_liveness_scrape_collector_success", []string{"collector", "leases"}, 1},
		{"pg_liveness_lease_held", []string{"lease", "mail"}, 1},
		{"pg_liveness_lease_epoch", []string{"lease", "mail"}, 7},
		{"pg_liveness_lease_holder_info", []string{"lease", "mail", "holder_host", "node-1"}, 1},
	})
}

// In a SQL_ASCII database a lease name or holder can hold any bytes. The bad bytes are
// replaced in the label; no other lease is lost. Names that become the same label (other
// bad bytes, or U+FFFD itself, after or before them by urgency) are exported once, the
// most urgent, and the others counted as duplicates.
func TestLeasesInvalidUTF8(t *testing.T) {
	ascii := pgtest.NewSQLASCIIDB(t)
	exec(t, ascii.ConnAs(t, "setup"), `CREATE TABLE leases (name text PRIMARY KEY, holder text, taken_at timestamptz, expires_at timestamptz);
		INSERT INTO leases VALUES (E'caf\xe9', E'h\xf6st:1', now(), now() + interval '30 s'),
		                          (E'caf\xef\xbf\xbd', 'node-2:1', now(), now() + interval '60 s'),
		                          (E'caf\xe8', 'node-3:1', now(), now() + interval '90 s'),
		                          (E'x\xef\xbf\xbd', 'node-4:1', now(), now() + interval '10 s'),
		                          (E'x\xff', 'node-5:1', now(), now() + interval '20 s'),
		                          ('good', 'node-1:1', now(), now() + interval '60 s')`)
	e := newExporter(t, leasesOnly("public.leases", 10), exporterPool(t, ascii.DSN, 1, nil), nil, nil)
	got := scrapeFamilies(t, e)
	checkSamples(t, got, []sample{
		{"pg_liveness_scrape_collector_success", []string{"collector", "leases"}, 1},
		{"pg_liveness_lease_held", []string{"lease", "good"}, 1},
		{"pg_liveness_lease_held", []string{"lease", "caf\uFFFD"}, 1},
		{"pg_liveness_lease_holder_info", []string{"lease", "caf\uFFFD", "holder_host", "h\uFFFDst"}, 1},
		{"pg_liveness_lease_holder_info", []string{"lease", "x\uFFFD", "holder_host", "node-4"}, 1},
		{"pg_liveness_lease_row_anomalies", []string{"kind", "invalid_utf8"}, 1},
		{"pg_liveness_lease_row_anomalies", []string{"kind", "duplicate_name"}, 3},
	})
	if n := len(got["pg_liveness_lease_held"].GetMetric()); n != 3 {
		t.Errorf("%d lease_held series, want 3 (good, caf\uFFFD, x\uFFFD)", n)
	}
}

// Beyond --collector.leases.max-series, the most urgent leases are exported one by one
// and the rest together as lease="other", with how many were folded.
func TestLeasesCapFoldsIntoOther(t *testing.T) {
	db := pgtest.NewDB(t)
	db.Exec(t, `CREATE TABLE many (name text PRIMARY KEY, holder text, taken_at timestamptz, expires_at timestamptz);
		INSERT INTO many SELECT 'job-' || lpad(i::text, 3, '0'), 'node:1', now() - make_interval(secs => i),
		                        now() + make_interval(secs => i - 5)
		  FROM generate_series(1, 50) i`)
	e := newExporter(t, leasesOnly("many", 10), exporterPool(t, db.DSN, 1, nil), nil, nil)
	got := scrapeFamilies(t, e)
	if n := len(got["pg_liveness_lease_held"].GetMetric()); n != 11 {
		t.Errorf("%d pg_liveness_lease_held series, want 10 leases and other", n)
	}
	// Expired ones (job-001 … job-004) are the most urgent and kept.
	for i := 1; i <= 10; i++ {
		if v := value(got, "pg_liveness_lease_held", "lease", fmt.Sprintf("job-%03d", i)); v != v {
			t.Errorf("job-%03d not exported", i)
		}
	}
	checkSamples(t, got, []sample{
		{"pg_liveness_leases_folded", nil, 40},
		{"pg_liveness_lease_held", []string{"lease", "other"}, 40},
	})
	if v := value(got, "pg_liveness_lease_expires_in_seconds", "lease", "other"); !(v > 4 && v < 7) {
		t.Errorf("other expires in %v s, want the soonest folded lease's ~6 s", v)
	}
}

// The statement reads a foreign table's optional columns directly, rendered for the
// table's shape; when it changes (an epoch column added, then dropped, then the unique
// index on name), the same scrape notices and reads the table as it is now.
func TestLeasesFollowTheTablesColumns(t *testing.T) {
	db := pgtest.NewDB(t)
	db.Exec(t, `CREATE TABLE jobs (name text PRIMARY KEY, holder text, taken_at timestamptz, expires_at timestamptz);
		INSERT INTO jobs VALUES ('mail', 'node-1:1', now(), now() + interval '60 s')`)
	qc := &queryCounter{}
	e := newExporter(t, leasesOnly("jobs", 10), exporterPool(t, db.DSN, 1, qc), nil, nil)
	epoch := func() float64 { return value(scrapeFamilies(t, e), "pg_liveness_lease_epoch", "lease", "mail") }
	if v := epoch(); v == v {
		t.Fatalf("epoch %v without an epoch column", v)
	}
	before := qc.n.Load()
	if v := epoch(); v == v || qc.n.Load()-before != 1 {
		t.Fatalf("epoch %v, %d statements in a scrape with unchanged columns; want none and 1", v, qc.n.Load()-before)
	}
	db.Exec(t, `ALTER TABLE jobs ADD COLUMN epoch bigint, ADD COLUMN holder_instance_id uuid; UPDATE jobs SET epoch = 41,
		holder_instance_id = '00000000-0000-0000-0000-000000000041'`)
	got := scrapeFamilies(t, e)
	if v := value(got, "pg_liveness_lease_epoch", "lease", "mail"); v != 41 {
		t.Errorf("epoch %v once the column exists, want 41", v)
	}
	if v := value(got, "pg_liveness_lease_holder_info", "lease", "mail",
		"holder_instance_id", "00000000-0000-0000-0000-000000000041", "holder_host", "node-1"); v != 1 {
		t.Errorf("holder_info with the instance id = %v, want 1", v)
	}
	db.Exec(t, `ALTER TABLE jobs DROP COLUMN epoch`)
	got = scrapeFamilies(t, e)
	if v := value(got, "pg_liveness_scrape_collector_success", "collector", "leases"); v != 1 {
		t.Errorf("success %v after the epoch column was dropped, want 1", v)
	}
	if v := value(got, "pg_liveness_lease_epoch", "lease", "mail"); v == v {
		t.Errorf("epoch %v after the column was dropped, want none", v)
	}
	// Without the primary key, names may repeat: the row expiring last is exported.
	db.Exec(t, `ALTER TABLE jobs DROP CONSTRAINT jobs_pkey;
		INSERT INTO jobs (name, holder, taken_at, expires_at) VALUES ('mail', 'node-2:2', now(), now() + interval '600 s')`)
	got = scrapeFamilies(t, e)
	if v := value(got, "pg_liveness_lease_row_anomalies", "kind", "duplicate_name"); v != 1 {
		t.Errorf("duplicate_name %v without a unique name, want 1", v)
	}
	if v := value(got, "pg_liveness_lease_expires_in_seconds", "lease", "mail"); !(v > 500) {
		t.Errorf("mail expires in %v s, want the later row's ~600 s", v)
	}
}
