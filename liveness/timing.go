package liveness

import (
	"cmp"
	"fmt"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// Timing is an instance's heartbeat timing, defined with the data layer (store.Timing)
// that records it in every instance row and reads it back. In an AgentConfig a zero
// field takes its Default*.
type Timing = store.Timing

// Defaults of Timing, as the agent's flags have them (store's, where they are defined).
const (
	DefaultHeartbeatInterval     = store.DefaultHeartbeatInterval
	DefaultHeartbeatSlowInterval = store.DefaultHeartbeatSlowInterval
	DefaultStaleThreshold        = store.DefaultStaleThreshold
	DefaultDefinitiveDeadCutoff  = store.DefaultDefinitiveDeadCutoff
	// DefaultLockGrace: a live agent notices the end of its lock's session at once and
	// beats within milliseconds.
	DefaultLockGrace = store.DefaultLockGrace
)

// timingWithDefaults fills zero fields with the defaults; negative ones stay, for
// checkTiming.
func timingWithDefaults(t Timing) Timing {
	t.HeartbeatInterval = cmp.Or(t.HeartbeatInterval, DefaultHeartbeatInterval)
	t.HeartbeatSlowInterval = cmp.Or(t.HeartbeatSlowInterval, DefaultHeartbeatSlowInterval)
	t.StaleThreshold = cmp.Or(t.StaleThreshold, DefaultStaleThreshold)
	t.DefinitiveDeadCutoff = cmp.Or(t.DefinitiveDeadCutoff, DefaultDefinitiveDeadCutoff)
	t.LockGrace = cmp.Or(t.LockGrace, DefaultLockGrace)
	return t
}

// checkTiming refuses timing that would make a live instance look dead or a dead one
// look alive. field is the name of the Timing in its config ("AgentConfig.Timing");
// errors are *ConfigError naming field.<Field>.
func checkTiming(t Timing, field string) error {
	bad := func(name, format string, args ...any) error {
		return &ConfigError{Field: field + "." + name, Reason: fmt.Sprintf(format, args...)}
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"HeartbeatInterval", t.HeartbeatInterval}, {"HeartbeatSlowInterval", t.HeartbeatSlowInterval},
		{"StaleThreshold", t.StaleThreshold}} {
		if f.d <= 0 {
			return bad(f.name, "(%s) must be positive", f.d)
		}
	}
	switch {
	case t.HeartbeatSlowInterval < t.HeartbeatInterval:
		return bad("HeartbeatSlowInterval", "(%s) must not be below %s.HeartbeatInterval (%s)",
			t.HeartbeatSlowInterval, field, t.HeartbeatInterval)
	case t.StaleThreshold < t.HeartbeatSlowInterval:
		return bad("StaleThreshold", "(%s) must not be below %s.HeartbeatSlowInterval (%s)",
			t.StaleThreshold, field, t.HeartbeatSlowInterval)
	case t.StaleThreshold <= t.HeartbeatInterval:
		return bad("StaleThreshold", "(%s) must be above %s.HeartbeatInterval (%s): the watchdog beats again within "+
			"the stale threshold minus one fast interval", t.StaleThreshold, field, t.HeartbeatInterval)
	case t.DefinitiveDeadCutoff <= t.HeartbeatSlowInterval+t.StaleThreshold:
		return bad("DefinitiveDeadCutoff", "(%s) must be above %s.HeartbeatSlowInterval (%s) plus %s.StaleThreshold (%s)",
			t.DefinitiveDeadCutoff, field, t.HeartbeatSlowInterval, field, t.StaleThreshold)
	case t.LockGrace < 0:
		return bad("LockGrace", "(%s) must not be negative", t.LockGrace)
	}
	return nil
}
