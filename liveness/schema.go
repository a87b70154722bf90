package liveness

// Mode selects the liveness signals an instance relies on.
type Mode string

const (
	// ModeAdvisoryLockWhenAvailable uses the alive lock when it is held and verified,
	// with the heartbeat table as fallback; the heartbeat slows down while the lock holds.
	ModeAdvisoryLockWhenAvailable Mode = "advisory-lock-when-available"
	// ModeHeartbeatTableOnly holds no alive lock and opens no direct connection
	// (AgentConfig.DirectDSN is unused), for a service that reaches PostgreSQL only
	// through PgBouncer in transaction mode. The instance always beats at the fast
	// interval and is heartbeat_only by the verdict; a crashed one is dead after its
	// stale threshold, and a second process with the same instance id goes unnoticed
	// (only a lock could tell).
	ModeHeartbeatTableOnly Mode = "heartbeat-table-only"
)

// parseMode accepts the two mode names.
func parseMode(s string) (Mode, bool) {
	switch m := Mode(s); m {
	case ModeAdvisoryLockWhenAvailable, ModeHeartbeatTableOnly:
		return m, true
	}
	return "", false
}
