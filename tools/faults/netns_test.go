package faults

import (
	"bufio"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/watchdog"
)

// netnsRootHint is the one line a network-namespace scenario fails with when not root.
const netnsRootHint = "network-namespace scenarios need root (ip netns, ip link): run the tests as root"

// netns is a network namespace joined to the host by a veth pair with a private /30: the
// host end has HostIP, the namespace end NSIP. Nothing else routes to that /30.
type netns struct {
	Name, HostDev, NSDev string
	HostIP, NSIP, CIDR   string
	watchdog             io.WriteCloser
}

var netnsSetup sync.Mutex

// newNetns creates the namespace and the veth pair. They are removed when the test ends,
// and by a watchdog process if the test binary dies first.
func newNetns(t testing.TB) *netns {
	t.Helper()
	n, err := createNetns()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Remove)
	return n
}

func createNetns() (*netns, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%s", netnsRootHint)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("ip not found: apt-get install iproute2")
	}
	// Scenarios run in parallel: one at a time picks a free /30 and brings its link up.
	netnsSetup.Lock()
	defer netnsSetup.Unlock()
	var b [3]byte
	_, _ = crand.Read(b[:])
	tag := hex.EncodeToString(b[:])
	n := &netns{Name: "plfault-" + tag, HostDev: "plfh" + tag, NSDev: "plfn" + tag}
	// A /30 in 10.200.0.0/16 that no interface on this host uses.
	used, _ := exec.Command("ip", "-o", "-4", "addr").Output()
	for range 100 {
		base := rand.IntN(16384) * 4
		o3, o4 := base/256, base%256
		n.HostIP, n.NSIP = fmt.Sprintf("10.200.%d.%d", o3, o4+1), fmt.Sprintf("10.200.%d.%d", o3, o4+2)
		n.CIDR = fmt.Sprintf("10.200.%d.%d/30", o3, o4)
		if !strings.Contains(string(used), fmt.Sprintf("10.200.%d.", o3)) {
			break
		}
	}
	if err := n.startWatchdog(); err != nil {
		return nil, err
	}
	steps := [][]string{
		{"netns", "add", n.Name},
		{"link", "add", n.HostDev, "type", "veth", "peer", "name", n.NSDev},
		{"link", "set", n.NSDev, "netns", n.Name},
		{"addr", "add", n.HostIP + "/30", "dev", n.HostDev},
		{"link", "set", n.HostDev, "up"},
		{"-n", n.Name, "addr", "add", n.NSIP + "/30", "dev", n.NSDev},
		{"-n", n.Name, "link", "set", n.NSDev, "up"},
		{"-n", n.Name, "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			n.Remove()
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(s, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return n, nil
}

// startWatchdog removes the namespace and the veth pair when this process exits for any
// reason.
func (n *netns) startWatchdog() error {
	w, err := watchdog.Start("netns-watchdog", `ip netns del "$1" 2>/dev/null; ip link del "$2" 2>/dev/null; exit 0`, n.Name, n.HostDev)
	n.watchdog = w
	return err
}

// Cut sets the namespace's end of the veth pair down: sockets stay open, packets are lost.
func (n *netns) Cut() error { return n.ip("-n", n.Name, "link", "set", n.NSDev, "down") }

// Heal sets it up again.
func (n *netns) Heal() error { return n.ip("-n", n.Name, "link", "set", n.NSDev, "up") }

func (n *netns) ip(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Remove deletes the namespace and the veth pair (deleting one end deletes both).
func (n *netns) Remove() {
	_ = exec.Command("ip", "netns", "del", n.Name).Run()
	_ = exec.Command("ip", "link", "del", n.HostDev).Run()
	if n.watchdog != nil {
		_ = n.watchdog.Close()
	}
}

// netnsExists reports whether the namespace or the host end of the veth pair exists.
func netnsExists(name, hostDev string) (bool, error) {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return false, err
	}
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) > 0 && f[0] == name {
			return true, nil
		}
	}
	return exec.Command("ip", "link", "show", "dev", hostDev).Run() == nil, nil
}

// netnsChildEnv makes the test binary a child that creates a namespace, prints its names,
// waits for a line on stdin and then panics.
const netnsChildEnv = "PG_LIVENESS_FAULTS_NETNS_CHILD"

func netnsChild() {
	n, err := createNetns()
	if err != nil {
		fmt.Println("error", err)
		os.Exit(3)
	}
	fmt.Println("created", n.Name, n.HostDev)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	panic("failing on purpose with a network namespace in place")
}

// TestNetnsRemovedAfterChildPanics runs the test binary as a child that creates a
// namespace and panics: its namespace and veth pair must be gone afterwards.
func TestNetnsRemovedAfterChildPanics(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal(netnsRootHint)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), netnsChildEnv+"=1")
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
	if ok, err := netnsExists(name, dev); err != nil || !ok {
		t.Fatalf("namespace %s not there while the child runs (err %v)", name, err)
	}
	_, _ = io.WriteString(stdin, "go\n")
	if err := cmd.Wait(); err == nil {
		t.Fatal("the child exited 0; it should have panicked")
	}
	gone := testutil.Poll(10*time.Second, func() bool { ok, err := netnsExists(name, dev); return err == nil && !ok })
	if !gone {
		_ = exec.Command("ip", "netns", "del", name).Run()
		_ = exec.Command("ip", "link", "del", dev).Run()
		t.Fatalf("namespace %s or veth %s still there 10 s after the child panicked", name, dev)
	}
}
