package netns

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// childEnv makes the test binary a child that creates a namespace, prints its names,
// waits for a line on stdin and then panics.
const childEnv = "PG_LIVENESS_NETNS_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		child() // never returns
	}
	os.Exit(m.Run())
}

func child() {
	n, err := Create("plch")
	if err != nil {
		fmt.Println("error", err)
		os.Exit(3)
	}
	fmt.Println("created", n.Name, n.HostDev)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	panic("failing on purpose with a network namespace in place")
}

// TestRemovedAfterChildPanics runs the test binary as a child that creates a namespace
// and panics: its namespace and veth pair must be gone afterwards (the watchdog).
func TestRemovedAfterChildPanics(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal(RootHint)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	f := strings.Fields(line)
	if err != nil || len(f) != 3 || f[0] != "created" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child did not create a namespace: %q %v", line, err)
	}
	name, dev := f[1], f[2]
	if ok, err := Exists(name, dev); err != nil || !ok {
		t.Fatalf("namespace %s not there while the child runs (err %v)", name, err)
	}
	_, _ = io.WriteString(stdin, "go\n")
	if err := cmd.Wait(); err == nil {
		t.Fatal("the child exited 0; it should have panicked")
	}
	gone := testutil.Poll(10*time.Second, func() bool { ok, err := Exists(name, dev); return err == nil && !ok })
	if !gone {
		_ = exec.Command("ip", "netns", "del", name).Run()
		_ = exec.Command("ip", "link", "del", dev).Run()
		t.Fatalf("namespace %s or veth %s still there 10 s after the child panicked", name, dev)
	}
}
