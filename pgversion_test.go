package main

import (
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

// On a real PostgreSQL 13, outside the supported range, the exporter says so in one line
// and keeps serving what it can: pg_liveness_up, the advisory-locks and leases
// collectors. (Its migrations need 14, so the agent does not join, and the instances and
// statements collectors fail, which their success metrics report.)
func TestUnsupportedMajorIsOneLineAndServes(t *testing.T) {
	srv := pgtest.NewServer(t, pgtest.WithMajor(13))
	db := pgtest.NewDBOn(t, srv)
	db.Exec(t, `CREATE EXTENSION pg_stat_statements`)
	p := startExporter(t, []string{"DATA_SOURCE_NAME=" + db.DSN})
	p.waitFor(t, `(?m)^pg_liveness_scrape_collector_success\{collector="advisory_locks"\} 1$`, 30*time.Second)
	body := p.waitFor(t, `(?m)^pg_liveness_up 1$`, 30*time.Second)
	for _, want := range []string{
		`pg_liveness_scrape_collector_success{collector="leases"} 1`,
		`pg_liveness_scrape_collector_success{collector="statements"} 0`,
		`pg_liveness_agent_joined 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	p.scrape(t) // more connections and scrapes: still one line
	if n := strings.Count(p.Logs(), "is not supported: the oldest supported major is 14"); n != 1 {
		t.Errorf("%d lines name the unsupported major, want 1", n)
	}
	if !strings.Contains(p.Logs(), "server_version=13.") {
		t.Errorf("the line does not name the server's version")
	}
}
