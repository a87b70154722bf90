package collector

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	dto "github.com/prometheus/client_model/go"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// Exporters of one server's databases share one read of its locks per scrape: three
// exporters whose Config.Locks ask ScrapeOnce for the same key, scraped together by
// HandlerOf, read once per scrape, and each judges its instance alive from it. When the
// shared read fails, each collector reads pg_locks itself, and the scrape succeeds.
func TestServerLocksAreReadOncePerScrape(t *testing.T) {
	db := testdb.Migrated(t)
	pool := exporterPool(t, db.DSN, 4, nil)
	ctx := testutil.Context(t, 30*time.Second)
	id := uuid.New()
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, holds_alive_lock, last_heartbeat_at) VALUES ($1, 'svc', true, now())`, id)
	if _, err := db.Conn(t).Exec(ctx, `SELECT liveness.claim_instance_alive_lock($1)`, id); err != nil {
		t.Fatal(err)
	}
	var reads atomic.Int64
	var fail atomic.Bool
	key := new(int)
	locks := func(ctx context.Context) (*DatabaseLocks, error) {
		all, err := ScrapeOnce(ctx, key, func(ctx context.Context) (any, error) {
			reads.Add(1)
			if fail.Load() {
				return nil, errors.New("the server's read failed")
			}
			return ReadServerLocks(ctx, pool, []string{db.Name})
		})
		if err != nil {
			return nil, err
		}
		return all.(map[string]*DatabaseLocks)[db.Name], nil
	}
	cfg := DefaultConfig()
	cfg.Locks = locks
	var exporters []*Exporter
	for _, name := range []string{"a", "b", "c"} {
		exporters = append(exporters, newExporter(t, cfg, pool, nil, discard()).Labelled("database", name))
	}
	h := HandlerOf(cfg, nil, func() []*Exporter { return exporters }, discard())
	scrape := func() map[string]*dto.MetricFamily {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("scrape: %d %s", rec.Code, rec.Body)
		}
		return parseText(t, rec.Body)
	}
	for round := int64(1); round <= 3; round++ {
		fail.Store(round == 3)
		mfs := scrape()
		if reads.Load() != round {
			t.Fatalf("scrape %d: the server's locks read %d times in all, want once per scrape", round, reads.Load())
		}
		for _, name := range []string{"a", "b", "c"} {
			if v := value(mfs, "pg_liveness_instances", "database", name, "service", "svc", "state", "alive"); v != 1 {
				t.Errorf("scrape %d (shared read failing: %v), database %s: %v alive, want 1", round, fail.Load(), name, v)
			}
			if v := value(mfs, "pg_liveness_advisory_locks", "database", name, "kind", "alive_lock", "granted", "true"); v != 1 {
				t.Errorf("scrape %d (shared read failing: %v), database %s: %v alive locks, want 1", round, fail.Load(), name, v)
			}
			if v := value(mfs, "pg_liveness_up", "database", name); v != 1 {
				t.Errorf("scrape %d, database %s: up %v", round, name, v)
			}
		}
	}
}
