package database

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
)

// The PostgreSQL majors this release supports and is tested on (make test runs the
// database tests on each).
const (
	MinMajor = 14
	MaxMajor = 18
)

// ServerMajor reads the major from server_version as the server reports it at login:
// "18.4", "15.18 (Debian 15.18-0+deb12u1)", "19devel", "19beta1". Before 10 the major
// had two parts ("9.6.24"); ServerMajor returns the first, which is below every
// supported major all the same.
func ServerMajor(serverVersion string) (int, bool) {
	s := strings.TrimSpace(serverVersion)
	end := 0
	for end < len(s) && s[end] >= '0' && s[end] <= '9' {
		end++
	}
	n, err := strconv.Atoi(s[:end])
	if err != nil || n == 0 {
		return 0, false
	}
	return n, true
}

// VersionWarning is the one line to log for a server of this server_version, or "" for
// a supported major. Outside the range the exporter keeps serving what it can.
func VersionWarning(serverVersion string) string {
	major, ok := ServerMajor(serverVersion)
	switch {
	case !ok:
		return fmt.Sprintf("cannot tell the PostgreSQL major from server_version %q; supported are %d to %d", serverVersion, MinMajor, MaxMajor)
	case major < MinMajor:
		// What a real 13 does, as TestUnsupportedMajorIsOneLineAndServes sees it.
		return fmt.Sprintf("PostgreSQL %s is not supported: the oldest supported major is %d (supported: %d to %d). "+
			"The migrations need 14 (so the agent does not join and the instances collector has no verdict) and the "+
			"statements collector needs pg_stat_statements' toplevel (14); the other collectors keep being served",
			serverVersion, MinMajor, MinMajor, MaxMajor)
	case major > MaxMajor:
		return fmt.Sprintf("PostgreSQL %s is newer than the newest major this release is tested on (supported: %d to %d); "+
			"everything keeps running", serverVersion, MinMajor, MaxMajor)
	}
	return ""
}

// versionWatch logs VersionWarning once for each server version the pool's connections
// report, so that a server replaced by another major (an upgrade, a failover) is named
// again, and a steady one once.
type versionWatch struct {
	logger *slog.Logger
	mu     sync.Mutex
	seen   string
}

func (w *versionWatch) observe(serverVersion string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if serverVersion == w.seen {
		return
	}
	w.seen = serverVersion
	if msg := VersionWarning(serverVersion); msg != "" && w.logger != nil {
		w.logger.Warn(msg, "server_version", serverVersion)
	}
}
