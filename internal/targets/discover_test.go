package targets

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logbuf"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

// max_databases bounds the databases watched: of those holding the table, the first by
// name, the rest left out with one warning; a database without the table or a template
// is never watched. The maintenance database's pool is kept although it has none: every
// scrape's shared read of the server's pg_locks runs on it, and a round that closed it
// failed a read in flight.
func TestDiscoveryKeepsAtMostMaxDatabases(t *testing.T) {
	srv := pgtest.NewServer(t)
	var with []string
	for i := range 4 {
		db := pgtest.NewDBOn(t, srv)
		if i < 3 {
			db.Exec(t, `CREATE SCHEMA liveness; CREATE TABLE liveness.instances (instance_id uuid)`)
			with = append(with, db.Name)
		}
	}
	slices.Sort(with)
	dir := t.TempDir()
	write(t, dir, "pw", srv.Password+"\n")
	cfg, err := load(t, dir, fmt.Sprintf(`
credentials:
  c: {user: %s, password_file: DIR/pw, sslmode: disable}
discover:
  s: {host: 127.0.0.1, port: %d, credentials: c, max_databases: 2}
`, pgtest.Superuser, srv.Port))
	if err != nil {
		t.Fatal(err)
	}
	pools, err := NewPools(cfg, Options{MaxConns: 4, MaxConnsPerTarget: 1, IdleTimeout: time.Minute, ConnectTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pools.Close)
	var logs logbuf.Buffer
	d := NewDiscovery(pools, nil, 10*time.Second, slog.New(slog.NewTextHandler(&logs, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	_, next := d.Rounds()
	go func() { defer close(done); d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-next:
	case <-time.After(30 * time.Second):
		t.Fatal("no discovery round ended within 30s")
	}
	got := d.Found()
	want := []Database{{"s", with[0]}, {"s", with[1]}}
	if !slices.Equal(got, want) {
		t.Fatalf("found %v, want %v", got, want)
	}
	if !strings.Contains(logs.String(), "more databases hold the table than max_databases") || !strings.Contains(logs.String(), "left_out=1") {
		t.Errorf("no warning of the database left out:\n%s", logs.String())
	}
	pools.mu.Lock()
	_, kept := pools.open[discoveredKey("s", "postgres")]
	pools.mu.Unlock()
	if !kept {
		t.Errorf("the maintenance database's pool, which the shared read of pg_locks uses, was closed by the round")
	}
}
