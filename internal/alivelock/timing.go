// The alive lock's session timing: its statements', connects' and closes' bounds, how
// often a lock not held is claimed again and its key's holder asked for, and the backoff
// between sessions.

package alivelock

import (
	"math/rand/v2"
	"time"
)

const (
	// StatementTimeout bounds one statement or exchange of a lock's session (a LISTEN, a
	// line to a node agent); a claim or a verification has StatementTimeoutFor.
	StatementTimeout = 5 * time.Second
	ConnectTimeout   = 10 * time.Second
	CloseTimeout     = 5 * time.Second
	// ReconnectBackoffMin and ReconnectBackoffMax bound Backoff. A session that lasted
	// longer than ReconnectBackoffMax before it dropped starts the backoff over.
	ReconnectBackoffMin = 250 * time.Millisecond
	ReconnectBackoffMax = 10 * time.Second
	// ReclaimEvery is how often a lock that is not held is claimed again.
	ReclaimEvery = time.Second
	// HolderAskEvery is how often, while claims are refused, the session asks again who
	// holds the key.
	HolderAskEvery = 30 * time.Second
)

// StatementTimeoutFor bounds one claim or verification on a session whose client socket
// gives up unacknowledged data after clientUserTimeout (Config.ConnConfig's). A cut-off
// network is detected by the socket's keepalive and user timeout, so the deadline lies
// beyond them: a short network blip delays a verification instead of dropping a lock
// that the server still grants.
func StatementTimeoutFor(clientUserTimeout time.Duration) time.Duration {
	return max(StatementTimeout, clientUserTimeout+StatementTimeout)
}

// Backoff doubles from ReconnectBackoffMin up to ReconnectBackoffMax, with jitter in the
// upper half so that a fleet does not reconnect in step after a server restart. attempt
// counts from 1.
func Backoff(attempt int) time.Duration {
	d := ReconnectBackoffMax
	if attempt < 16 {
		d = min(ReconnectBackoffMin<<(attempt-1), ReconnectBackoffMax)
	}
	return d/2 + rand.N(d/2+1)
}

// Earliest is the earlier of a and b.
func Earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
