package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
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

// firstColumnNames collects the `names` in the first column of a Markdown table.
func firstColumnNames(block string, re *regexp.Regexp) []string {
	var names []string
	sc := bufio.NewScanner(strings.NewReader(block))
	for sc.Scan() {
		cols := strings.Split(sc.Text(), "|")
		if len(cols) < 3 {
			continue
		}
		if m := re.FindStringSubmatch(cols[1]); m != nil {
			names = append(names, m[1])
		}
	}
	sort.Strings(names)
	return names
}

func diff(a, b []string) (onlyA, onlyB []string) {
	for _, x := range a {
		if !slices.Contains(b, x) {
			onlyA = append(onlyA, x)
		}
	}
	for _, x := range b {
		if !slices.Contains(a, x) {
			onlyB = append(onlyB, x)
		}
	}
	return onlyA, onlyB
}

// The configuration reference lists exactly the flags the binary accepts.
func TestReadmeFlagsMatchTheBinary(t *testing.T) {
	app, _ := newApp(io.Discard)
	var accepted []string
	for _, f := range app.Model().Flags {
		switch f.Name {
		case "help", "help-long", "help-man", "version", "completion-bash", "completion-script-bash", "completion-script-zsh":
			continue
		}
		if f.Hidden {
			continue
		}
		accepted = append(accepted, f.Name)
	}
	sort.Strings(accepted)
	documented := firstColumnNames(readmeBlock(t, "flags"), regexp.MustCompile("`--(?:\\[no-\\])?([a-z0-9_.-]+)`"))
	undocumented, unknown := diff(accepted, documented)
	if len(undocumented) > 0 || len(unknown) > 0 {
		t.Fatalf("README flags out of step: accepted but undocumented %v; documented but not accepted %v", undocumented, unknown)
	}
}

// The metrics reference lists exactly the pg_liveness_* metrics the binary exposes: those
// of the collectors' scenario (asserted exactly by collector/scenario_test.go) and those
// a real run of the binary shows.
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
	var names []string
	for n := range live {
		exposed[n] = true
	}
	for n := range exposed {
		if strings.HasPrefix(n, "pg_liveness_") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	documented := firstColumnNames(readmeBlock(t, "metrics"), regexp.MustCompile("`(pg_liveness_[a-z_]+)`"))
	undocumented, unknown := diff(names, documented)
	if len(undocumented) > 0 || len(unknown) > 0 {
		t.Fatalf("README metrics out of step: exposed but undocumented %v; documented but not exposed %v", undocumented, unknown)
	}
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
