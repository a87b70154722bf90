// Package whizbang reads a Whizbang database as it is: the <prefix>service_instances
// table its services write and the session advisory lock each of them takes, judged by
// the same rules as our own instances (the migrations' instance_state_rule, whose text is
// expanded here rather than copied).
//
// It never writes: everything it sends is a SELECT that needs only SELECT on the table
// and pg_read_all_stats, and it creates nothing in the database.
//
// Whizbang takes its alive lock as pg_try_advisory_lock(hashtext(<key prefix> ||
// instance_id::text)): a 32-bit key, sign-extended to a bigint, shown in pg_locks as an
// advisory lock with objsubid = 1. The match here is exact (this database, objsubid 1,
// exclusive mode). Two instance ids can share a 32-bit key; the lock then cannot say
// which of them holds it, so both are judged by their heartbeats alone and counted as
// sharing a key.
package whizbang

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pg-liveness/pg_liveness_exporter/internal/sqltag"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// Whizbang's documented defaults.
const (
	DefaultSchema        = "public"
	DefaultPrefix        = "wh_"
	DefaultLockKeyPrefix = "wh_instance_alive:"
	// The fast heartbeat cadence, used while the alive lock is not held.
	DefaultHeartbeatInterval = 30 * time.Second
	// The slow cadence, used while the lock is held.
	DefaultHeartbeatSlowInterval = 60 * time.Second
	// Past this a heartbeat is stale: one fast beat after the slow cadence, so that an
	// instance that holds its lock and beats every minute is never called stale.
	DefaultStaleThreshold = DefaultHeartbeatSlowInterval + DefaultHeartbeatInterval
	// Past this a lock holder that does not beat is dead (a zombie): Whizbang's
	// cleanup_stale_instances p_definitive_dead_cutoff, for OOM-killed pods whose
	// half-open session keeps the lock.
	DefaultDefinitiveDeadCutoff = 5 * time.Minute
)

// Source is a Whizbang database's table and lock key, and the timing its services run
// with (Whizbang does not store it).
type Source struct {
	Schema        string // the table's schema
	Prefix        string // the table is <Prefix>service_instances
	LockKeyPrefix string // the lock key is hashtext(LockKeyPrefix || instance_id::text)

	HeartbeatInterval     time.Duration
	HeartbeatSlowInterval time.Duration
	StaleThreshold        time.Duration
	DefinitiveDeadCutoff  time.Duration
}

// Defaults returns Whizbang's documented defaults.
func Defaults() Source {
	return Source{
		Schema: DefaultSchema, Prefix: DefaultPrefix, LockKeyPrefix: DefaultLockKeyPrefix,
		HeartbeatInterval: DefaultHeartbeatInterval, HeartbeatSlowInterval: DefaultHeartbeatSlowInterval,
		StaleThreshold: DefaultStaleThreshold, DefinitiveDeadCutoff: DefaultDefinitiveDeadCutoff,
	}
}

// FieldError is a Source field that is out of range. Field is the Source field's name;
// callers with flags map it to theirs.
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

// Validate checks the source; errors are *FieldError.
func (s Source) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &FieldError{Field: field, Err: fmt.Errorf(format, args...)}
	}
	if err := migrations.ValidateIdentifier(migrations.SchemaName, s.Schema); err != nil {
		return &FieldError{Field: "Schema", Err: err}
	}
	// An empty prefix is no prefix: the table is service_instances.
	if err := migrations.ValidateIdentifier(migrations.TableName, s.tableName()); err != nil {
		return bad("Prefix", "makes the table name %q, which %s", s.tableName(), err)
	}
	switch {
	case s.LockKeyPrefix == "":
		return bad("LockKeyPrefix", "must not be empty")
	case !utf8.ValidString(s.LockKeyPrefix) || strings.ContainsRune(s.LockKeyPrefix, 0):
		return bad("LockKeyPrefix", "must be valid UTF-8 without NUL bytes")
	case s.HeartbeatInterval <= 0:
		return bad("HeartbeatInterval", "must be positive, got %s", s.HeartbeatInterval)
	case s.HeartbeatSlowInterval < s.HeartbeatInterval:
		return bad("HeartbeatSlowInterval", "(%s) must not be below HeartbeatInterval (%s)", s.HeartbeatSlowInterval, s.HeartbeatInterval)
	case s.StaleThreshold <= s.HeartbeatSlowInterval:
		return bad("StaleThreshold", "(%s) must be above HeartbeatSlowInterval (%s): an instance beating at the slow cadence would be called stale",
			s.StaleThreshold, s.HeartbeatSlowInterval)
	case s.DefinitiveDeadCutoff <= s.StaleThreshold:
		return bad("DefinitiveDeadCutoff", "(%s) must be above StaleThreshold (%s)", s.DefinitiveDeadCutoff, s.StaleThreshold)
	}
	return nil
}

// tableName is the instances table's name: Prefix, as given (empty for none), and
// service_instances.
func (s Source) tableName() string { return s.Prefix + "service_instances" }

// Table is the instances table as a quoted identifier.
func (s Source) Table() string {
	return pgx.Identifier{s.Schema, s.tableName()}.Sanitize()
}

// TableName is the instances table as people write it, for messages.
func (s Source) TableName() string { return s.Schema + "." + s.tableName() }

// ErrTableMissing: the source's table does not exist (or is not visible to the role).
var ErrTableMissing = errors.New("whizbang: instances table not found")

// TableCheckSQL returns one row: whether the table exists and the role may read it. $1
// the table's quoted identifier.
const TableCheckSQL = `SELECT ` + sqltag.WhizbangTable + ` pg_catalog.to_regclass($1) IS NOT NULL
   AND pg_catalog.has_table_privilege(pg_catalog.to_regclass($1), 'SELECT')`

// Verdicts returns a subquery over the source's instances, with the columns
//
//	instance_id uuid, service_name text, host_name text, process_id integer,
//	started_at timestamptz, metadata jsonb, state text, alive boolean,
//	lock_held boolean, key_shared boolean, last_heartbeat_at timestamptz
//
// where state is instance_state_rule's, with the lock counted only when no other row
// shares the instance's key. stale, dead and lockKeyPrefix are the caller's placeholders
// for the stale threshold and definitive-dead cutoff (intervals) and the lock key's text
// prefix, e.g. "$1::interval".
func (s Source) Verdicts(stale, dead, lockKeyPrefix string) (string, error) {
	rule, err := migrations.LatestStateRule()
	if err != nil {
		return "", err
	}
	state, err := rule.Expand(map[string]string{
		"p_locked":            "coalesce(w.locked AND NOT w.key_shared, false)",
		"p_holds_alive_lock":  "false", // Whizbang records no lock in its rows: no lock_lost
		"p_last_heartbeat_at": "w.last_heartbeat_at",
		"p_now":               "pg_catalog.now()",
		"p_stale":             stale,
		"p_dead":              dead,
		"p_missing_since":     "NULL::timestamptz",
		"p_grace":             "NULL::interval",
	})
	if err != nil {
		return "", err
	}
	r := strings.NewReplacer("{table}", s.Table(), "{state}", state, "{prefix}", lockKeyPrefix)
	return r.Replace(verdictsSQL), nil
}

// verdictsSQL: locks are matched by a hash join on the key's halves as pg_locks shows a
// bigint key (classid the high 32 bits, objid the low); only the keys of held locks are
// counted for sharing (a key nobody holds says nothing either way), so the table is
// scanned twice but nothing is sorted or kept. On a standby pg_locks does not show the
// primary's locks: locked is NULL there and the verdict rests on heartbeats.
const verdictsSQL = `(SELECT w.instance_id, w.service_name, w.host_name, w.process_id, w.started_at, w.metadata, s.state,
       s.state IN ('alive', 'lock_only', 'lock_lost', 'heartbeat_only') AS alive,
       w.locked AS lock_held, w.key_shared, w.last_heartbeat_at
  FROM (SELECT i.instance_id, i.service_name, i.host_name, i.process_id, i.started_at, i.metadata, i.last_heartbeat_at,
               coalesce(h.shared, false) AS key_shared,
               CASE WHEN NOT (SELECT pg_catalog.pg_is_in_recovery()) THEN h.key IS NOT NULL END AS locked
          FROM {table} i
          LEFT JOIN (SELECT k.key, count(*) > 1 AS shared
                       FROM (SELECT pg_catalog.hashtext({prefix} || i.instance_id::text)::bigint AS key FROM {table} i) k
                       JOIN pg_catalog.pg_locks l
                         ON l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.mode = 'ExclusiveLock'
                        AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                           WHERE d.datname = pg_catalog.current_database())
                        AND l.classid = ((k.key >> 32) & 4294967295)::oid AND l.objid = (k.key & 4294967295)::oid
                      GROUP BY k.key) h
                 ON h.key = pg_catalog.hashtext({prefix} || i.instance_id::text)::bigint) w
 CROSS JOIN LATERAL (SELECT {state} AS state) s)`

// Querier runs a query: *pgxpool.Pool is one.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// CheckTable waits until the database answers, retrying every retry, and then reports
// whether the source's table exists and the role may read it (an error wrapping
// ErrTableMissing when not). It returns ctx's error if ctx ends first.
func (s Source) CheckTable(ctx context.Context, q Querier, retry time.Duration) error {
	for {
		attempt, cancel := context.WithTimeout(ctx, retry)
		var ok bool
		err := q.QueryRow(attempt, TableCheckSQL, s.Table()).Scan(&ok)
		cancel()
		if err == nil {
			if !ok {
				return fmt.Errorf("%w: %s does not exist or the role may not SELECT from it", ErrTableMissing, s.TableName())
			}
			return nil
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) { // the server answered: retrying will not help
			return fmt.Errorf("whizbang: check %s: %w", s.TableName(), err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(retry):
		}
	}
}
