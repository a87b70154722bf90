package testutil

import (
	"errors"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TCPOptions reads a TCP connection's keepalive and user timeout, as the kernel holds
// them.
func TCPOptions(t testing.TB, conn net.Conn) (keepalive bool, idle, interval time.Duration, count int, userTimeout time.Duration) {
	t.Helper()
	raw, err := conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var errs []error
	get := func(fd uintptr, level, opt int) int {
		v, err := unix.GetsockoptInt(int(fd), level, opt)
		errs = append(errs, err)
		return v
	}
	if err := raw.Control(func(fd uintptr) {
		keepalive = get(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE) == 1
		idle = time.Duration(get(fd, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)) * time.Second
		interval = time.Duration(get(fd, unix.IPPROTO_TCP, unix.TCP_KEEPINTVL)) * time.Second
		count = get(fd, unix.IPPROTO_TCP, unix.TCP_KEEPCNT)
		userTimeout = time.Duration(get(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)) * time.Millisecond
	}); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return
}
