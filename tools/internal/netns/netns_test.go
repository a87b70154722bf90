package netns

import (
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// A namespace answers across its link, not with the link cut, again once healed, and is
// gone after Remove.
func TestCutHealRemove(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal(RootHint)
	}
	n, err := Create("pltst")
	if err != nil {
		t.Fatal(err)
	}
	defer n.Remove()
	l, err := net.Listen("tcp", n.HostIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	// A TCP connection from inside the namespace to the host end, by bash's /dev/tcp.
	ping := func() bool {
		argv := n.Command("timeout", "2", "bash", "-c", "exec 3<>/dev/tcp/"+strings.Replace(l.Addr().String(), ":", "/", 1))
		return exec.Command(argv[0], argv[1:]...).Run() == nil
	}
	if !ping() {
		t.Fatal("no answer from the host end with the link up")
	}
	if err := n.Cut(); err != nil {
		t.Fatal(err)
	}
	if ping() {
		t.Fatal("an answer with the link cut")
	}
	if err := n.Heal(); err != nil {
		t.Fatal(err)
	}
	if !ping() {
		t.Fatal("no answer after healing")
	}
	n.Remove()
	if ok, err := Exists(n.Name, n.HostDev); err != nil || ok {
		t.Fatalf("namespace still there after Remove (err %v)", err)
	}
	if _, err := Create("toolongprefix"); err == nil || !strings.Contains(err.Error(), "prefix") {
		t.Fatalf("a too long prefix: %v, want an error naming the prefix", err)
	}
}
