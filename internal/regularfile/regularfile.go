// Package regularfile reads the small files the exporter is configured with (the DSN
// file, the web configuration and the certificates it names) the one safe way: regular
// files only, up to a size limit, without ever blocking.
//
// os.ReadFile on a path an operator typed can hang the process before it listens (a FIFO
// with no writer blocks in open, and then ignores SIGTERM), or read without bound
// (/dev/zero, /dev/urandom). Read opens without blocking and asks the opened file, not
// the path, what it is: a FIFO swapped in between a stat and the open cannot slip through.
package regularfile

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// Read returns the contents of the regular file at path (symbolic links are followed),
// or an error when it is anything else or holds more than limit bytes. Errors name the
// path and never quote the contents.
func Read(path string, limit int64) ([]byte, error) {
	return read(path, limit, false)
}

// ReadSecret is Read for a file that holds a password or a DSN: it is refused, as libpq
// refuses a private key file, when other users may read or write it, or when its group
// may and root does not own it. A file of its owner alone (0600, 0400) is taken, and so
// is a root-owned file its group may read (0640, 0440: a Kubernetes Secret mounted for
// the pod's fsGroup, a systemd credential).
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

// private refuses a secret's file that others may read or write (see ReadSecret). The
// mode and owner are those of the opened file.
func private(path string, info fs.FileInfo) error {
	perm := info.Mode().Perm()
	owner := -1
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		owner = int(st.Uid)
	}
	switch {
	case perm&0o007 != 0:
		return fmt.Errorf("%s is open to every user (mode %#o); it holds a password: chmod o-rwx it (0600, or 0640 owned by root for a group)", path, perm)
	case perm&0o030 != 0:
		return fmt.Errorf("%s is writable by its group (mode %#o); it holds a password: chmod g-wx it (0600, or 0640 owned by root)", path, perm)
	case perm&0o040 != 0 && owner != 0:
		return fmt.Errorf("%s is readable by its group (mode %#o) and not owned by root; it holds a password: chmod 0600 it, or give it to root with mode 0640 for the group", path, perm)
	}
	return nil
}
