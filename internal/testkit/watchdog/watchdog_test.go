package watchdog

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// The script runs when the process that started the watchdog exits, and not before.
func TestScriptRunsWhenTheProcessExits(t *testing.T) {
	if os.Getenv("WATCHDOG_CHILD_DIR") != "" {
		if _, err := Start("watchdog-test", `rm -rf "$1"`, os.Getenv("WATCHDOG_CHILD_DIR")); err != nil {
			t.Fatal(err)
		}
		os.Exit(0) // no clean-up of its own: the watchdog's script must do it
	}
	dir := filepath.Join(t.TempDir(), "left-behind")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestScriptRunsWhenTheProcessExits$")
	cmd.Env = append(os.Environ(), "WATCHDOG_CHILD_DIR="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	testutil.Eventually(t, 10*time.Second, "the watchdog removing the folder after its process exited", func() bool {
		_, err := os.Stat(dir)
		return os.IsNotExist(err)
	})
}

// Closing the writer runs the script at once; while it is open, the script waits.
func TestCloseRunsTheScript(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "to-remove")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	w, err := Start("watchdog-test", `rm -rf "$1"`, dir)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Never(t, 300*time.Millisecond, "the script ran while the writer was open", func() bool {
		_, err := os.Stat(dir)
		return os.IsNotExist(err)
	})
	_ = w.Close()
	testutil.Eventually(t, 10*time.Second, "the script running once the writer closed", func() bool {
		_, err := os.Stat(dir)
		return os.IsNotExist(err)
	})
}
