package main

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// TestNodeAgentServesThroughAnAcceptErrorBurst: the exporter as a node agent, its open
// files limited to 200, takes a burst of 400 connections: its accepts fail (EMFILE) while
// the burst holds its files, and are retried; once the burst is gone a process attaches
// and its lock is held, the failures are counted, and logged once, not once each.
func TestNodeAgentServesThroughAnAcceptErrorBurst(t *testing.T) {
	t.Parallel()
	db := testdb.Migrated(t)
	dir := t.TempDir()
	socket := filepath.Join(dir, "agent.sock")
	// The limit set in a shell before the binary: both the soft and the hard one, which Go
	// would otherwise raise the soft one to.
	limited := filepath.Join(dir, "limited")
	if err := os.WriteFile(limited, []byte("#!/bin/sh\nulimit -n 200 || exit 97\nexec "+binary+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := startBinary(t, limited, []string{"DATA_SOURCE_NAME=" + db.DSN}, "--node-agent.socket="+socket)
	p.waitFor(t, `(?m)^pg_liveness_node_agent_session_up 1$`, 30*time.Second)

	var burst []net.Conn
	for range 400 {
		c, err := net.DialTimeout("unix", socket, 5*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", len(burst), err)
		}
		burst = append(burst, c)
	}
	p.waitFor(t, `(?m)^pg_liveness_node_agent_accept_errors_total [1-9][0-9]*$`, 30*time.Second)
	for _, c := range burst {
		_ = c.Close()
	}

	var database string
	if err := db.Conn(t).QueryRow(testutil.Context(t, 10*time.Second), `SELECT current_database()`).Scan(&database); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, _ := json.Marshal(map[string]any{"op": "attach", "instance": uuid.New(), "schema": "liveness", "database": database})
	if _, err := c.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	var st struct {
		Op   string `json:"op"`
		Held bool   `json:"held"`
	}
	if err := json.NewDecoder(c).Decode(&st); err != nil || st.Op != "state" || !st.Held {
		t.Fatalf("an attach after the burst: %+v, %v; want its lock held", st, err)
	}
	p.checkRunning(t, "the end of the test")
	// Once per burst of failures at error level (a loaded machine may split the burst in
	// two), each ended by one line, and far fewer lines than failures.
	errorLines, againLines := 0, 0
	for l := range strings.Lines(p.Logs()) {
		if strings.Contains(l, "level=ERROR") && strings.Contains(l, "accepting a process's connection failed") {
			errorLines++
		}
		if strings.Contains(l, "accepting connections again") {
			againLines++
		}
	}
	failures := metricValue(t, p.scrape(t), "pg_liveness_node_agent_accept_errors_total")
	if errorLines == 0 || errorLines > 3 || float64(errorLines) >= failures {
		t.Errorf("%v accept failures logged %d times at error level; want once when a burst began (the rest at debug)",
			failures, errorLines)
	}
	if againLines != errorLines {
		t.Errorf("%d lines saying the node agent accepts connections again, for %d bursts", againLines, errorLines)
	}
}

// The exporter as a node agent on TCP only (--node-agent.listen-address, as in
// Kubernetes): its own agent attaches over TCP with the token, and so does a process;
// neither the token nor the process's secret appears in its output.
func TestNodeAgentOverTCP(t *testing.T) {
	t.Parallel()
	db := testdb.Migrated(t)
	dir := t.TempDir()
	const token = "a-token-for-the-node-agent-of-this-test"
	tokenFile := writeFile(t, dir, "token", token+"\n")
	addr := testutil.FreeAddr(t)
	p := startExporter(t, []string{"DATA_SOURCE_NAME=" + db.DSN}, "--node-agent.listen-address="+addr,
		"--node-agent.token-file="+tokenFile, "--node-agent.claims-file="+filepath.Join(dir, "claims"))
	p.waitFor(t, `(?m)^pg_liveness_node_agent_locks_held 1$`, 30*time.Second) // its own agent's

	var database string
	if err := db.Conn(t).QueryRow(testutil.Context(t, 10*time.Second), `SELECT current_database()`).Scan(&database); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const secret = "the-secret-of-this-process-0123"
	b, _ := json.Marshal(map[string]any{"op": "attach", "instance": uuid.New(), "schema": "liveness", "database": database,
		"token": token, "secret": secret})
	if _, err := c.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	var st struct {
		Op   string `json:"op"`
		Held bool   `json:"held"`
	}
	// The schema's events (a lease taken or freed) are relayed to an attached process as
	// they come: the attach's answer may follow one.
	dec := json.NewDecoder(c)
	for {
		err := dec.Decode(&st)
		if err == nil && st.Op == "event" {
			continue
		}
		if err != nil || st.Op != "state" || !st.Held {
			t.Fatalf("an attach over TCP: %+v, %v; want its lock held", st, err)
		}
		break
	}
	p.waitFor(t, `(?m)^pg_liveness_node_agent_locks_held 2$`, 30*time.Second)
	p.checkRunning(t, "the end of the test")
	if out := p.Logs(); strings.Contains(out, token) || strings.Contains(out, secret) {
		t.Errorf("the exporter's output holds the token or a process's secret:\n%s", out)
	}
}

// Bad TCP settings of the node agent are configuration errors: exit 2, one line naming
// the flag, never the token.
func TestNodeAgentTCPFlagsExitTwo(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const token = "hunter2-is-not-a-token-but-long-enough"
	good := writeFile(t, dir, "token", token)
	short := writeFile(t, dir, "short", "hunter2\n")
	open := writeFile(t, dir, "open", token)
	if err := os.Chmod(open, 0o666); err != nil {
		t.Fatal(err)
	}
	claims := "--node-agent.claims-file=" + filepath.Join(dir, "claims")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no port", []string{"--node-agent.listen-address=127.0.0.1", "--node-agent.token-file=" + good, claims}, "--node-agent.listen-address"},
		{"no token file", []string{"--node-agent.listen-address=127.0.0.1:9817", claims}, "--node-agent.token-file must be set with --node-agent.listen-address"},
		{"a token file without a listener", []string{"--node-agent.socket=" + filepath.Join(dir, "s.sock"), "--node-agent.token-file=" + good}, "--node-agent.token-file is used only with --node-agent.listen-address"},
		{"a missing token file", []string{"--node-agent.listen-address=127.0.0.1:9817", "--node-agent.token-file=" + filepath.Join(dir, "none"), claims}, "--node-agent.token-file: "},
		{"a token file every user may write", []string{"--node-agent.listen-address=127.0.0.1:9817", "--node-agent.token-file=" + open, claims}, "--node-agent.token-file: " + open + " is writable by every user"},
		{"a short token", []string{"--node-agent.listen-address=127.0.0.1:9817", "--node-agent.token-file=" + short, claims}, "--node-agent.token-file: " + short + " holds 7 bytes"},
		{"no claims file", []string{"--node-agent.listen-address=127.0.0.1:9817", "--node-agent.token-file=" + good}, "--node-agent.claims-file must be set without"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runToExit(t, nil, append([]string{"--db.dsn=host=x"}, tc.args...)...)
			if code != exitConfig {
				t.Fatalf("exit code %d, want %d; output:\n%s", code, exitConfig, out)
			}
			checkOneLine(t, out, tc.want)
			if strings.Contains(out, token) || strings.Contains(out, "hunter2") {
				t.Errorf("output repeats the token:\n%s", out)
			}
		})
	}
}
