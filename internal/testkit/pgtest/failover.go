package pgtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// StopMode shuts the server down with pg_ctl's mode: "smart" waits for clients, "fast"
// disconnects them and checkpoints, "immediate" quits at once and recovers on the next
// start, as after a crash.
func (s *Server) StopMode(mode string) error {
	sig, ok := map[string]syscall.Signal{
		"smart": syscall.SIGTERM, "fast": syscall.SIGINT, "immediate": syscall.SIGQUIT,
	}[mode]
	if !ok {
		return fmt.Errorf("pgtest: unknown stop mode %q (smart, fast or immediate)", mode)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked(sig)
	return nil
}

// AllowHost lets clients from cidr log in over TCP with the password, for servers that
// also listen on an address other than 127.0.0.1 (WithSetting("listen_addresses", …)).
// It appends to pg_hba.conf and reloads the configuration.
func (s *Server) AllowHost(cidr string) error {
	f, err := os.OpenFile(filepath.Join(s.dataDir(), "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "host all all %s scram-sha-256\n", cidr)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return s.Exec(context.Background(), "SELECT pg_reload_conf()")
}

// Exec runs one statement as the superuser over the unix socket.
func (s *Server) Exec(ctx context.Context, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.AdminDSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// StartReplica makes a streaming replica of primary with pg_basebackup and starts it as a
// hot standby on a port of its own. It has the primary's databases, users and password.
// Close stops it and removes its folder; a watchdog does so if the calling process dies.
//
// The builds of the other majors (EnvMajor) have no pg_basebackup: there it fails at once,
// saying so; replicas run on Debian's PostgreSQL.
func StartReplica(primary *Server, opts ...ServerOption) (*Server, error) {
	if _, err := os.Stat(filepath.Join(primary.bindir, "pg_basebackup")); err != nil {
		return nil, fmt.Errorf("no pg_basebackup in %s: replicas need Debian's PostgreSQL (apt-get install postgresql; unset %s)",
			primary.bindir, EnvMajor)
	}
	s := &Server{bindir: primary.bindir, Password: primary.Password, cred: primary.cred}
	for _, o := range opts {
		o(s)
	}
	if err := s.makeDir("pg_liveness_test_replica_"); err != nil {
		return nil, err
	}
	if s.cred != nil {
		if err := os.Chown(s.dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			s.Close()
			return nil, err
		}
	}
	cmd := exec.Command(filepath.Join(s.bindir, "pg_basebackup"),
		"-D", s.dataDir(), "-h", primary.SocketDir(), "-p", strconv.Itoa(primary.Port),
		"-U", Superuser, "-R", "-X", "stream", "--no-sync", "--checkpoint=fast")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if out, err := cmd.CombinedOutput(); err != nil {
		s.Close()
		return nil, fmt.Errorf("pg_basebackup: %v: %s", err, lastLines(string(out), 5))
	}
	if err := s.startOnFreePort(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Promote ends recovery on a replica and waits until it accepts writes.
func (s *Server) Promote(ctx context.Context) error {
	return s.Exec(ctx, "SELECT pg_promote(wait => true, wait_seconds => 60)")
}
