// Package regularfile reads the small files the exporter is configured with (the DSN
// file, the web configuration and the certificates it names) the one safe way: regular
// files only, up to a size limit, without ever blocking.
//
// os.ReadFile on a path an operator typed can hang the process before it listens (a FIFO
// with no writer blocks in open, and then ignores SIGTERM), or read without bound
// (/dev/zero, /dev/urandom). Read opens without blocking and asks the opened file, not
// the path, what it is: a FIFO swapped in between a stat and the open cannot slip through.
//
// A secret's file (ReadSecret) must also be its owner's alone, as libpq wants of a
// private key: owned by root or by the process's user, writable by nobody else. The one
// exception is the mode Kubernetes gives a Secret's files unless told otherwise, 0644
// owned by root: it is accepted, with a warning (SetLogger) each time it is read, at start
// and on each reload.
package regularfile

import (
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"syscall"
)

// Read returns the contents of the regular file at path (symbolic links are followed),
// or an error when it is anything else or holds more than limit bytes. Errors name the
// path and never quote the contents.
func Read(path string, limit int64) ([]byte, error) {
	return read(path, limit, false)
}

// ReadSecret is Read for a file that holds a password or a DSN: it is refused, as libpq
// refuses a private key file, when its group or other users may write it, when another
// user than root or the process's own owns it, or when other users (or its group) may
// read it and root does not own it. A file of its owner alone (0600, 0400) is taken, and
// so is a root-owned file its group may read (0640, 0440: a Kubernetes Secret mounted
// for the pod's fsGroup, a systemd credential). A root-owned file every user may read
// (0644, a Kubernetes Secret's default mount) is taken with a warning.
func ReadSecret(path string, limit int64) ([]byte, error) {
	return read(path, limit, true)
}

func read(path string, limit int64, secret bool) ([]byte, error) {
	// O_NONBLOCK: opening a FIFO without a writer returns at once instead of waiting for
	// one. It changes nothing for a regular file's reads.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := f.Stat() // of the opened file: what is read is what was checked
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("is %s, not a regular file", kind(info.Mode()))}
	}
	if info.Size() > limit {
		return nil, &fs.PathError{Op: "read", Path: path, Err: tooLarge(limit)}
	}
	if secret {
		if err := private(path, info); err != nil {
			return nil, err
		}
	}
	// The size may change while reading: read at most one byte past the limit to tell.
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, &fs.PathError{Op: "read", Path: path, Err: tooLarge(limit)}
	}
	return b, nil
}

func tooLarge(limit int64) error {
	if limit >= 1<<10 && limit%(1<<10) == 0 {
		return fmt.Errorf("is larger than %d KiB", limit>>10)
	}
	return fmt.Errorf("is larger than %d bytes", limit)
}

// kind says what a file that is not regular is, for messages.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	}
	return "of type " + m.Type().String()
}

// private refuses a secret's file that others may write, that a user other than root or
// the process's own owns, or that others may read and root does not own (see ReadSecret);
// it warns of a root-owned file every user may read. The mode and owner are those of the
// opened file.
func private(path string, info fs.FileInfo) error {
	perm := info.Mode().Perm()
	owner := -1
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		owner = int(st.Uid)
	}
	switch self := os.Geteuid(); {
	case perm&0o002 != 0:
		return fmt.Errorf("%s is writable by every user (mode %#o); it holds a password: chmod go-w it (0600, or 0640 owned by root for a group)", path, perm)
	case perm&0o020 != 0:
		return fmt.Errorf("%s is writable by its group (mode %#o); it holds a password: chmod g-w it (0600, or 0640 owned by root)", path, perm)
	case owner != 0 && owner != self:
		return fmt.Errorf("%s is owned by user %d, neither root nor this process's user %d; it holds a password: chown it to one of them", path, owner, self)
	case perm&0o004 != 0 && owner != 0:
		return fmt.Errorf("%s is open to every user (mode %#o) and not owned by root; it holds a password: chmod o-rwx it (0600, or 0640 owned by root for a group)", path, perm)
	case perm&0o040 != 0 && owner != 0:
		return fmt.Errorf("%s is readable by its group (mode %#o) and not owned by root; it holds a password: chmod 0600 it, or give it to root with mode 0640 for the group", path, perm)
	case perm&0o004 != 0:
		warn(path, perm)
	}
	return nil
}

// warnings is where ReadSecret says that it took a file every user may read: the logger
// SetLogger gave, or, until then, a few lines kept for it (the DATA_SOURCE_* files are
// read before the flags that make the logger are parsed).
var warnings struct {
	sync.Mutex
	logger  *slog.Logger
	pending [][2]string // path, mode
}

// maxPending bounds the warnings kept before SetLogger.
const maxPending = 16

// SetLogger sends ReadSecret's warnings to logger from now on, and those of the files
// read before, once.
func SetLogger(logger *slog.Logger) {
	warnings.Lock()
	defer warnings.Unlock()
	warnings.logger = logger
	for _, p := range warnings.pending {
		logWarning(logger, p[0], p[1])
	}
	warnings.pending = nil
}

func warn(path string, perm fs.FileMode) {
	mode := fmt.Sprintf("%#o", perm)
	warnings.Lock()
	defer warnings.Unlock()
	if warnings.logger == nil {
		if len(warnings.pending) < maxPending {
			warnings.pending = append(warnings.pending, [2]string{path, mode})
		}
		return
	}
	logWarning(warnings.logger, path, mode)
}

func logWarning(logger *slog.Logger, path, mode string) {
	logger.Warn("a file that holds a password is readable by every user of this machine; accepted because root owns it, "+
		"as Kubernetes mounts a Secret unless told otherwise: give the Secret's volume defaultMode 0440 (with the pod's fsGroup) "+
		"or the file mode 0600", "file", path, "mode", mode)
}
