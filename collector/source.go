package collector

import (
	"errors"
	"fmt"

	"github.com/alecthomas/kingpin/v2"

	"github.com/pg-liveness/pg_liveness_exporter/internal/whizbang"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// Sources of instances, as --source takes them.
const (
	SourceLiveness = "liveness" // our schema: instances, leases, the verdict functions
	SourceWhizbang = "whizbang" // a Whizbang database as it is, read only
)

// SourceConfig says where instances are read from.
type SourceConfig struct {
	Kind     string          // SourceLiveness or SourceWhizbang
	Whizbang whizbang.Source // with SourceWhizbang
}

// whizbangFlags maps whizbang.Source's fields to the flags that set them.
var whizbangFlags = map[string]string{
	"Schema":                "--source.whizbang.schema",
	"Prefix":                "--source.whizbang.prefix",
	"LockKeyPrefix":         "--source.whizbang.lock-key-prefix",
	"HeartbeatInterval":     "--source.whizbang.heartbeat-interval",
	"HeartbeatSlowInterval": "--source.whizbang.heartbeat-slow-interval",
	"StaleThreshold":        "--source.whizbang.stale-threshold",
	"DefinitiveDeadCutoff":  "--source.whizbang.definitive-dead-cutoff",
}

func addSourceFlags(app *kingpin.Application, c *SourceConfig) {
	c.Kind = SourceLiveness
	c.Whizbang = whizbang.Defaults()
	w := &c.Whizbang
	app.Flag("source", "Where instances are read from: liveness (this project's schema) or whizbang (a Whizbang "+
		"database as it is, read only; needs --no-agent).").Default(SourceLiveness).EnumVar(&c.Kind, SourceLiveness, SourceWhizbang)
	app.Flag("source.whizbang.schema", "Schema of Whizbang's tables.").Default(w.Schema).StringVar(&w.Schema)
	app.Flag("source.whizbang.prefix", "Prefix of Whizbang's tables: instances are read from <prefix>service_instances (empty: service_instances).").
		Default(w.Prefix).StringVar(&w.Prefix)
	app.Flag("source.whizbang.lock-key-prefix", "Text before the instance id in Whizbang's alive-lock key, hashtext(<prefix> || instance_id).").
		Default(w.LockKeyPrefix).StringVar(&w.LockKeyPrefix)
	app.Flag("source.whizbang.heartbeat-interval", "Whizbang's fast heartbeat cadence (Whizbang stores no timing in its rows).").
		Default(w.HeartbeatInterval.String()).DurationVar(&w.HeartbeatInterval)
	app.Flag("source.whizbang.heartbeat-slow-interval", "Whizbang's slow heartbeat cadence, while the alive lock is held.").
		Default(w.HeartbeatSlowInterval.String()).DurationVar(&w.HeartbeatSlowInterval)
	app.Flag("source.whizbang.stale-threshold", "A Whizbang heartbeat older than this is stale; must be above the slow cadence.").
		Default(w.StaleThreshold.String()).DurationVar(&w.StaleThreshold)
	app.Flag("source.whizbang.definitive-dead-cutoff", "A Whizbang heartbeat older than this is dead even with the lock held (its cleanup_stale_instances p_definitive_dead_cutoff).").
		Default(w.DefinitiveDeadCutoff.String()).DurationVar(&w.DefinitiveDeadCutoff)
}

// ReaderSource is the source as the liveness library's Reader takes it (nil for our own
// schema), so that the status page reads exactly the table the collectors read. An
// empty prefix is no prefix there too, not the library's default.
func (s SourceConfig) ReaderSource() *liveness.WhizbangSource {
	if s.Kind != SourceWhizbang {
		return nil
	}
	w := s.Whizbang
	return &liveness.WhizbangSource{Schema: w.Schema, Prefix: w.Prefix, NoPrefix: w.Prefix == "", LockKeyPrefix: w.LockKeyPrefix,
		HeartbeatInterval: w.HeartbeatInterval, HeartbeatSlowInterval: w.HeartbeatSlowInterval,
		StaleThreshold: w.StaleThreshold, DefinitiveDeadCutoff: w.DefinitiveDeadCutoff}
}

// validate checks the source; errors name the flag.
func (s *SourceConfig) validate() error {
	switch s.Kind {
	case "", SourceLiveness:
		s.Kind = SourceLiveness
		return nil
	case SourceWhizbang:
		var fe *whizbang.FieldError
		if err := s.Whizbang.Validate(); errors.As(err, &fe) {
			return fmt.Errorf("%s %s", whizbangFlags[fe.Field], fe.Err)
		} else if err != nil {
			return err
		}
		return nil
	}
	return fmt.Errorf("--source: %q is neither %s nor %s", s.Kind, SourceLiveness, SourceWhizbang)
}
