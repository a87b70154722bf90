package main

// The source flags, bound to the data layer's source configuration: --source and
// --source.whizbang.* here; --db.schema and the agent's stale threshold and definitive-dead
// cutoff (the fallback for rows that record no timing) set its Schema and Fallback too
// (flags.go). The source is checked once, by store.NewSource, and reaches every reader.

import (
	"github.com/alecthomas/kingpin/v2"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// addSourceFlags binds --source and --source.whizbang.* to the source's configuration,
// their defaults Whizbang's documented ones.
func addSourceFlags(app *kingpin.Application, s *store.SourceConfig) {
	s.Kind, s.Whizbang = store.SourceLiveness, store.DefaultWhizbang()
	w, t := &s.Whizbang, &s.Whizbang.Timing
	app.Flag("source", "Where instances are read from: liveness (this project's schema) or whizbang (a Whizbang "+
		"database as it is, read only; needs --no-agent).").Default(string(store.SourceLiveness)).
		EnumVar((*string)(&s.Kind), string(store.SourceLiveness), string(store.SourceWhizbang))
	app.Flag("source.whizbang.schema", "Schema of Whizbang's tables.").Default(w.Schema).StringVar(&w.Schema)
	app.Flag("source.whizbang.prefix", "Prefix of Whizbang's tables: instances are read from <prefix>service_instances (empty: service_instances).").
		Default(w.Prefix).SetValue(whizbangPrefix{w})
	app.Flag("source.whizbang.lock-key-prefix", "Text before the instance id in Whizbang's alive-lock key, hashtext(<prefix> || instance_id).").
		Default(w.LockKeyPrefix).StringVar(&w.LockKeyPrefix)
	app.Flag("source.whizbang.heartbeat-interval", "Whizbang's fast heartbeat cadence (Whizbang stores no timing in its rows).").
		Default(t.HeartbeatInterval.String()).DurationVar(&t.HeartbeatInterval)
	app.Flag("source.whizbang.heartbeat-slow-interval", "Whizbang's slow heartbeat cadence, while the alive lock is held.").
		Default(t.HeartbeatSlowInterval.String()).DurationVar(&t.HeartbeatSlowInterval)
	app.Flag("source.whizbang.stale-threshold", "A Whizbang heartbeat older than this is stale; must be above the slow cadence.").
		Default(t.StaleThreshold.String()).DurationVar(&t.StaleThreshold)
	app.Flag("source.whizbang.definitive-dead-cutoff", "A Whizbang heartbeat older than this is dead even with the lock held (its cleanup_stale_instances p_definitive_dead_cutoff).").
		Default(t.DefinitiveDeadCutoff.String()).DurationVar(&t.DefinitiveDeadCutoff)
}

// whizbangPrefix is --source.whizbang.prefix: an empty value is no prefix
// (Whizbang.NoPrefix), where the library's empty Prefix is Whizbang's default.
type whizbangPrefix struct{ w *store.Whizbang }

func (p whizbangPrefix) Set(v string) error { p.w.Prefix, p.w.NoPrefix = v, v == ""; return nil }
func (p whizbangPrefix) String() string     { return p.w.Prefix }
