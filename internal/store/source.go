package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// SourceKind is where instances are read from, as --source names it.
type SourceKind string

const (
	// SourceLiveness is this project's schema: instances, leases, the verdict functions.
	SourceLiveness SourceKind = "liveness"
	// SourceWhizbang is a Whizbang database as it is, read only.
	SourceWhizbang SourceKind = "whizbang"
)

// SourceConfig says where instances are read from. Its zero value is this project's
// schema, DefaultSchema, with the default timing for rows that record none. NewSource
// checks it once; the *Source it returns is what every reader of the exporter takes (the
// collectors, the status page), so that they read the same tables by the same rules.
// liveness.ReaderConfig holds the same fields under the same names (Schema, Fallback,
// and Whizbang as a *liveness.WhizbangSource, whose presence is SourceWhizbang), and
// liveness.NewReader builds its source from them with NewSourceNamed.
type SourceConfig struct {
	Kind SourceKind // "" is SourceLiveness

	// Schema is this project's schema ("" is DefaultSchema). With SourceWhizbang it is
	// still the schema a leases table without one is looked for in.
	Schema string

	// Fallback is the timing for rows of this project's schema that record none (rows
	// written by other software); an Agent's rows are judged by their own. Only its
	// StaleThreshold and DefinitiveDeadCutoff are used; zero takes DefaultStaleThreshold
	// and DefaultDefinitiveDeadCutoff.
	Fallback Timing

	// Whizbang is the Whizbang database read with SourceWhizbang.
	Whizbang Whizbang
}

// Whizbang is a Whizbang database, read as it is: its <Prefix>service_instances table and
// the session advisory lock each Whizbang instance takes, hashtext(LockKeyPrefix ||
// instance_id). Its instances are judged by the same rules as this project's own, and
// nothing is written: reading it needs only SELECT on the table and pg_read_all_stats.
// Whizbang records no timing in its rows, so it is given here. Zero fields take
// Whizbang's documented defaults (DefaultWhizbang). Whizbang's rows do not say whether
// the instance holds its lock, so there is no lock_lost state (and Timing.LockGrace must
// stay zero); two instances whose 32-bit keys collide are judged by their heartbeats
// while the key is held.
type Whizbang struct {
	Schema string // the table's schema
	// Prefix of the table's name; "" means Whizbang's default, wh_, unless NoPrefix.
	Prefix string
	// NoPrefix reads service_instances, for an install whose tables have no prefix.
	// Prefix must then be empty.
	NoPrefix bool
	// LockKeyPrefix: the lock key is hashtext(LockKeyPrefix || instance_id::text).
	LockKeyPrefix string
	// Timing is the cadence Whizbang's services run with: its HeartbeatInterval (while
	// the lock is not held), HeartbeatSlowInterval (while it is), and the StaleThreshold
	// and DefinitiveDeadCutoff to judge them by.
	Timing Timing
}

// Whizbang's documented defaults.
const (
	DefaultWhizbangSchema        = "public"
	DefaultWhizbangPrefix        = "wh_"
	DefaultWhizbangLockKeyPrefix = "wh_instance_alive:"
	// The fast heartbeat cadence, used while the alive lock is not held.
	DefaultWhizbangHeartbeatInterval = 30 * time.Second
	// The slow cadence, used while the lock is held.
	DefaultWhizbangHeartbeatSlowInterval = 60 * time.Second
	// Past this a heartbeat is stale: one fast beat after the slow cadence, so that an
	// instance that holds its lock and beats every minute is never called stale.
	DefaultWhizbangStaleThreshold = DefaultWhizbangHeartbeatSlowInterval + DefaultWhizbangHeartbeatInterval
	// Past this a lock holder that does not beat is dead (a zombie): Whizbang's
	// cleanup_stale_instances p_definitive_dead_cutoff, for OOM-killed pods whose
	// half-open session keeps the lock.
	DefaultWhizbangDefinitiveDeadCutoff = 5 * time.Minute
)

// DefaultWhizbang returns Whizbang's documented defaults, every field set.
func DefaultWhizbang() Whizbang {
	return Whizbang{
		Schema: DefaultWhizbangSchema, Prefix: DefaultWhizbangPrefix, LockKeyPrefix: DefaultWhizbangLockKeyPrefix,
		Timing: Timing{HeartbeatInterval: DefaultWhizbangHeartbeatInterval, HeartbeatSlowInterval: DefaultWhizbangHeartbeatSlowInterval,
			StaleThreshold: DefaultWhizbangStaleThreshold, DefinitiveDeadCutoff: DefaultWhizbangDefinitiveDeadCutoff},
	}
}

// withDefaults fills zero fields; NoPrefix empties the prefix.
func (w Whizbang) withDefaults() Whizbang {
	d := DefaultWhizbang()
	w.Schema = cmp.Or(w.Schema, d.Schema)
	if !w.NoPrefix {
		w.Prefix = cmp.Or(w.Prefix, d.Prefix)
	}
	w.LockKeyPrefix = cmp.Or(w.LockKeyPrefix, d.LockKeyPrefix)
	w.Timing.HeartbeatInterval = cmp.Or(w.Timing.HeartbeatInterval, d.Timing.HeartbeatInterval)
	w.Timing.HeartbeatSlowInterval = cmp.Or(w.Timing.HeartbeatSlowInterval, d.Timing.HeartbeatSlowInterval)
	w.Timing.StaleThreshold = cmp.Or(w.Timing.StaleThreshold, d.Timing.StaleThreshold)
	w.Timing.DefinitiveDeadCutoff = cmp.Or(w.Timing.DefinitiveDeadCutoff, d.Timing.DefinitiveDeadCutoff)
	return w
}

// table is the instances table.
func (w Whizbang) table() Table { return Table{Schema: w.Schema, Name: w.Prefix + "service_instances"} }

// Source is a checked SourceConfig, its defaults filled: what every statement that reads
// instances is rendered for. Build it once with NewSource and hand the same one to every
// reader. A nil *Source is this project's schema with every default.
type Source struct {
	cfg  SourceConfig
	vals values
}

// NewSource fills cfg's defaults and checks it. Errors are *ConfigError naming the
// SourceConfig field ("SourceConfig.Whizbang.Timing.StaleThreshold").
func NewSource(cfg SourceConfig) (*Source, error) { return NewSourceNamed(cfg, "SourceConfig") }

// NewSourceNamed is NewSource for a configuration a caller's own type holds under the
// same field names: errors name the field under config instead of SourceConfig
// ("ReaderConfig.Whizbang.Prefix", for liveness.ReaderConfig), in the field and in the
// reason, so that one check serves both.
func NewSourceNamed(cfg SourceConfig, config string) (*Source, error) {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: config + "." + field, Reason: fmt.Sprintf(format, args...)}
	}
	cfg.Kind = cmp.Or(cfg.Kind, SourceLiveness)
	cfg.Schema = cmp.Or(cfg.Schema, DefaultSchema)
	if err := ValidateSchemaName(cfg.Schema); err != nil {
		return nil, bad("Schema", "%s", err)
	}
	f := &cfg.Fallback
	f.StaleThreshold = cmp.Or(f.StaleThreshold, DefaultStaleThreshold)
	f.DefinitiveDeadCutoff = cmp.Or(f.DefinitiveDeadCutoff, DefaultDefinitiveDeadCutoff)
	switch {
	case f.StaleThreshold < 0:
		return nil, bad("Fallback.StaleThreshold", "(%s) must not be negative", f.StaleThreshold)
	case f.DefinitiveDeadCutoff <= f.StaleThreshold:
		return nil, bad("Fallback.DefinitiveDeadCutoff", "(%s) must be above %s.Fallback.StaleThreshold (%s)",
			f.DefinitiveDeadCutoff, config, f.StaleThreshold)
	}
	s := &Source{cfg: cfg}
	switch cfg.Kind {
	case SourceLiveness:
		s.vals = values{"schema": ident(cfg.Schema), "stale": arg(f.StaleThreshold), "dead": arg(f.DefinitiveDeadCutoff)}
	case SourceWhizbang:
		if cfg.Whizbang.NoPrefix && cfg.Whizbang.Prefix != "" {
			return nil, bad("Whizbang.NoPrefix", "is set with %s.Whizbang.Prefix %q; set one of them", config, cfg.Whizbang.Prefix)
		}
		w := cfg.Whizbang.withDefaults()
		if err := w.check(config, bad); err != nil {
			return nil, err
		}
		s.cfg.Whizbang = w
		t := w.Timing
		s.vals = values{
			"table": ident(w.table().identifier()...), "lock_key_prefix": arg(w.LockKeyPrefix),
			"stale": arg(t.StaleThreshold), "dead": arg(t.DefinitiveDeadCutoff),
			"heartbeat_interval_seconds": arg(t.HeartbeatInterval.Seconds()), "heartbeat_slow_interval_seconds": arg(t.HeartbeatSlowInterval.Seconds()),
			"stale_threshold_seconds": arg(t.StaleThreshold.Seconds()), "definitive_dead_cutoff_seconds": arg(t.DefinitiveDeadCutoff.Seconds()),
			"instance_state_rule": ownText(stateRule.Body),
		}
	default:
		return nil, bad("Kind", "%q is neither %s nor %s", cfg.Kind, SourceLiveness, SourceWhizbang)
	}
	return s, nil
}

// check refuses a Whizbang source that would misjudge its instances.
func (w Whizbang) check(config string, bad func(field, format string, args ...any) error) error {
	if err := ValidateIdentifier(SchemaName, w.Schema); err != nil {
		return bad("Whizbang.Schema", "%s", err)
	}
	// An empty prefix is no prefix: the table is service_instances.
	if err := ValidateIdentifier(TableName, w.table().Name); err != nil {
		return bad("Whizbang.Prefix", "makes the table name %q, which %s", w.table().Name, err)
	}
	t := w.Timing
	f := config + ".Whizbang.Timing."
	switch {
	case !utf8.ValidString(w.LockKeyPrefix) || strings.ContainsRune(w.LockKeyPrefix, 0):
		return bad("Whizbang.LockKeyPrefix", "must be valid UTF-8 without NUL bytes")
	case t.HeartbeatInterval < 0:
		return bad("Whizbang.Timing.HeartbeatInterval", "must be positive, got %s", t.HeartbeatInterval)
	case t.HeartbeatSlowInterval < t.HeartbeatInterval:
		return bad("Whizbang.Timing.HeartbeatSlowInterval", "(%s) must not be below %sHeartbeatInterval (%s)",
			t.HeartbeatSlowInterval, f, t.HeartbeatInterval)
	case t.StaleThreshold <= t.HeartbeatSlowInterval:
		return bad("Whizbang.Timing.StaleThreshold", "(%s) must be above %sHeartbeatSlowInterval (%s): an instance beating "+
			"at the slow cadence would be called stale", t.StaleThreshold, f, t.HeartbeatSlowInterval)
	case t.DefinitiveDeadCutoff <= t.StaleThreshold:
		return bad("Whizbang.Timing.DefinitiveDeadCutoff", "(%s) must be above %sStaleThreshold (%s)",
			t.DefinitiveDeadCutoff, f, t.StaleThreshold)
	case t.LockGrace != 0:
		return bad("Whizbang.Timing.LockGrace", "(%s) must be zero: Whizbang's rows do not record the lock, so there is no grace", t.LockGrace)
	}
	return nil
}

// orDefault is s, or this project's schema with every default for nil.
func (s *Source) orDefault() *Source {
	if s != nil {
		return s
	}
	d, _ := NewSource(SourceConfig{}) // the defaults pass every check
	return d
}

// Config returns the source's configuration with every default filled.
func (s *Source) Config() SourceConfig { return s.orDefault().cfg }

// Kind is SourceLiveness or SourceWhizbang.
func (s *Source) Kind() SourceKind { return s.orDefault().cfg.Kind }

// Schema is this project's schema (also with SourceWhizbang: see SourceConfig.Schema).
func (s *Source) Schema() string { return s.orDefault().cfg.Schema }

// HasLeases reports whether the source has this project's leases table (ours has;
// Whizbang's has none).
func (s *Source) HasLeases() bool { return s.Kind() == SourceLiveness }

// Table is the instances table as people write it, for messages: "liveness.instances",
// "public.wh_service_instances".
func (s *Source) Table() string {
	if s.Kind() == SourceWhizbang {
		return s.cfg.Whizbang.table().String()
	}
	return Table{Schema: s.Schema(), Name: "instances"}.String()
}

// ErrTableMissing: a Whizbang source's table does not exist, or the role may not read it.
var ErrTableMissing = errors.New("store: instances table not found")

// QueryRower runs a query that returns one row: *pgxpool.Pool, *pgx.Conn and pgx.Tx are
// ones.
type QueryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// CheckTable waits until the database answers, retrying every retry, and then reports
// whether a Whizbang source's table exists and the role may read it (an error wrapping
// ErrTableMissing when not). It is nil at once for this project's schema, whose
// migrations the binaries check instead. It returns ctx's error if ctx ends first.
func (s *Source) CheckTable(ctx context.Context, q QueryRower, retry time.Duration) error {
	if s.Kind() != SourceWhizbang {
		return nil
	}
	table := s.cfg.Whizbang.table()
	check := render(sections.section("whizbang_table", kindStatement), "", nil)
	for {
		attempt, cancel := context.WithTimeout(ctx, retry)
		var ok bool
		err := q.QueryRow(attempt, check.SQL, table.Quoted()).Scan(&ok)
		cancel()
		if err == nil {
			if !ok {
				return fmt.Errorf("%w: %s does not exist or the role may not SELECT from it", ErrTableMissing, table)
			}
			return nil
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) { // the server answered: retrying will not help
			return fmt.Errorf("store: check %s: %w", table, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(retry):
		}
	}
}

// SideBySideScript returns the script that lets a Whizbang fleet move to this project's
// schema with both fleets readable during the move (scripts/whizbang-side-by-side.sql is
// it for Whizbang's defaults). It creates three functions in schema, which must hold the
// migrations already: whizbang_instance_states, fleet_instance_states and
// is_fleet_instance_alive. It writes nothing to Whizbang's table, and the verdict is the
// one the readers of this source use, from the same fragment.
func (s *Source) SideBySideScript(schema string) (string, error) {
	if s.Kind() != SourceWhizbang {
		return "", errors.New("store: a side-by-side script is for a Whizbang source")
	}
	if err := ValidateSchemaName(schema); err != nil {
		return "", fmt.Errorf("store: the side-by-side script's schema %w", err)
	}
	w := s.cfg.Whizbang
	vals := values{
		"schema": ident(schema), "table": s.vals["table"], "instance_state_rule": s.vals["instance_state_rule"],
		"stale": use("side_by_side.stale"), "dead": use("side_by_side.dead"), "lock_key_prefix": use("side_by_side.lock_key_prefix"),
		"stale_default": literal(w.Timing.StaleThreshold.String()), "dead_default": literal(w.Timing.DefinitiveDeadCutoff.String()),
		"lock_key_prefix_default": literal(w.LockKeyPrefix),
	}
	return render(sections.section("whizbang_side_by_side", kindScript), string(SourceWhizbang), vals).SQL + "\n", nil
}
