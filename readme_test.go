package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// readmeBlock returns the README text between <!-- name:begin --> and <!-- name:end -->.
func readmeBlock(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start := strings.Index(s, "<!-- "+name+":begin -->")
	end := strings.Index(s, "<!-- "+name+":end -->")
	if start < 0 || end < start {
		t.Fatalf("README.md has no %s block", name)
	}
	return s[start:end]
}

// checkDocumented fails the test unless the first column of the README's table in the
// block ("flags") holds exactly the names the binary has ("accepted"), each as re's first
// group.
func checkDocumented(t *testing.T, block string, re *regexp.Regexp, has string, names []string) {
	t.Helper()
	var documented []string
	for line := range strings.Lines(readmeBlock(t, block)) {
		if cols := strings.Split(line, "|"); len(cols) >= 3 {
			if m := re.FindStringSubmatch(cols[1]); m != nil {
				documented = append(documented, m[1])
			}
		}
	}
	var undocumented, unknown []string
	for _, x := range names {
		if !slices.Contains(documented, x) {
			undocumented = append(undocumented, x)
		}
	}
	for _, x := range documented {
		if !slices.Contains(names, x) {
			unknown = append(unknown, x)
		}
	}
	slices.Sort(undocumented)
	slices.Sort(unknown)
	if len(undocumented) > 0 || len(unknown) > 0 {
		t.Fatalf("README %s out of step: %s but undocumented %v; documented but not %[2]s %[4]v", block, has, undocumented, unknown)
	}
}

// The configuration reference lists exactly the flags the binary accepts.
func TestReadmeFlagsMatchTheBinary(t *testing.T) {
	app, _ := newApp(io.Discard)
	var accepted []string
	for _, f := range app.Model().Flags {
		if !f.Hidden && !slices.Contains(kingpinFlags, f.Name) {
			accepted = append(accepted, f.Name)
		}
	}
	checkDocumented(t, "flags", regexp.MustCompile("`--(?:\\[no-\\])?([a-z0-9_.-]+)`"), "accepted", accepted)
}

// The metrics reference lists exactly the pg_liveness_* metrics the binary exposes: those
// of the collectors' scenario (asserted exactly by collector/scenario_test.go) and those
// a real run of the binary shows, with a DSN and with --config.file.
func TestReadmeMetricsMatchTheExporter(t *testing.T) {
	exposed, err := exposition.FileMetricNames("collector/testdata/scenario.prom")
	if err != nil {
		t.Fatal(err)
	}
	db := pgtest.NewDB(t)
	p := startExporter(t, []string{"DATA_SOURCE_NAME=" + db.DSN})
	live, err := exposition.MetricNames(p.waitFor(t, `(?m)^pg_liveness_agent_alive_lock_held 1$`, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// And those of an exporter of many databases (--config.file), on the same database,
	// with a discover entry (of a server that is not there: its gauges say so).
	dir := t.TempDir()
	targets := writeFile(t, dir, "targets.yml", "targets:\n  main: {dsn_file: "+writeFile(t, dir, "dsn", db.DSN+"\n")+"}\n"+
		"credentials:\n  c: {user: nobody}\ndiscover:\n  gone: {host: 127.0.0.1, port: 1, credentials: c}\n")
	multi, err := exposition.MetricNames(startExporter(t, nil, "--no-agent", "--config.file="+targets).
		waitFor(t, `(?m)^pg_liveness_exporter_discover_entry_up\{entry="gone"\} 0$`, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// And those of a node agent, whose own agent holds its lock through it.
	node, err := exposition.MetricNames(startExporter(t, []string{"DATA_SOURCE_NAME=" + db.DSN},
		"--node-agent.socket="+filepath.Join(dir, "node.sock")).
		waitFor(t, `(?m)^pg_liveness_node_agent_locks_held 1$`, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, set := range []map[string]bool{live, multi, node} {
		for n := range set {
			exposed[n] = true
		}
	}
	for n := range exposed {
		if strings.HasPrefix(n, "pg_liveness_") {
			names = append(names, n)
		}
	}
	checkDocumented(t, "metrics", regexp.MustCompile("`(pg_liveness_[a-z_]+)`"), "exposed", names)
}

// TestReadmeQuotesTheShutdownBudget: the README's number for the agent's SIGTERM
// clean-up is the library's ShutdownBudget with the binary's defaults (its flags default
// to the library's; the wind-down and the row's timeout have no flag).
func TestReadmeQuotesTheShutdownBudget(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("\\((\\d+) s together, `liveness\\.AgentConfig\\.ShutdownBudget`\\)")
	m := re.FindSubmatch(b)
	if m == nil {
		t.Fatalf("README.md quotes no shutdown budget (%s)", re)
	}
	budget := liveness.AgentConfig{Reaper: true}.ShutdownBudget()
	if quoted := string(m[1]) + "s"; quoted != fmt.Sprintf("%.0fs", budget.Seconds()) {
		t.Fatalf("README.md quotes a shutdown budget of %s; the agent's is %s with the binary's defaults", quoted, budget)
	}
}

// TestReadmeEmbeddingBuilds compiles the README's embedding program as it is written,
// against this module, so the documented API cannot drift from the real one.
func TestReadmeEmbeddingBuilds(t *testing.T) {
	block := readmeBlock(t, "embedding")
	start := strings.Index(block, "```go\n")
	end := strings.LastIndex(block, "```")
	if start < 0 || end <= start {
		t.Fatal("the README's embedding block has no Go code")
	}
	code := block[start+len("```go\n") : end]
	// A folder inside the module, so that the program builds against this checkout.
	dir, err := os.MkdirTemp(".", "readme-embedding-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.WriteFile(dir+"/main.go", []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "vet", "./"+dir).CombinedOutput()
	if err != nil {
		t.Fatalf("the README's embedding program does not build: %v\n%s", err, out)
	}
}
