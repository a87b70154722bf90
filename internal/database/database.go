// Package database opens the exporter's connection pool and applies migrations in the
// background. It never connects eagerly: an unreachable database must not stop the
// exporter from serving.
package database

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/internal/dsn"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// The binary's defaults for a PoolConfig, and the largest pool it takes.
const (
	DefaultMaxConns       = 2
	MaxMaxConns           = 1000
	DefaultConnectTimeout = 5 * time.Second
	// TCPHandshakeTimeout bounds a new connection's TCP handshake, within its
	// ConnectTimeout. A SYN sent while the network is cut is sent again by the kernel only
	// 1 s, then 3 s after it, so a pool whose dials began during an outage would keep its
	// callers waiting for seconds after the network healed (an agent's heartbeat among
	// them, which must prove life within a lock grace of that heal); a handshake that gave
	// up is dialled afresh by the next caller.
	TCPHandshakeTimeout = 500 * time.Millisecond
)

// PoolConfig is what the pool needs. NewPool refuses it with a *store.ConfigError that
// names the PoolConfig field, for the binary to map to its flag.
type PoolConfig struct {
	DSN             string
	MaxConns        int32         // 1 to MaxMaxConns
	ApplicationName string        // unless the DSN sets one
	ConnectTimeout  time.Duration // per connection attempt, unless the DSN sets one; above zero
	// Logger gets one warning when the server is a PostgreSQL major outside MinMajor to
	// MaxMajor (VersionWarning), read from the first connection (and again when a new
	// connection reports another version). Nil logs nothing.
	Logger *slog.Logger
	// MaxConnIdleTime closes a connection that sat idle this long (checked every half of
	// it); zero keeps pgxpool's default (30 minutes, checked every minute).
	MaxConnIdleTime time.Duration
	// WrapDial, when set, wraps the pool's dialer: a limit shared by several pools (the
	// /probe targets' cap on connections) counts every connection there. It is called
	// once for each connection: the dialer it returns dials that connection and then, while
	// it is open, the cancel requests pgx sends for it when it closes it.
	WrapDial func(pgconn.DialFunc) pgconn.DialFunc
}

// DSNSwitch replaces the DSN that the pool's new connections use.
type DSNSwitch struct {
	mu   sync.Mutex
	cfg  *pgx.ConnConfig
	gate *connectGate
}

// Set parses s and makes new connections use its hosts, user, password, database and TLS
// settings; open connections are kept. A refused login's backoff ends. The error quotes
// nothing of s.
func (w *DSNSwitch) Set(s string) error {
	if err := dsn.Validate(s); err != nil {
		return err
	}
	cfg, err := pgx.ParseConfig(s)
	if err != nil {
		return logging.RedactError(err)
	}
	w.mu.Lock()
	w.cfg = cfg
	w.mu.Unlock()
	w.gate.Reset()
	return nil
}

func (w *DSNSwitch) apply(cc *pgx.ConnConfig) {
	w.mu.Lock()
	n := w.cfg
	w.mu.Unlock()
	if n == nil {
		return
	}
	cc.Host, cc.Port, cc.Database, cc.User, cc.Password = n.Host, n.Port, n.Database, n.User, n.Password
	cc.TLSConfig, cc.Fallbacks = n.TLSConfig, n.Fallbacks
}

// NewPool builds a pool for short statements. Errors carry no password. Its connection
// attempts go through a gate: one at a time until one succeeds, and none for a growing
// while after PostgreSQL refused the login.
func NewPool(cfg PoolConfig) (*pgxpool.Pool, error) {
	pool, _, err := NewSwitchablePool(cfg)
	return pool, err
}

// NewSwitchablePool is NewPool, and returns the switch that changes its DSN (on a reload).
func NewSwitchablePool(cfg PoolConfig) (*pgxpool.Pool, *DSNSwitch, error) {
	if cfg.MaxConns < 1 || cfg.MaxConns > MaxMaxConns {
		return nil, nil, &store.ConfigError{Field: "PoolConfig.MaxConns", Reason: fmt.Sprintf("must be between 1 and %d, got %d", MaxMaxConns, cfg.MaxConns)}
	}
	if cfg.ConnectTimeout <= 0 {
		return nil, nil, &store.ConfigError{Field: "PoolConfig.ConnectTimeout", Reason: fmt.Sprintf("must be above zero, got %s", cfg.ConnectTimeout)}
	}
	pc, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, nil, logging.RedactError(err)
	}
	pc.MaxConns = cfg.MaxConns
	pc.MinConns = 0
	if _, ok := pc.ConnConfig.RuntimeParams["application_name"]; !ok && cfg.ApplicationName != "" {
		pc.ConnConfig.RuntimeParams["application_name"] = cfg.ApplicationName
	}
	if pc.ConnConfig.ConnectTimeout == 0 {
		pc.ConnConfig.ConnectTimeout = cfg.ConnectTimeout
	}
	// pgx gives every connection both caches, each a map sized for 512 statements (about
	// 25 KB), but a query uses only its exec mode's: nothing here passes a mode per
	// query, so the one the DSN's default_query_exec_mode does not use is left out.
	switch pc.ConnConfig.DefaultQueryExecMode {
	case pgx.QueryExecModeCacheStatement:
		pc.ConnConfig.DescriptionCacheCapacity = 0
	case pgx.QueryExecModeCacheDescribe:
		pc.ConnConfig.StatementCacheCapacity = 0
	}
	// Keep the client side of pool connections from hanging on a dead peer, and a new
	// connection's TCP handshake from waiting on the kernel's retransmissions.
	dial := (&net.Dialer{KeepAlive: 15 * time.Second, Timeout: min(pc.ConnConfig.ConnectTimeout, TCPHandshakeTimeout)}).DialContext
	pc.ConnConfig.DialFunc = dial
	if cfg.MaxConnIdleTime > 0 {
		pc.MaxConnIdleTime, pc.HealthCheckPeriod = cfg.MaxConnIdleTime, max(cfg.MaxConnIdleTime/2, 100*time.Millisecond)
	}
	gate := &connectGate{}
	pc.ConnConfig.Tracer = gateTracer{gate: gate, next: pc.ConnConfig.Tracer}
	sw := &DSNSwitch{gate: gate}
	pc.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
		sw.apply(cc)
		if cfg.WrapDial != nil { // cc is this connection's own copy
			cc.DialFunc = cfg.WrapDial(dial)
		}
		return gate.before(ctx)
	}
	// The server's version comes with every login (ParameterStatus): no statement is sent.
	versions := &versionWatch{logger: cfg.Logger}
	pc.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		versions.observe(c.PgConn().ParameterStatus("server_version"))
		return nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, nil, logging.RedactError(err)
	}
	return pool, sw, nil
}

// SchemaState is what PrepareSchema found out, for the exporter's metrics.
type SchemaState struct {
	Read       bool // the schema's state has been read at least once
	State      migrations.State
	Binary     int  // the newest migration version this binary knows
	Compatible bool // this binary can run against the schema
}

// SchemaStatus holds the latest SchemaState; it is safe for concurrent use.
type SchemaStatus struct {
	mu sync.Mutex
	s  SchemaState
}

// Get returns the latest state.
func (s *SchemaStatus) Get() SchemaState {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.s
	st.Binary = migrations.Latest()
	return st
}

func (s *SchemaStatus) set(st migrations.State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.s = SchemaState{Read: true, State: st, Binary: migrations.Latest(), Compatible: st.Serves(migrations.Latest())}
}

// BinaryStatus is the exporter's start-up as its collectors report it
// (store.StatusSource): the schema PrepareSchema found, and whether the agent started.
type BinaryStatus struct {
	Schema       SchemaStatus
	AgentStarted atomic.Bool
}

// Status is the start-up as it stands.
func (b *BinaryStatus) Status() store.BinaryStatus {
	s := b.Schema.Get()
	return store.BinaryStatus{
		SchemaRead: s.Read, SchemaVersion: s.State.Version, SchemaCompatibleFrom: s.State.CompatibleFrom,
		BinaryVersion: s.Binary, SchemaCompatible: s.Compatible, AgentStarted: b.AgentStarted.Load(),
	}
}

// ErrNotJoining wraps the reasons PrepareSchema gives up: retrying cannot help.
var ErrNotJoining = errors.New("the agent does not join the fleet")

// PrepareSchema makes sure this binary can run against schema, retrying with backoff and
// jitter only what can heal on its own (connections, a server starting or shutting down,
// a schema that an operator has still to migrate). It first reads the schema's state,
// which needs no privilege beyond reading schema_migrations; only when migrations are
// missing and apply is set does it apply them (which needs CREATE).
//
// It returns nil when the schema is current, or newer and still serving this binary; an
// error wrapping ErrNotJoining for what retrying cannot heal: a newer schema that no
// longer serves this binary (migrations.ErrDatabaseNewer too), a missing privilege, an
// invalid name; and the context's error when it ends first. status, if not nil, is
// updated each time the state is read.
func PrepareSchema(ctx context.Context, pool *pgxpool.Pool, schema string, apply bool, status *SchemaStatus, logger *slog.Logger) error {
	backoff := 500 * time.Millisecond
	var waiting logging.Repeats
	for {
		err := prepareOnce(ctx, pool, schema, apply, status, logger)
		if err == nil {
			waiting.Clear(logger, "schema ready", "schema", schema)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !Healable(err) {
			return fmt.Errorf("%w: %w", ErrNotJoining, logging.RedactError(err))
		}
		// A line when the reason changes, debug while it repeats.
		waiting.Log(logger, slog.LevelWarn, err.Error(), "schema not ready yet; retrying",
			"schema", schema, "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff + rand.N(backoff/2)):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

// errMigrationsPending is an old schema with --no-migrations.apply: an operator (or
// another exporter) may migrate it, so it is waited for.
var errMigrationsPending = errors.New("migrations pending")

func prepareOnce(ctx context.Context, pool *pgxpool.Pool, schema string, apply bool, status *SchemaStatus, logger *slog.Logger) error {
	attempt, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	st, err := migrations.ReadState(attempt, pool, schema)
	if err != nil {
		return err
	}
	if status != nil {
		status.set(st)
	}
	latest := migrations.Latest()
	switch {
	case !st.Serves(latest):
		return fmt.Errorf("%w: schema %q is at migration version %d and serves binaries from schema version %d on; this binary knows versions up to %d: upgrade pg_liveness_exporter",
			migrations.ErrDatabaseNewer, schema, st.Version, st.CompatibleFrom, latest)
	case st.Version >= latest:
		logger.Debug("schema is current", "schema", schema, "version", st.Version, "binary_version", latest)
		return nil
	case !apply:
		return fmt.Errorf("%w: schema %q is at migration version %d, this binary needs %d: apply the migrations with a role that may (or drop --no-migrations.apply)",
			errMigrationsPending, schema, st.Version, latest)
	}
	applied, err := migrations.Apply(attempt, pool, schema)
	if err != nil {
		return err
	}
	logger.Info("applied migrations", "schema", schema, "versions", applied)
	if st, err = migrations.ReadState(attempt, pool, schema); err == nil && status != nil {
		status.set(st)
	}
	return nil
}

// Healable reports whether err can go away without anyone changing the configuration,
// grants or schema: the connection failed or dropped, the server is starting, shutting
// down or out of resources, a lock or serialization conflict, a timeout, migrations that
// an operator still has to apply, or an authentication failure (passwords get rotated;
// the connection gate spaces those attempts). A missing privilege, an unknown object, a
// syntax or data error and a schema that no longer serves this binary are not.
func Healable(err error) bool {
	if errors.Is(err, migrations.ErrDatabaseNewer) {
		return false
	}
	if errors.Is(err, errMigrationsPending) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			strings.HasPrefix(pgErr.Code, "28"), // invalid authorization
			strings.HasPrefix(pgErr.Code, "40"), // serialization failure, deadlock
			strings.HasPrefix(pgErr.Code, "53"), // insufficient resources
			strings.HasPrefix(pgErr.Code, "57"), // operator intervention: shutdown, cannot connect now
			strings.HasPrefix(pgErr.Code, "58"), // system error
			pgErr.Code == "55P03",               // lock not available
			pgErr.Code == "3D000":               // the database does not exist (yet)
			return true
		}
		return false
	}
	// No answer from the server: dial errors, dropped connections, timeouts.
	return true
}
