package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

// A wrong password is not retried on every scrape: with 10 scrapers for 6 seconds the
// server sees a handful of failed logins (one attempt shared by concurrent scrapes, then
// a doubling backoff), and /metrics says why pg_liveness_up is 0.
func TestWrongPasswordBacksOff(t *testing.T) {
	srv := pgtest.NewServer(t)
	db := pgtest.NewDBOn(t, srv)
	db.Exec(t, `CREATE ROLE wrongpw LOGIN PASSWORD 'the-right-one'`)
	const pw = "not-the-password"
	dsn := fmt.Sprintf("host=127.0.0.1 port=%d user=wrongpw password=%s dbname=%s sslmode=disable", srv.Port, pw, db.Name)
	p := startExporter(t, []string{"DATA_SOURCE_NAME=" + dsn}, "--no-agent")
	p.waitFor(t, `(?m)^pg_liveness_database_down_reason\{reason="auth"\} 1$`, 30*time.Second)

	failedLogins := func() int {
		b, err := os.ReadFile(srv.LogFile())
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(b), `password authentication failed for user "wrongpw"`)
	}
	before := failedLogins()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	scrapes := 0
	for range 10 {
		wg.Go(func() {
			for ctx.Err() == nil {
				body := p.scrape(t)
				mu.Lock()
				if body != "" {
					scrapes++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	during := failedLogins() - before
	t.Logf("%d scrapes, %d failed logins", scrapes, during)
	if scrapes < 20 {
		t.Fatalf("only %d scrapes in 6 s: the test cannot tell", scrapes)
	}
	// Backoff 1 s, 2 s, 4 s, … : at most a few attempts in 6 s, whatever the scrape rate.
	if during > 6 {
		t.Errorf("%d failed logins during %d scrapes in 6 s, want at most 6", during, scrapes)
	}
	body := p.scrape(t)
	for _, want := range []string{"pg_liveness_up 0", `pg_liveness_database_down_reason{reason="auth"} 1`,
		`pg_liveness_database_down_reason{reason="connection"} 0`} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("no %q in /metrics", want)
		}
	}
	if strings.Contains(body, pw) || strings.Contains(p.Logs(), pw) {
		t.Error("the password was printed")
	}
}
