package liveness

import (
	"cmp"
	"fmt"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
)

// Timing is an instance's heartbeat timing. Each instance records its own in its row,
// and every observer judges it by that (the one verdict), so a fleet may mix settings.
// In an AgentConfig a zero field takes its default (each field says it); in an InstanceStatus a zero field
// was not recorded (a row written by other software), and a Reader uses its
// ReaderConfig.Fallback instead. A WhizbangSource carries its services' timing in one,
// since Whizbang records none.
type Timing struct {
	// HeartbeatInterval is the fast cadence: while the alive lock is not held and
	// verified, and always in heartbeat-table-only mode. 30 s by default.
	HeartbeatInterval time.Duration
	// HeartbeatSlowInterval is the cadence while the alive lock is held and verified; 60 s by
	// default.
	HeartbeatSlowInterval time.Duration
	// StaleThreshold is the heartbeat age past which an instance without its lock is dead;
	// 90 s by default.
	StaleThreshold time.Duration
	// DefinitiveDeadCutoff is the heartbeat age past which an instance is dead even with
	// its lock held (a zombie: a hung process, a half-open session); 5 min by default.
	DefinitiveDeadCutoff time.Duration
	// LockGrace is how long observers wait, after the alive lock vanished, for the
	// instance to prove life before they call it dead; 1 s by default: a live agent notices
	// the end of its lock's session at once and beats within milliseconds.
	LockGrace time.Duration
}

// timingWithDefaults fills zero fields with the defaults; negative ones stay, for
// checkTiming.
func timingWithDefaults(t Timing) Timing {
	t.HeartbeatInterval = cmp.Or(t.HeartbeatInterval, defaults.HeartbeatInterval)
	t.HeartbeatSlowInterval = cmp.Or(t.HeartbeatSlowInterval, defaults.HeartbeatSlowInterval)
	t.StaleThreshold = cmp.Or(t.StaleThreshold, defaults.StaleThreshold)
	t.DefinitiveDeadCutoff = cmp.Or(t.DefinitiveDeadCutoff, defaults.DefinitiveDeadCutoff)
	t.LockGrace = cmp.Or(t.LockGrace, defaults.LockGrace)
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
