// Package watchdog cleans up after a test process however it ends (a panic, a test
// timeout, a signal): Start runs a shell that blocks reading a pipe only this process
// holds; when the process exits, the read returns and the shell runs its clean-up script,
// which stops a server and removes its folder, or deletes a network namespace. Only tests
// and their kit import it.
package watchdog

import (
	"fmt"
	"io"
	"os/exec"
	"syscall"
)

// Start starts a watchdog that runs script (sh syntax, with args as $1, $2, ...) once
// this process exits. name names the shell in ps. Closing the returned writer runs the
// script at once, which a clean stop does to let the watchdog go.
func Start(name, script string, args ...string) (io.WriteCloser, error) {
	cmd := exec.Command("sh", append([]string{"-c", "read _ignored; " + script, name}, args...)...)
	// A group of its own, so that a signal to the tests' group does not end it first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	w, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { _ = cmd.Wait() }() // reap it whenever it ends
	return w, nil
}
