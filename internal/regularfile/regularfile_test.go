package regularfile

import (
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

// A secret's file is refused when other users may read or write it, and when its group
// may and root does not own it; its owner's own file is taken, and so is a root-owned file
// its group reads (a Kubernetes Secret mounted for the pod's fsGroup). Read itself does
// not look at the mode. The tests run as root, so they can give a file away.
func TestReadSecretRefusesFilesOthersMayRead(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name string
		mode os.FileMode
		uid  int
		want string // "" when taken
	}{
		{"owner only", 0o600, 0, ""},
		{"owner read only", 0o400, 65534, ""},
		{"root's, for its group", 0o440, 0, ""},
		{"root's, group 0640", 0o640, 0, ""},
		{"world-readable", 0o644, 0, "is open to every user (mode 0644)"},
		{"world-writable", 0o666, 0, "is open to every user (mode 0666)"},
		{"other may read only", 0o604, 0, "is open to every user (mode 0604)"},
		{"group may write", 0o660, 0, "is writable by its group (mode 0660)"},
		{"group-readable, not root's", 0o640, 65534, "is readable by its group (mode 0640) and not owned by root"},
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
				b, err := ReadSecret(p, 64)
				switch {
				case c.want == "" && (err != nil || string(b) != "pw\n"):
					t.Errorf("ReadSecret(%s) = %q, %v; want it taken", p, b, err)
				case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p)):
					t.Errorf("ReadSecret(%s): %v; want an error naming it that says %q", p, err, c.want)
				}
			}
			if _, err := Read(file, 64); err != nil {
				t.Errorf("Read, which reads no secret, refused mode %#o: %v", c.mode, err)
			}
		})
	}
}
