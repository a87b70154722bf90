package webconfig

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// memFile is an anonymous in-memory file (memfd_create), sealed once written, that any
// code of this process can open by path as /proc/self/fd/<fd>. Each open of that path
// is a new reader of the file the descriptor refers to at that moment.
type memFile struct{ fd int }

func newMemFile(content []byte) (*memFile, error) {
	const flags = unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING
	// Not executable, where the kernel knows the flag (6.3 on); some kernels refuse a
	// memfd without it (vm.memfd_noexec = 2).
	fd, err := unix.MemfdCreate("pg_liveness_exporter-web-config", flags|unix.MFD_NOEXEC_SEAL)
	if errors.Is(err, unix.EINVAL) {
		fd, err = unix.MemfdCreate("pg_liveness_exporter-web-config", flags)
	}
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	m := &memFile{fd: fd}
	for b := content; len(b) > 0; {
		n, err := unix.Write(fd, b)
		if err != nil {
			_ = m.close()
			return nil, fmt.Errorf("write to memfd: %w", err)
		}
		b = b[n:]
	}
	// Nobody, this process included, can change it from now on.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS,
		unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		_ = m.close()
		return nil, fmt.Errorf("seal memfd: %w", err)
	}
	// The toolkit opens it by path: that needs /proc, which a container may lack.
	got, err := os.ReadFile(m.path())
	if err != nil || string(got) != string(content) {
		_ = m.close()
		if err == nil {
			err = errors.New("read back different contents")
		}
		return nil, fmt.Errorf("open it as %s (is /proc mounted?): %w", m.path(), err)
	}
	return m, nil
}

func (m *memFile) path() string { return "/proc/self/fd/" + strconv.Itoa(m.fd) }

// replaceWith makes m's descriptor refer to n's file, atomically (dup3): an open of m's
// path sees the old file or the new one, never a mix or nothing. n is consumed.
func (m *memFile) replaceWith(n *memFile) error {
	err := unix.Dup3(n.fd, m.fd, unix.O_CLOEXEC)
	_ = n.close()
	if err != nil {
		return fmt.Errorf("dup3: %w", err)
	}
	return nil
}

func (m *memFile) close() error {
	if m.fd < 0 {
		return nil
	}
	err := unix.Close(m.fd)
	m.fd = -1
	return err
}
