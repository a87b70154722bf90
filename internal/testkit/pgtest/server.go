package pgtest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/watchdog"
)

// InstallHint is the one line printed when no PostgreSQL server can be found.
const InstallHint = "PostgreSQL server binaries (initdb, postgres) not found: install them with " +
	"`apt-get install postgresql postgresql-contrib`, or set " + EnvDSN + " to an existing server"

// EnvDSN points the tests at an existing server instead of a throwaway one. The DSN must
// be allowed to create and drop databases.
const EnvDSN = "PG_LIVENESS_TEST_DSN"

// Superuser is the bootstrap superuser of a throwaway cluster.
const Superuser = "postgres"

// Server is a throwaway PostgreSQL cluster in a temporary folder, listening on a unix
// socket in that folder and on 127.0.0.1 at a free port. Stop and Start restart it on the
// same port and data, for tests that need the database to go away and come back.
type Server struct {
	// Password of Superuser. TCP connections use scram-sha-256; the unix socket trusts.
	Password string
	// Port on 127.0.0.1.
	Port int

	dir      string
	bindir   string
	major    int // WithMajor's, 0 for FindBinDir's choice
	cred     *syscall.Credential
	extraCfg []string

	mu       sync.Mutex
	proc     *exec.Cmd
	exited   chan struct{}
	watchdog io.WriteCloser
	closed   bool
}

// ServerOption adjusts a throwaway server.
type ServerOption func(*Server)

// WithSetting adds a `-c name=value` server setting.
func WithSetting(name, value string) ServerOption {
	return func(s *Server) { s.extraCfg = append(s.extraCfg, name+"="+value) }
}

// EnvMajor points the throwaway servers at one PostgreSQL major, e.g. "18": Debian's
// /usr/lib/postgresql/<major>/bin when it is installed, else the build that
// scripts/install-deps.sh put in MajorCache()/<major>. Unset, the tests use Debian's
// (the newest installed, 15 on Debian 12).
const EnvMajor = "PG_LIVENESS_TEST_PG_MAJOR"

// EnvMajorCache overrides where scripts/install-deps.sh installs the other majors.
const EnvMajorCache = "PG_LIVENESS_PG_CACHE"

// MajorCache is the folder of the PostgreSQL majors that scripts/install-deps.sh
// installs, computed as that script does: EnvMajorCache, else
// /var/cache/pg_liveness_exporter/postgresql as root, else
// $XDG_CACHE_HOME/pg_liveness_exporter/postgresql (~/.cache by default).
func MajorCache() string {
	if d := os.Getenv(EnvMajorCache); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/cache/pg_liveness_exporter/postgresql"
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, _ := os.UserHomeDir()
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "pg_liveness_exporter", "postgresql")
}

// Major is the major EnvMajor asks for, or 0 when it is unset (Debian's default).
func Major() (int, error) {
	v := os.Getenv(EnvMajor)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 10 || n > 99 {
		return 0, fmt.Errorf("%s=%q: want a PostgreSQL major such as 18", EnvMajor, v)
	}
	return n, nil
}

func hasServerBinaries(dir string) bool {
	for _, b := range []string{"initdb", "postgres"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return false
		}
	}
	return true
}

// WithMajor runs the server on that PostgreSQL major whatever EnvMajor says, for tests
// of one major (such as 13, outside the supported range); found as EnvMajor's are.
func WithMajor(major int) ServerOption {
	return func(s *Server) { s.major = major }
}

// FindBinDir returns the folder that holds initdb and postgres: the major EnvMajor names
// (see there), or else pg_config's bindir, the newest /usr/lib/postgresql/*/bin, or PATH.
func FindBinDir() (string, error) {
	major, err := Major()
	if err != nil {
		return "", err
	}
	if major != 0 {
		return majorBinDir(major)
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); hasServerBinaries(dir) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if hasServerBinaries(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil && hasServerBinaries(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
	}
	return "", errors.New(InstallHint)
}

// majorBinDir finds one major: Debian's if installed, else the cached build.
func majorBinDir(major int) (string, error) {
	if d := fmt.Sprintf("/usr/lib/postgresql/%d/bin", major); hasServerBinaries(d) {
		return d, nil
	}
	d := filepath.Join(MajorCache(), strconv.Itoa(major), "bin")
	if hasServerBinaries(d) {
		return d, nil
	}
	return "", fmt.Errorf("PostgreSQL %d not found in /usr/lib/postgresql/%d/bin or %s (%s=%d): run scripts/install-deps.sh test",
		major, major, d, EnvMajor, major)
}

func versionOf(bindir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(bindir)))
	return v
}

// StartServer runs initdb into a new temporary folder and starts the server. Close stops
// it and removes the folder. If the calling process dies first (a panic, a test timeout, a
// signal), a small watchdog process stops the server and removes the folder.
func StartServer(opts ...ServerOption) (*Server, error) {
	s := &Server{Password: randomHex(12)}
	for _, o := range opts {
		o(s)
	}
	var err error
	if s.major != 0 {
		s.bindir, err = majorBinDir(s.major)
	} else {
		s.bindir, err = FindBinDir()
	}
	if err != nil {
		return nil, err
	}
	if err := s.makeDir("pg_liveness_test_"); err != nil {
		return nil, err
	}
	if err := s.initdb(); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.startOnFreePort(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// makeDir creates the server's temporary folder, and the watchdog that stops the server
// and removes the folder if the calling process dies.
func (s *Server) makeDir(prefix string) error {
	var err error
	if s.dir, err = os.MkdirTemp("", prefix); err != nil {
		return err
	}
	if err := s.startWatchdog(); err != nil {
		_ = os.RemoveAll(s.dir)
		return err
	}
	return nil
}

// startOnFreePort starts the server on a port that was free a moment ago, and on another
// when a process took it in between, up to five times.
func (s *Server) startOnFreePort() error {
	var err error
	for range 5 {
		if s.Port, err = testutil.FreePort(); err != nil {
			continue
		}
		if err = s.Start(); err == nil {
			return nil
		}
	}
	return err
}

// initdb refuses to run as root, so as root the cluster belongs to an unprivileged user.
func (s *Server) initdb() error {
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			u, err = user.Lookup("nobody")
		}
		if err != nil {
			return fmt.Errorf("running as root and no unprivileged user (postgres or nobody) to run PostgreSQL as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(s.dir, uid, gid); err != nil {
			return err
		}
	}
	pwfile := filepath.Join(s.dir, "pwfile")
	if err := os.WriteFile(pwfile, []byte(s.Password+"\n"), 0o600); err != nil {
		return err
	}
	if s.cred != nil {
		if err := os.Chown(pwfile, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return err
		}
	}
	cmd := exec.Command(filepath.Join(s.bindir, "initdb"),
		"-D", s.dataDir(), "-U", Superuser, "--pwfile", pwfile,
		"--auth-local=trust", "--auth-host=scram-sha-256",
		"-E", "UTF8", "--no-locale", "--no-sync")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	_ = os.Remove(pwfile)
	if err != nil && s.cred != nil && (errors.Is(err, os.ErrPermission) || strings.Contains(string(out), "ermission denied")) {
		return fmt.Errorf("initdb as uid %d: %v (%s): the server's files (%s and its folders) must be readable and executable by that user",
			s.cred.Uid, err, strings.TrimSpace(lastLines(string(out), 5)), filepath.Dir(s.bindir))
	}
	if err != nil {
		return fmt.Errorf("initdb: %v: %s", err, lastLines(string(out), 5))
	}
	return nil
}

// startWatchdog kills the server and removes the folder when this process exits for any
// reason.
func (s *Server) startWatchdog() error {
	w, err := watchdog.Start("pgtest-watchdog", `pid=$(head -n 1 "$1/data/postmaster.pid" 2>/dev/null); `+
		`[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; sleep 0.5; rm -rf "$1"`, s.dir)
	s.watchdog = w
	return err
}

func (s *Server) dataDir() string { return filepath.Join(s.dir, "data") }

// SocketDir is the folder of the server's unix socket.
func (s *Server) SocketDir() string { return s.dir }

// LogFile is the server's log.
func (s *Server) LogFile() string { return filepath.Join(s.dir, "server.log") }

// Start starts a stopped server on the same port and waits until it accepts connections.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return nil
	}
	logf, err := os.OpenFile(s.LogFile(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := []string{"-D", s.dataDir(), "-k", s.dir, "-p", strconv.Itoa(s.Port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_permissions=0777",
		"-c", "shared_preload_libraries=pg_stat_statements",
		"-c", "pg_stat_statements.track=all",
		"-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=off",
		"-c", "max_connections=300",
		"-c", "log_min_messages=warning", "-c", "log_connections=off",
	}
	for _, c := range s.extraCfg {
		args = append(args, "-c", c)
	}
	cmd := exec.Command(filepath.Join(s.bindir, "postgres"), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	s.proc, s.exited = cmd, exited

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		select {
		case <-exited:
			s.proc = nil
			return fmt.Errorf("postgres exited during start-up: %s", s.logTail())
		case <-ctx.Done():
			s.stopLocked(syscall.SIGKILL)
			return fmt.Errorf("postgres did not accept connections within 60s: %s", s.logTail())
		case <-time.After(50 * time.Millisecond):
		}
		if err := s.ping(ctx); err == nil {
			return nil
		}
	}
}

func (s *Server) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return s.Exec(ctx, "SELECT 1")
}

// PID is the postmaster's process id, 0 while the server is not running: the server's
// processes (its backends and workers) are its children.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || s.proc.Process == nil {
		return 0
	}
	return s.proc.Process.Pid
}

// Stop shuts the server down (fast mode: sessions are disconnected) and waits for it.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked(syscall.SIGINT)
}

// Kill stops the server the hard way, as a crash would.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked(syscall.SIGKILL)
}

func (s *Server) stopLocked(sig syscall.Signal) {
	if s.proc == nil {
		return
	}
	_ = s.proc.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		_ = s.proc.Process.Kill()
		<-s.exited
	}
	if sig == syscall.SIGKILL {
		// Backends notice the postmaster's death on their own; give them a moment so
		// that a restart finds the shared memory free.
		time.Sleep(200 * time.Millisecond)
	}
	s.proc = nil
}

// Close stops the server and removes its folder. It is safe to call more than once.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.stopLocked(syscall.SIGINT)
	s.mu.Unlock()
	_ = os.RemoveAll(s.dir)
	if s.watchdog != nil {
		_ = s.watchdog.Close()
	}
}

// DSN returns a TCP DSN for the superuser on 127.0.0.1 and database db, with password.
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable",
		s.Port, Superuser, s.Password, db)
}

// AdminDSN returns a DSN over the unix socket, which needs no password.
func (s *Server) AdminDSN(db string) string {
	return fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", s.dir, s.Port, Superuser, db)
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.LogFile())
	return lastLines(string(b), 10)
}

func lastLines(s string, n int) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
