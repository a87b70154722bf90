package regularfile

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestReadRegularFiles(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "dsn")
	if err := os.WriteFile(file, []byte("host=db\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link") // Kubernetes mounts secrets as symbolic links
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{file, link} {
		b, err := Read(p, 64)
		if err != nil || string(b) != "host=db\n" {
			t.Errorf("Read(%s) = %q, %v", p, b, err)
		}
	}
	if _, err := Read(file, 7); err == nil || !strings.Contains(err.Error(), "larger than 7 bytes") || !strings.Contains(err.Error(), file) {
		t.Errorf("8 bytes with a limit of 7: %v", err)
	}
	if _, err := Read(filepath.Join(dir, "missing"), 64); !os.IsNotExist(err) {
		t.Errorf("a missing file: %v", err)
	}
}

// Everything that is not a regular file is refused at once, naming what it is; none of
// them blocks or reads without bound.
func TestReadRefusesOtherFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, c := range []struct{ path, want string }{
		{dir, "is a directory"},
		{fifo, "is a named pipe (FIFO)"},
		{"/dev/zero", "is a character device"},
		{"/dev/urandom", "is a character device"},
		{sock, ""}, // opening a socket fails by itself (ENXIO)
	} {
		done := make(chan error, 1)
		go func() { _, err := Read(c.path, 1<<20); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.path) {
				t.Errorf("Read(%s): %v, want an error naming it and %q", c.path, err, c.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Read(%s) blocked", c.path)
		}
	}
}

// A secret's file is refused when its group or other users may write it, when a user
// other than root or the process's own owns it, and when others may read it and root does
// not own it; its owner's own file is taken, and so is a root-owned file its group reads
// (a Kubernetes Secret mounted for the pod's fsGroup), and, with one warning per read, a
// root-owned file every user may read (a Secret's default mount, 0644). Read itself does
// not look at the mode. The tests run as root, so they can give a file away, and every
// other user is another user.
func TestReadSecretRefusesFilesOthersMayWrite(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("run as root: the test gives files to other users (sudo go test ./internal/regularfile/)")
	}
	var logs bytes.Buffer
	SetLogger(slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() { SetLogger(nil) })
	dir := t.TempDir()
	for _, c := range []struct {
		name string
		mode os.FileMode
		uid  int
		want string // "" when taken
		warn bool   // taken with a warning
	}{
		{"owner only", 0o600, 0, "", false},
		{"owner read only", 0o400, 0, "", false},
		{"root's, for its group", 0o440, 0, "", false},
		{"root's, group 0640", 0o640, 0, "", false},
		{"root's, a Secret's default mount", 0o644, 0, "", true},
		{"root's, others may read only", 0o604, 0, "", true},
		{"root's, read-only for all", 0o444, 0, "", true},
		{"world-writable", 0o666, 0, "is writable by every user (mode 0666)", false},
		{"others may write only", 0o602, 0, "is writable by every user (mode 0602)", false},
		{"group may write", 0o660, 0, "is writable by its group (mode 0660)", false},
		{"another user's, owner only", 0o600, 65534, "is owned by user 65534, neither root nor this process's user 0", false},
		{"another user's, world-readable", 0o644, 65534, "is owned by user 65534", false},
		{"another user's, group-readable", 0o640, 65534, "is owned by user 65534", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-"))
			if err := os.WriteFile(file, []byte("pw\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(file, c.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(file, c.uid, -1); err != nil {
				t.Fatal(err)
			}
			link := file + ".link" // the mode of the file a link names counts
			if err := os.Symlink(file, link); err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{file, link} {
				logs.Reset()
				b, err := ReadSecret(p, 64)
				switch {
				case c.want == "" && (err != nil || string(b) != "pw\n"):
					t.Errorf("ReadSecret(%s) = %q, %v; want it taken", p, b, err)
				case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p)):
					t.Errorf("ReadSecret(%s): %v; want an error naming it that says %q", p, err, c.want)
				}
				warned := strings.Count(logs.String(), "level=WARN")
				wantMode := fmt.Sprintf("mode=%#o", c.mode)
				switch {
				case c.warn && (warned != 1 || !strings.Contains(logs.String(), "file="+p) || !strings.Contains(logs.String(), wantMode)):
					t.Errorf("ReadSecret(%s) logged %d warnings, want one naming the file and %s:\n%s", p, warned, wantMode, logs.String())
				case !c.warn && warned != 0:
					t.Errorf("ReadSecret(%s) warned:\n%s", p, logs.String())
				}
			}
			if _, err := Read(file, 64); err != nil {
				t.Errorf("Read, which reads no secret, refused mode %#o: %v", c.mode, err)
			}
		})
	}
}

// The warnings of the files read before the logger exists (the DATA_SOURCE_* files are
// read before the flags) are logged once it is set, once each.
func TestReadSecretWarningsWaitForTheLogger(t *testing.T) {
	SetLogger(nil)
	t.Cleanup(func() { SetLogger(nil) })
	file := filepath.Join(t.TempDir(), "dsn")
	if err := os.WriteFile(file, []byte("pw\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(file, 0o644); err != nil { // whatever the umask
		t.Fatal(err)
	}
	if _, err := ReadSecret(file, 64); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	SetLogger(slog.New(slog.NewTextHandler(&logs, nil)))
	SetLogger(slog.New(slog.NewTextHandler(&logs, nil))) // a second logger gets nothing old
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), "file="+file) {
		t.Errorf("%d warnings once the logger is set, want one naming %s:\n%s", n, file, logs.String())
	}
}
