package liveness_test

import (
	"bufio"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

// TestMain gives the runnable examples a throwaway database in DATABASE_URL, where a
// service would have its own, so that the examples import nothing internal and can be
// copied as they are.
func TestMain(m *testing.M) {
	if spec := os.Getenv(rawAttachEnv); spec != "" {
		os.Exit(rawAttachProcess(spec))
	}
	dsn, err := pgtest.FreshDSN()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.Setenv("DATABASE_URL", dsn); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pgtest.Main(m)
}

// rawAttachEnv makes the test binary a process of its own that attaches one instance to a
// node agent, as a service would: "<socket>,<instance id>,<database>", or
// "tcp://<host:port>,<instance id>,<database>,<token>" for a node agent's TCP listener. It
// draws a secret of its own at its start and presents it on every attach, as the library
// does. It prints each of the node agent's first answers to an attach as a line of JSON,
// attaches again (every 50 ms) whenever the connection ends, and exits when its standard
// input closes (or it is killed). A process of its own: the node agent tells processes
// apart by their credentials (and secrets), which every connection of the test's own
// process shares.
const rawAttachEnv = "PG_LIVENESS_TEST_RAW_ATTACH"

func rawAttachProcess(spec string) int {
	parts := strings.Split(spec, ",")
	if len(parts) != 3 && len(parts) != 4 {
		fmt.Fprintln(os.Stderr, "bad", rawAttachEnv, spec)
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
