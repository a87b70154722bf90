// The alive lock's session settings: the DSN, the server-side and client-side keepalive
// and user timeout, checked and built into a pgx connection configuration.

package alivelock

import (
	"cmp"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
)

// Config is what the session of an alive lock connects with. Zero keepalive and verify
// settings take the defaults (package defaults). Its errors are *store.ConfigError
// naming "alivelock.Config.<Field>"; each owner renames them to its own config's fields.
type Config struct {
	// DSN of PostgreSQL itself (--db.direct-dsn), not of a transaction-mode pooler.
	DSN         string
	InstanceID  uuid.UUID // must not be nil; the node agent's session names uuid.Max
	ServiceName string    // names the connection: application_name is "<ServiceName>:alive-lock"

	// Server-side TCP keepalive and user timeout of the lock's session, passed as startup
	// parameters. Idle and Interval are whole seconds. The client socket gets the same
	// keepalive, so that this side notices a dead server too.
	KeepaliveIdle     time.Duration
	KeepaliveInterval time.Duration
	KeepaliveCount    int
	UserTimeout       time.Duration

	// VerifyInterval is how often the lock is re-verified; checked here, used by the owner.
	VerifyInterval time.Duration
}

// Validate checks the configuration without connecting. Errors name the field at fault
// and never contain the password.
func (c Config) Validate() error {
	_, _, err := c.ConnConfig()
	return err
}

// ValidateTiming checks what does not concern the connection: the verification
// interval, for a lock held through a node agent.
func (c Config) ValidateTiming() error {
	if c.VerifyInterval < 0 {
		return configErr("VerifyInterval", "(%s) must not be negative", c.VerifyInterval)
	}
	return nil
}

// ConnConfig validates c and builds the lock connection's configuration. It also returns
// the client socket's user timeout.
func (c Config) ConnConfig() (*pgx.ConnConfig, time.Duration, error) {
	if strings.TrimSpace(c.DSN) == "" {
		return nil, 0, configErr("DSN", "must not be empty")
	}
	if c.InstanceID == uuid.Nil {
		return nil, 0, configErr("InstanceID", "must not be the nil UUID")
	}
	if strings.TrimSpace(c.ServiceName) == "" {
		return nil, 0, configErr("ServiceName", "must not be empty")
	}
	idle, err := wholeSeconds("KeepaliveIdle", c.KeepaliveIdle, defaults.KeepaliveIdle)
	if err != nil {
		return nil, 0, err
	}
	interval, err := wholeSeconds("KeepaliveInterval", c.KeepaliveInterval, defaults.KeepaliveInterval)
	if err != nil {
		return nil, 0, err
	}
	count, err := orDefault("KeepaliveCount", c.KeepaliveCount, defaults.KeepaliveCount)
	if err != nil {
		return nil, 0, err
	}
	userTimeout, err := orDefault("UserTimeout", c.UserTimeout, defaults.UserTimeout)
	if err != nil {
		return nil, 0, err
	}
	if userTimeout < time.Millisecond {
		return nil, 0, configErr("UserTimeout", "(%s) must be at least 1ms", userTimeout)
	}
	if c.VerifyInterval < 0 {
		return nil, 0, configErr("VerifyInterval", "(%s) must not be negative", c.VerifyInterval)
	}

	cfg, err := pgx.ParseConfig(c.DSN)
	if err != nil {
		return nil, 0, &store.ConfigError{Field: Field("DSN"), Reason: logging.RedactError(err).Error()}
	}
	rp := cfg.RuntimeParams
	rp["application_name"] = c.ServiceName + ":alive-lock"
	rp["tcp_keepalives_idle"] = strconv.Itoa(int(idle / time.Second))
	rp["tcp_keepalives_interval"] = strconv.Itoa(int(interval / time.Second))
	rp["tcp_keepalives_count"] = strconv.Itoa(count)
	rp["tcp_user_timeout"] = strconv.FormatInt(userTimeout.Milliseconds(), 10)
	rp["idle_session_timeout"] = "0"
	// No named prepared statements: they would not survive a pooler, and then the
	// verification could not say what went wrong.
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	// The client side of the socket gets its own keepalive and user timeout, one probe
	// short of the server's, so that an agent cut off from the database stops trusting
	// its lock before the server frees it for someone else.
	clientCount := max(count-1, 1)
	clientUserTimeout := min(userTimeout, idle+interval*time.Duration(clientCount))
	dialer := &net.Dialer{
		Timeout: cfg.ConnectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: idle, Interval: interval, Count: clientCount,
		},
		Control: func(network, _ string, rc syscall.RawConn) error {
			if !strings.HasPrefix(network, "tcp") {
				// A unix socket (a server on this host) has no network to be cut
				// off by: the server's end of it closes when the session ends.
				return nil
			}
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(clientUserTimeout.Milliseconds()))
			})
			return cmp.Or(err, serr)
		},
	}
	cfg.DialFunc = dialer.DialContext
	return cfg, clientUserTimeout, nil
}

// Field is how the errors of Config name its field: "alivelock.Config.<name>", the key
// an owner's table from these fields to its own config's is written with.
func Field(name string) string { return "alivelock.Config." + name }

func configErr(field, format string, args ...any) error {
	return &store.ConfigError{Field: Field(field), Reason: fmt.Sprintf(format, args...)}
}

// orDefault is v, or def when v is zero; a negative v is refused.
func orDefault[T int | time.Duration](field string, v, def T) (T, error) {
	switch {
	case v < 0:
		return 0, configErr(field, "(%v) must not be negative", v)
	case v == 0:
		return def, nil
	}
	return v, nil
}

// wholeSeconds is orDefault for a setting PostgreSQL takes in whole seconds only.
func wholeSeconds(field string, d, def time.Duration) (time.Duration, error) {
	d, err := orDefault(field, d, def)
	if err == nil && d%time.Second != 0 {
		return 0, configErr(field, "(%s) must be a whole number of seconds", d)
	}
	return d, err
}
