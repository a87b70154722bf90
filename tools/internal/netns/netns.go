// Package netns makes network namespaces for the tools' fault tests: a namespace joined
// to the host by a veth pair with a private /30, whose link can be set down (packets lost,
// sockets left open: a half-open partition) and up again.
//
// It guarantees that a namespace it created is deleted when Remove is called and, if the
// calling process dies first (a panic, a timeout, a signal), by a watchdog process. It
// needs root and iproute2, and fails with a one-line hint without them. It must never
// touch a namespace or link it did not create.
package netns

import (
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/watchdog"
)

// RootHint is the one line Create fails with when not run as root.
const RootHint = "network-namespace faults need root (ip netns, ip link): run as root"

// Namespace is a network namespace and its veth pair: the host end has HostIP, the
// namespace end NSIP, both in CIDR. Nothing else routes to that /30.
type Namespace struct {
	Name, HostDev, NSDev string
	HostIP, NSIP, CIDR   string
	watchdog             io.WriteCloser
}

var setup sync.Mutex

// Create makes a namespace with a name starting with prefix (at most 6 characters), and
// its veth pair, link up.
func Create(prefix string) (*Namespace, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%s", RootHint)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("ip not found: apt-get install iproute2")
	}
	if len(prefix) > 6 {
		return nil, fmt.Errorf("netns: prefix %q longer than 6 characters (interface names are at most 15)", prefix)
	}
	// One at a time picks a free /30 and brings its link up.
	setup.Lock()
	defer setup.Unlock()
	var b [3]byte
	_, _ = crand.Read(b[:])
	tag := hex.EncodeToString(b[:])
	n := &Namespace{Name: prefix + "-" + tag, HostDev: prefix + "h" + tag, NSDev: prefix + "n" + tag}
	// A /30 in 10.201.0.0/16 (the fault suite uses 10.200/16) that no interface uses.
	used, _ := exec.Command("ip", "-o", "-4", "addr").Output()
	for range 100 {
		base := rand.IntN(16384) * 4
		o3, o4 := base/256, base%256
		n.HostIP, n.NSIP = fmt.Sprintf("10.201.%d.%d", o3, o4+1), fmt.Sprintf("10.201.%d.%d", o3, o4+2)
		n.CIDR = fmt.Sprintf("10.201.%d.%d/30", o3, o4)
		if !strings.Contains(string(used), fmt.Sprintf("10.201.%d.", o3)) {
			break
		}
	}
	w, err := watchdog.Start("netns-watchdog", `ip netns del "$1" 2>/dev/null; ip link del "$2" 2>/dev/null; exit 0`, n.Name, n.HostDev)
	if err != nil {
		return nil, err
	}
	n.watchdog = w
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
		if err := ip(s...); err != nil {
			n.Remove()
			return nil, err
		}
	}
	return n, nil
}

// Cut sets the namespace's end of the veth pair down: sockets stay open, packets are lost.
func (n *Namespace) Cut() error { return ip("-n", n.Name, "link", "set", n.NSDev, "down") }

// Heal sets it up again.
func (n *Namespace) Heal() error { return ip("-n", n.Name, "link", "set", n.NSDev, "up") }

// Command is argv run inside the namespace.
func (n *Namespace) Command(argv ...string) []string {
	return append([]string{"ip", "netns", "exec", n.Name}, argv...)
}

// Remove deletes the namespace and the veth pair (deleting one end deletes both). It is
// safe to call more than once.
func (n *Namespace) Remove() {
	_ = exec.Command("ip", "netns", "del", n.Name).Run()
	_ = exec.Command("ip", "link", "del", n.HostDev).Run()
	if n.watchdog != nil {
		_ = n.watchdog.Close()
		n.watchdog = nil
	}
}

// Exists reports whether the namespace or the host end of its veth pair exists.
func Exists(name, hostDev string) (bool, error) {
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

func ip(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
