// Package discovery serves the databases that discovery within a server finds
// (--config.file's discover entries): every database of a server that holds the source's
// instances table, found at start and re-checked by package targets, is scraped with
// /metrics (Databases.Handler), each database's samples labelled
// database="ENTRY/DATNAME", on its own small pool under --probe.max-conns, and all of
// them together under --discover.max-series (DefaultMaxSeries). Each has its status page
// (Databases.StatusPage) and a line on /targets (Databases.Listed); the re-checks' loop
// runs while the configuration in force has discover entries (Start, Sync, Stop); and
// Databases.Metrics are the pg_liveness_exporter_discover_* gauges.
//
// pg_locks is read once per scrape and server, not once per database: the first of a
// server's databases to need it in a scrape reads the advisory locks of all of them
// (collector.ReadServerLocks, on the entry's maintenance database's pool, under the
// scrape's deadline) and each takes its part (collector.Config.Locks). When that read
// fails, each database reads pg_locks itself for that scrape, as a single database does:
// a server that answers its databases' own reads is never reported down for it.
package discovery

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/collector"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	statuspage "github.com/pg-liveness/pg_liveness_exporter/internal/status"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/targets"
)

// discoverTimeout bounds each statement of a discovery round (listing a server's
// databases, checking one): a round never waits on a hung server for longer.
const discoverTimeout = 10 * time.Second

// Databases keeps the collectors and the page of each database that discovery found.
type Databases struct {
	discovery  *targets.Discovery
	pools      *targets.Pools
	collectors collector.Config // Source set; no Status: a discovered schema is not this binary's
	logger     *slog.Logger

	limit *collector.SeriesLimit // --discover.max-series, over every discovered database's answer
	loop  discoveryLoop

	mu      sync.Mutex
	built   map[targets.Database]*discoveredDB
	servers map[string]*serverLocks // by entry
}

// serverLocks reads one discover entry's server's advisory locks once per scrape.
type serverLocks struct {
	d      *Databases
	server string
	failed logging.Repeats // the shared read's failure, logged when it starts or changes
}

// of is database db's part of its server's locks, read once per scrape.
func (s *serverLocks) of(db string) collector.LocksSource {
	return func(ctx context.Context) (*collector.DatabaseLocks, error) {
		all, err := collector.ScrapeOnce(ctx, s, s.read)
		if err != nil {
			return nil, err
		}
		if part := all.(map[string]*collector.DatabaseLocks)[db]; part != nil {
			return part, nil
		}
		return &collector.DatabaseLocks{}, nil // no lock and no backend
	}
}

// read reads the locks of the server's databases found now, on its maintenance
// database's pool.
func (s *serverLocks) read(ctx context.Context) (any, error) {
	all, err := s.readLocks(ctx)
	if err != nil {
		s.failed.Log(s.d.logger, slog.LevelWarn, err.Error(), "cannot read the server's advisory locks once for its databases; "+
			"each reads pg_locks itself", "server", s.server, "err", err)
		return nil, err
	}
	s.failed.Clear(s.d.logger, "the server's advisory locks are read once for its databases again", "server", s.server)
	return all, nil
}

func (s *serverLocks) readLocks(ctx context.Context) (map[string]*collector.DatabaseLocks, error) {
	var maintenance string
	for _, srv := range s.d.pools.Config().Discover() {
		if srv.Name == s.server {
			maintenance = srv.Maintenance
		}
	}
	pool, ok, err := s.d.pools.DiscoveredPool(s.server, maintenance)
	if !ok || err != nil {
		return nil, cmp.Or(err, errors.New("the entry was removed"))
	}
	var names []string
	for _, db := range s.d.discovery.Found() {
		if db.Server == s.server {
			names = append(names, db.Name)
		}
	}
	return collector.ReadServerLocks(ctx, pool, names)
}

// serverOf returns entry's serverLocks. d.mu is held.
func (d *Databases) serverOf(entry string) *serverLocks {
	s := d.servers[entry]
	if s == nil {
		s = &serverLocks{d: d, server: entry}
		d.servers[entry] = s
	}
	return s
}

type discoveredDB struct {
	pool     *pgxpool.Pool // a replaced pool (the entry's connection changed) rebuilds the exporter and the page
	exporter *collector.Exporter
	page     *statuspage.Handler // /targets/ENTRY/DATNAME/status, on the same pool
}

// New returns the discovery of pools' discover entries, which a reload may add, change
// or remove (none yet is no discovery yet), read with source, and exported with
// collectors' settings under maxSeries. When there are some, its collectors are built
// once now, on a pool that does not connect, so that a bad collector setting is refused
// at start-up (the error names collector.Config's field).
func New(pools *targets.Pools, collectors collector.Config, source *store.Source, maxSeries int, logger *slog.Logger) (*Databases, error) {
	collectors.Source, collectors.Status = source, nil
	d := &Databases{discovery: targets.NewDiscovery(pools, source, discoverTimeout, logger.With("component", "discovery")),
		pools: pools, collectors: collectors, logger: logger, built: map[targets.Database]*discoveredDB{},
		servers: map[string]*serverLocks{},
		limit:   collector.NewSeriesLimit(maxSeries, logger.With("component", "collector"))}
	entries := pools.Config().Discover()
	if len(entries) == 0 {
		return d, nil
	}
	pool, _, err := pools.DiscoveredPool(entries[0].Name, entries[0].Maintenance)
	if err != nil {
		return nil, err
	}
	if _, err := collector.New(collectors, pool, nil, logger); err != nil {
		return nil, err
	}
	return d, nil
}

// exporters returns the exporters of the databases found now, each labelled with its
// database, building those new since the last call and forgetting those gone.
func (d *Databases) exporters() []*collector.Exporter {
	found := d.discovery.Found()
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*collector.Exporter, 0, len(found))
	keep := make(map[targets.Database]bool, len(found))
	for _, db := range found {
		b, err := d.buildLocked(db)
		if b == nil || err != nil {
			if err != nil {
				d.logger.Error("cannot open a discovered database's pool or build its collectors", "database", db.Label(), "err", err)
			}
			continue
		}
		keep[db] = true
		out = append(out, b.exporter)
	}
	for db := range d.built {
		if !keep[db] {
			delete(d.built, db)
		}
	}
	for entry := range d.servers { // an entry a reload removed
		if !slices.ContainsFunc(d.pools.Config().Discover(), func(s targets.Server) bool { return s.Name == entry }) {
			delete(d.servers, entry)
		}
	}
	return out
}

// buildLocked returns db's collectors and page, built on its pool (again when the pool
// was replaced); nil when its entry is gone. d.mu is held.
func (d *Databases) buildLocked(db targets.Database) (*discoveredDB, error) {
	pool, ok, err := d.pools.DiscoveredPool(db.Server, db.Name)
	if !ok || err != nil {
		return nil, err
	}
	if b := d.built[db]; b != nil && b.pool == pool {
		return b, nil
	}
	logger := d.logger.With("database", db.Label())
	cfg := d.collectors
	cfg.Locks = d.serverOf(db.Server).of(db.Name)
	exp, err := collector.New(cfg, pool, nil, logger.With("component", "collector"))
	if err != nil { // the same configuration passed at start-up
		return nil, err
	}
	page, err := statuspage.New(statuspage.Config{DB: pool, Source: d.collectors.Source, Logger: logger.With("component", "status")})
	if err != nil {
		return nil, err
	}
	turn := func(ctx context.Context) (context.Context, func(), error) {
		return d.pools.Turn(ctx, db.Server, d.discovery.Count(db.Server))
	}
	b := &discoveredDB{pool: pool, exporter: exp.Labelled("database", db.Label()).WithTurn(turn), page: page}
	d.built[db] = b
	return b, nil
}
