package liveness

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/whizbang"
)

// WhizbangSource is a Whizbang database, read as it is: its <Prefix>service_instances
// table and the session advisory lock each Whizbang instance takes,
// hashtext(LockKeyPrefix || instance_id). A Reader with ReaderConfig.Whizbang judges
// those instances by the same rules as this package's own, and never writes: it needs
// only SELECT on the table and pg_read_all_stats. Whizbang records no timing in its rows,
// so it is given here; zero fields take Whizbang's documented defaults (schema public,
// prefix wh_, key prefix wh_instance_alive:, 30 s and 60 s cadences, a 90 s stale
// threshold and a 5 m definitive-dead cutoff). Whizbang's rows do not say whether the
// instance holds its lock, so there is no lock_lost state; two instances whose 32-bit
// keys collide are judged by their heartbeats while the key is held.
type WhizbangSource struct {
	Schema string
	// Prefix of the table's name; "" means Whizbang's default, wh_, unless NoPrefix.
	Prefix string
	// NoPrefix reads service_instances, for an install whose tables have no prefix.
	// Prefix must then be empty.
	NoPrefix      bool
	LockKeyPrefix string

	HeartbeatInterval     time.Duration
	HeartbeatSlowInterval time.Duration
	StaleThreshold        time.Duration
	DefinitiveDeadCutoff  time.Duration
}

// ErrNoLeases is returned by Reader.Leader for a source without leases (Whizbang's).
var ErrNoLeases = errors.New("liveness: this source has no leases")

// source fills the defaults.
func (w WhizbangSource) source() whizbang.Source {
	d := whizbang.Defaults()
	prefix := cmp.Or(w.Prefix, d.Prefix)
	if w.NoPrefix {
		prefix = ""
	}
	return whizbang.Source{
		Schema: cmp.Or(w.Schema, d.Schema), Prefix: prefix, LockKeyPrefix: cmp.Or(w.LockKeyPrefix, d.LockKeyPrefix),
		HeartbeatInterval:     cmp.Or(w.HeartbeatInterval, d.HeartbeatInterval),
		HeartbeatSlowInterval: cmp.Or(w.HeartbeatSlowInterval, d.HeartbeatSlowInterval),
		StaleThreshold:        cmp.Or(w.StaleThreshold, d.StaleThreshold),
		DefinitiveDeadCutoff:  cmp.Or(w.DefinitiveDeadCutoff, d.DefinitiveDeadCutoff),
	}
}

// readerSource is what the reader's statements read: the verdict relation, the rows
// that carry the instances' identity, their mode and timing, and the leases.
type readerSource struct {
	states    func(idParam string) string // a relation with instance_states' columns
	instances string
	mode      string
	timing    [5]string // interval, slow interval, stale threshold, dead cutoff, grace, in seconds
	leases    string
}

// readerSources is the source for this package's schema.
func readerSources(schema string) readerSource {
	col := func(c string) string { return "extract(epoch FROM i." + c + ")::float8" }
	return readerSource{
		states: func(id string) string {
			return "{schema}.instance_states(make_interval(secs => $1::float8), make_interval(secs => $2::float8), " + id + ")"
		},
		instances: "{schema}.instances",
		mode:      "i.liveness_mode",
		timing: [5]string{col("heartbeat_interval"), col("heartbeat_slow_interval"), col("stale_threshold"),
			col("definitive_dead_cutoff"), col("lock_grace")},
		leases: "{schema}.leases",
	}.withSchema(schema)
}

func (r readerSource) withSchema(schema string) readerSource {
	states := r.states
	r.states = func(id string) string { return sqlFor(schema, states(id)) }
	r.instances, r.leases = sqlFor(schema, r.instances), sqlFor(schema, r.leases)
	return r
}

// render fills a statement's placeholders; idParam is the statement's instance id (or
// NULL) for a source that can look one instance up directly.
func (r readerSource) render(sql, idParam string) string {
	return strings.NewReplacer("{states}", r.states(idParam), "{instances}", r.instances, "{leases}", r.leases,
		"{mode}", r.mode, "{heartbeat_interval}", r.timing[0], "{heartbeat_slow_interval}", r.timing[1],
		"{stale_threshold}", r.timing[2], "{definitive_dead_cutoff}", r.timing[3], "{lock_grace}", r.timing[4],
	).Replace(sql)
}

// noLeases is an empty leases relation with the columns the fleet statement reads.
const noLeases = `(SELECT NULL::text AS name, NULL::uuid AS holder_instance_id, NULL::text AS holder_host, NULL::text AS holder,
        NULL::bigint AS epoch, NULL::timestamptz AS taken_at, NULL::timestamptz AS expires_at WHERE false)`

func newWhizbangReader(cfg ReaderConfig) (*Reader, error) {
	if cfg.Whizbang.NoPrefix && cfg.Whizbang.Prefix != "" {
		return nil, fmt.Errorf("liveness: ReaderConfig.Whizbang.NoPrefix is set with Prefix %q; set one of them", cfg.Whizbang.Prefix)
	}
	src := cfg.Whizbang.source()
	var fe *whizbang.FieldError
	if err := src.Validate(); errors.As(err, &fe) {
		return nil, fmt.Errorf("liveness: ReaderConfig.Whizbang.%s %s", fe.Field, fe.Err)
	} else if err != nil {
		return nil, err
	}
	secs := func(d time.Duration) string { return fmt.Sprintf("%g::float8", d.Seconds()) }
	// The lock key prefix follows each statement's own parameters: $5 in readerSQL, $10 in
	// fleetSQL.
	source := func(prefixParam string) (readerSource, error) {
		verdicts, err := src.Verdicts("make_interval(secs => $1::float8)", "make_interval(secs => $2::float8)", prefixParam)
		return readerSource{
			states:    func(string) string { return verdicts },
			instances: src.Table(),
			mode:      "''::text", // Whizbang records no mode
			timing: [5]string{secs(src.HeartbeatInterval), secs(src.HeartbeatSlowInterval), secs(src.StaleThreshold),
				secs(src.DefinitiveDeadCutoff), "NULL::float8"},
			leases: noLeases,
		}, err
	}
	forReader, err := source("$5::text")
	if err != nil {
		return nil, err
	}
	forFleet, err := source("$10::text")
	if err != nil {
		return nil, err
	}
	return &Reader{db: cfg.DB, sql: forReader.render(readerSQL, "NULL::uuid"), fleetSQL: forFleet.render(fleetSQL, "NULL::uuid"),
		stale: src.StaleThreshold.Seconds(), dead: src.DefinitiveDeadCutoff.Seconds(), extraArgs: []any{src.LockKeyPrefix}}, nil
}
