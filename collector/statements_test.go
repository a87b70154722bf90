package collector

import (
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

func statementsOnly() Config {
	cfg := DefaultConfig()
	cfg.Instances.Enabled, cfg.Leases.Enabled, cfg.AdvisoryLocks.Enabled, cfg.Agent.Enabled = false, false, false, false
	cfg.History.Enabled = false
	return cfg
}

// TestStatementsMissingExtension: without pg_stat_statements the collector succeeds with
// available 0 and says so once across scrapes; CREATE EXTENSION is seen on the next
// scrape.
func TestStatementsMissingExtension(t *testing.T) {
	db := pgtest.NewDB(t)
	logger, logs := logbuf.Logger()
	e := newExporter(t, statementsOnly(), exporterPool(t, db.DSN, 1, nil), nil, logger)
	for i := range 3 {
		mfs := scrapeFamilies(t, e)
		if got := value(mfs, "pg_liveness_stat_statements_available"); got != 0 {
			t.Errorf("scrape %d: available = %v, want 0", i, got)
		}
		if got := value(mfs, "pg_liveness_scrape_collector_success", "collector", NameStatements); got != 1 {
			t.Errorf("scrape %d: success = %v, want 1", i, got)
		}
		if got := value(mfs, "pg_liveness_up"); got != 1 {
			t.Errorf("scrape %d: up = %v, want 1 (the lookup got an answer)", i, got)
		}
		if _, ok := mfs["pg_liveness_statement_calls_total"]; ok {
			t.Errorf("scrape %d: statement counters exported without pg_stat_statements", i)
		}
	}
	if n := strings.Count(logs.String(), `level=WARN msg="statement metrics are off`); n != 1 {
		t.Errorf("logged %d times across 3 scrapes, want once:\n%s", n, logs)
	}

	db.Exec(t, `CREATE SCHEMA elsewhere; CREATE EXTENSION pg_stat_statements SCHEMA elsewhere`)
	db.Exec(t, `SELECT /* pg_liveness:cleanup */ 1`)
	mfs := scrapeFamilies(t, e)
	if got := value(mfs, "pg_liveness_stat_statements_available"); got != 1 {
		t.Fatalf("available = %v after CREATE EXTENSION, want 1", got)
	}
	if got := value(mfs, "pg_liveness_statement_calls_total", "statement", "cleanup"); got != 1 {
		t.Errorf("calls{cleanup} = %v, want 1", got)
	}
	if n := strings.Count(logs.String(), "pg_stat_statements is available again"); n != 1 {
		t.Errorf("recovery logged %d times, want once:\n%s", n, logs)
	}

	// Dropped again: back to 0, logged once more.
	db.Exec(t, `DROP EXTENSION pg_stat_statements`)
	for range 2 {
		if got := value(scrapeFamilies(t, e), "pg_liveness_stat_statements_available"); got != 0 {
			t.Errorf("available = %v after DROP EXTENSION, want 0", got)
		}
	}
	if n := strings.Count(logs.String(), `level=WARN msg="statement metrics are off`); n != 2 {
		t.Errorf("logged %d times in all, want twice (missing, then dropped):\n%s", n, logs)
	}
}

// TestStatementsRoundTrips: in steady state one statement per scrape, without texts and
// with only the matching entries' rows; a new queryid costs two more, once (all entries,
// then the new one's text).
func TestStatementsRoundTrips(t *testing.T) {
	db := pgtest.NewDB(t)
	db.Exec(t, `CREATE EXTENSION pg_stat_statements`)
	// 200 entries that match no pattern.
	db.Exec(t, `CREATE TABLE wide AS SELECT 1 AS a, 2 AS b`)
	db.Exec(t, `DO $$ BEGIN FOR n IN 1..200 LOOP EXECUTE format('SELECT a + %s FROM wide', n); END LOOP; END $$`)
	qc := &queryCounter{}
	e := newExporter(t, statementsOnly(), exporterPool(t, db.DSN, 1, qc), nil, nil)

	// The first scrapes meet the exporter's own statements as new entries.
	for range 3 {
		scrapeFamilies(t, e)
	}
	rows := qc.rows.Load()
	scrapeFamilies(t, e)
	if n := qc.rows.Load() - rows; n > 2 {
		t.Errorf("steady state: %d rows per scrape, want at most 2 (no matching entry yet, and the summary)", n)
	}
	perScrape := func() int64 {
		before := qc.n.Load()
		scrapeFamilies(t, e)
		return qc.n.Load() - before
	}
	if n := perScrape(); n != 1 {
		t.Errorf("steady state: %d statements per scrape, want 1", n)
	}
	db.Exec(t, `DELETE /* pg_liveness:lease_release */ FROM pg_class WHERE false`)
	if n := perScrape(); n != 3 {
		t.Errorf("after a new statement: %d statements, want 3 (matching counters, all counters, then texts of the new queryid)", n)
	}
	if n := perScrape(); n != 1 {
		t.Errorf("after classifying it: %d statements per scrape, want 1", n)
	}
	if got := value(scrapeFamilies(t, e), "pg_liveness_statement_calls_total", "statement", "lease_release"); got != 1 {
		t.Errorf("calls{lease_release} = %v, want 1", got)
	}
}

// TestStatementsNeverGoBack: counters survive the eviction or reset of the entries they
// were summed from, and keep counting afterwards.
func TestStatementsNeverGoBack(t *testing.T) {
	db := pgtest.NewDB(t)
	db.Exec(t, `CREATE EXTENSION pg_stat_statements`)
	e := newExporter(t, statementsOnly(), exporterPool(t, db.DSN, 1, nil), nil, nil)
	calls := func() float64 {
		return value(scrapeFamilies(t, e), "pg_liveness_statement_calls_total", "statement", "heartbeat")
	}
	beat := func(n int) {
		for range n {
			// Two shapes, two entries for the one name.
			db.Exec(t, `SELECT /* pg_liveness:heartbeat */ 1 WHERE $1::int > 0`, 1)
			db.Exec(t, `SELECT /* pg_liveness:heartbeat */ 1, 2 WHERE $1::int > 0`, 1)
		}
	}
	beat(3)
	if got := calls(); got != 6 {
		t.Fatalf("calls = %v, want 6", got)
	}
	// Evict one of the two entries: the sum in pg_stat_statements drops, ours must not.
	db.Exec(t, `SELECT pg_stat_statements_reset(0, 0, queryid) FROM pg_stat_statements WHERE query LIKE '%SELECT 1, 2%'`)
	if got := calls(); got != 6 {
		t.Errorf("calls = %v after an entry went away, want still 6", got)
	}
	beat(1)
	if got := calls(); got != 8 {
		t.Errorf("calls = %v after 2 more, want 8", got)
	}
	db.Exec(t, `SELECT pg_stat_statements_reset()`)
	beat(1)
	if got := calls(); got != 10 {
		t.Errorf("calls = %v after a reset and 2 more, want 10", got)
	}
	// Another database's statements are not this one's.
	other := pgtest.NewDB(t)
	for range 3 {
		other.Exec(t, `SELECT /* pg_liveness:heartbeat */ 1 WHERE $1::int > 0`, 1)
	}
	if got := calls(); got != 10 {
		t.Errorf("calls = %v after heartbeats in another database, want still 10", got)
	}
}

// TestStatementsCacheBound: a cache smaller than the entries still classifies them all.
func TestStatementsCacheBound(t *testing.T) {
	db := pgtest.NewDB(t)
	db.Exec(t, `CREATE EXTENSION pg_stat_statements`)
	cfg := statementsOnly()
	cfg.Statements.CacheSize = 2
	logger, logs := logbuf.Logger()
	e := newExporter(t, cfg, exporterPool(t, db.DSN, 1, nil), nil, logger)
	db.Exec(t, `SELECT /* pg_liveness:heartbeat */ 1 WHERE $1::int > 0`, 1)
	db.Exec(t, `SELECT /* pg_liveness:heartbeat */ 1, 2 WHERE $1::int > 0`, 1)
	db.Exec(t, `SELECT /* pg_liveness:heartbeat */ 1, 2, 3 WHERE $1::int > 0`, 1)
	for range 3 {
		if got := value(scrapeFamilies(t, e), "pg_liveness_statement_calls_total", "statement", "heartbeat"); got != 3 {
			t.Errorf("calls = %v with a cache of 2, want 3", got)
		}
	}
	sc := e.collectors[0].c.(*statementsCollector)
	if len(sc.class.ids) > 2 {
		t.Errorf("cache holds %d ids, want at most 2", len(sc.class.ids))
	}
	if n := strings.Count(logs.String(), `level=WARN msg="more pg_stat_statements entries than --collector.statements.cache-size`); n != 1 {
		t.Errorf("cache too small logged %d times, want once", n)
	}
}

// The classification cache answers as a map would, through additions in batches and
// retains, whatever the ids' order (pg_stat_statements' queryids are signed).
func TestClassCacheIsAMap(t *testing.T) {
	var c classCache
	model := map[int64]int{}
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		found := map[int64]int{}
		for range r.IntN(40) {
			id := r.Int64N(200) - 100
			if _, ok := model[id]; !ok {
				found[id] = r.IntN(5) - 1
			}
		}
		c.add(found)
		maps.Copy(model, found)
		if round%7 == 6 {
			keep := map[int64]bool{}
			for id := range model {
				if r.IntN(2) == 0 {
					keep[id] = true
				} else {
					delete(model, id)
				}
			}
			c.retain(keep)
		}
		if len(c.ids) != len(model) || !slices.IsSorted(c.ids) {
			t.Fatalf("round %d: %d ids (sorted %v), want %d", round, len(c.ids), slices.IsSorted(c.ids), len(model))
		}
		for id := int64(-101); id <= 100; id++ {
			got, ok := c.get(id)
			want, wok := model[id]
			if ok != wok || got != want {
				t.Fatalf("round %d: get(%d) = %d, %v; want %d, %v", round, id, got, ok, want, wok)
			}
		}
	}
}
