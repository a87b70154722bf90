package benchcompare

import (
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/collector"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/benchdata"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestBothExportersReportTheSameValues is the side-by-side value check of make
// bench-compare at a small scale, in make test, so that postgres_exporter's
// configuration cannot fall behind the exporter again (it did: every statement tag
// added later was exported by us only, and nothing noticed until the next timing run).
// Both run against one server with the data set's shape: 1,000 instances, 600 leases
// (beyond the 500 exported one by one), alive and other advisory locks held by idle
// backends, and a statement per tag (SeedStatements).
func TestBothExportersReportTheSameValues(t *testing.T) {
	start := time.Now()
	ours := BuildOurs(t, "../..")
	data := benchdata.BuildScale(t, benchdata.Scale{Instances: 1000, Services: 5, Leases: 600,
		Backends: 4, AliveLocks: 25, OtherLocks: 5, Statements: 200})
	series := Check(t, data, ours)
	// Every default pattern is compared: three counters each.
	statements := 3 * len(collector.DefaultStatementPatterns)
	if series < statements+100 {
		t.Fatalf("only %d series compared; want the %d statement counters and the rest", series, statements)
	}
	t.Logf("%d series agree, in %s", series, time.Since(start).Round(time.Millisecond))
}

// TestQueriesListEveryStatementPattern: the configuration carries the exporter's
// patterns in its order, translated to PostgreSQL's word boundary.
func TestQueriesListEveryStatementPattern(t *testing.T) {
	q, err := Queries()
	if err != nil {
		t.Fatal(err)
	}
	s := string(q)
	if strings.Contains(s, patternsPlaceholder) || strings.Contains(s, `\b`) {
		t.Fatalf("the placeholder or a Go word boundary is left:\n%s", s)
	}
	last := -1
	for i, p := range collector.DefaultStatementPatterns {
		name, _, _ := strings.Cut(p, "=")
		row := "'" + name + "', 'pg_liveness:" + name + `\y')`
		at := strings.Index(s, row)
		if at < 0 || at < last {
			t.Fatalf("pattern %d (%s) is missing or out of order: want %s", i+1, p, row)
		}
		last = at
	}
	for _, bad := range []string{`x=pg_liveness:x.*\b`, `x=(a|b)\b`, `x'=pg_liveness:x\b`} {
		if _, _, err := PostgresPattern(bad); err == nil {
			t.Errorf("%s: translated; want it refused", bad)
		}
	}
}
