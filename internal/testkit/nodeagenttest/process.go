// Processes of their own attached to a node agent: the test binary started again, which
// attaches one instance and reports the node agent's answers.

package nodeagenttest

import (
	"bufio"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

// attachedProcessEnv makes the test binary a process of its own that attaches one
// instance to a node agent, as a service would: "<socket>,<instance id>,<database>", or
// "tcp://<host:port>,<instance id>,<database>,<token>" for a node agent's TCP listener. It
// draws a secret of its own at its start and presents it on every attach, as the library
// does. It prints each of the node agent's first answers to an attach as a line of JSON,
// attaches again (every 50 ms) whenever the connection ends, and exits when its standard
// input closes (or it is killed). A process of its own: the node agent tells processes
// apart by their credentials (and secrets), which every connection of the test's own
// process shares.
const attachedProcessEnv = "PG_LIVENESS_TEST_RAW_ATTACH"

// MaybeRunAttachedProcess runs the test binary as an attached process, and exits, when
// AttachProcess started it; otherwise it returns at once. A TestMain that uses
// AttachProcess calls it first.
func MaybeRunAttachedProcess() {
	if spec := os.Getenv(attachedProcessEnv); spec != "" {
		os.Exit(runAttachedProcess(spec))
	}
}

func runAttachedProcess(spec string) int {
	parts := strings.Split(spec, ",")
	if len(parts) != 3 && len(parts) != 4 {
		fmt.Fprintln(os.Stderr, "bad", attachedProcessEnv, spec)
		return 2
	}
	go func() { // the test ends it by closing its standard input
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	network, address := "unix", parts[0]
	if a, ok := strings.CutPrefix(address, "tcp://"); ok {
		network, address = "tcp", a
	}
	attach := map[string]any{"op": "attach", "instance": parts[1], "schema": "liveness", "database": parts[2],
		"secret": rand.Text()}
	if len(parts) == 4 {
		attach["token"] = parts[3]
	}
	for {
		c, err := net.Dial(network, address)
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		b, _ := json.Marshal(attach)
		if _, err := c.Write(append(b, '\n')); err != nil {
			_ = c.Close()
			continue
		}
		r := bufio.NewReader(c)
		line, err := r.ReadString('\n')
		if err != nil && line == "" {
			line = `{"op":"closed"}` + "\n"
		}
		fmt.Print(line)
		_, _ = io.Copy(io.Discard, r) // hold the connection until it ends
		_ = c.Close()
		time.Sleep(50 * time.Millisecond)
	}
}

// Process is a process of its own (the test binary, MaybeRunAttachedProcess) attached to
// a node agent with one instance, attaching again whenever its connection ends.
type Process struct {
	Cmd   *exec.Cmd
	out   *bufio.Reader
	stdin io.WriteCloser
}

// Answer is the node agent's first answer to one of the process's attaches.
type Answer struct {
	Op    string `json:"op"`
	Held  bool   `json:"held"`
	Error string `json:"error"`
}

// AttachProcess starts a process attached to the node agent at where (a socket's path, or
// tcp://host:port with a token).
func AttachProcess(t *testing.T, where string, id uuid.UUID, database string, token ...string) *Process {
	t.Helper()
	p := &Process{Cmd: exec.Command(os.Args[0])}
	spec := where + "," + id.String() + "," + database
	for _, tok := range token {
		spec += "," + tok
	}
	p.Cmd.Env = append(os.Environ(), attachedProcessEnv+"="+spec)
	out, err := p.Cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.out = bufio.NewReader(out)
	if p.stdin, err = p.Cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	p.Cmd.Stderr = os.Stderr
	if err := p.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Cmd.Process.Kill(); _ = p.Cmd.Wait() })
	return p
}

// Next is the process's next answer to an attach. The node agent's notifications
// (op "event": a lease taken or freed anywhere in the fleet) may come before it at any
// time and are skipped: they answer nothing.
func (p *Process) Next(t *testing.T) Answer {
	t.Helper()
	for {
		if a := p.next(t); a.Op != "event" {
			return a
		}
	}
}

// next is the process's next line, whatever it is.
func (p *Process) next(t *testing.T) Answer {
	t.Helper()
	type result struct {
		line string
		err  error
	}
	ch := make(chan result, 1)
	go func() { line, err := p.out.ReadString('\n'); ch <- result{line, err} }()
	select {
	case r := <-ch:
		var a Answer
		if r.err != nil || json.Unmarshal([]byte(r.line), &a) != nil {
			t.Fatalf("the attached process's answer %q: %v", r.line, r.err)
		}
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("no answer from the attached process within 20 s")
		return Answer{}
	}
}

// Kill ends the process with SIGKILL, as a crash would.
func (p *Process) Kill(t *testing.T) {
	t.Helper()
	if err := p.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = p.Cmd.Wait()
}
