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
