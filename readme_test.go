package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/pg-liveness/pg_liveness_exporter/internal/cli"
	"github.com/pg-liveness/pg_liveness_exporter/internal/exposition"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

// docBlock returns the text of the Markdown file at path (relative to the repository's
// root) between <!-- name:begin --> and <!-- name:end -->.
func docBlock(t *testing.T, path, name string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start := strings.Index(s, "<!-- "+name+":begin -->")
	end := strings.Index(s, "<!-- "+name+":end -->")
	if start < 0 || end < start {
		t.Fatalf("%s has no %s block", path, name)
	}
	return s[start:end]
}

// checkDocumented fails the test unless the first column of the table in the block of
// the Markdown file at path ("flags" of docs/configuration.md) holds exactly the names
// the binary has ("accepted"), each as re's first group.
func checkDocumented(t *testing.T, path, block string, re *regexp.Regexp, has string, names []string) {
	t.Helper()
	var documented []string
	for line := range strings.Lines(docBlock(t, path, block)) {
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
		t.Fatalf("%s's %s out of step: %s but undocumented %v; documented but not %[3]s %[5]v", path, block, has, undocumented, unknown)
	}
}

// The configuration reference (docs/configuration.md) lists exactly the flags the binary
// accepts.
func TestDocsFlagsMatchTheBinary(t *testing.T) {
	app, _ := cli.NewApp(io.Discard)
	var accepted []string
	for _, f := range app.Model().Flags {
		if !f.Hidden && !slices.Contains(cli.KingpinFlags, f.Name) {
			accepted = append(accepted, f.Name)
		}
	}
	checkDocumented(t, "docs/configuration.md", "flags", regexp.MustCompile("`--(?:\\[no-\\])?([a-z0-9_.-]+)`"), "accepted", accepted)
}

// The metrics reference (docs/metrics.md) lists exactly the pg_liveness_* metrics the
// binary exposes: those
// of the collectors' scenario (asserted exactly by collector/scenario_test.go) and those a
// real run of the binary shows, with a DSN and with --config.file.
func TestDocsMetricsMatchTheExporter(t *testing.T) {
	t.Parallel()
	exposed, err := exposition.FileMetricNames("collector/testdata/scenario.prom")
	if err != nil {
		t.Fatal(err)
	}
	history, err := exposition.FileMetricNames("collector/testdata/history.prom") // the failovers' histograms
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(exposed, history)
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
		// A histogram is documented once, by its family's name, not its samples'.
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")
		if strings.HasPrefix(n, "pg_liveness_") && (base == n || !exposed[base]) {
			names = append(names, n)
		}
	}
	checkDocumented(t, "docs/metrics.md", "metrics", regexp.MustCompile("`(pg_liveness_[a-z_]+)`"), "exposed", names)
}

// TestDocsEmbeddingBuilds compiles the library guide's whole program (docs/library.md) as
// it is written, against this module, so the documented API cannot drift from the real one.
func TestDocsEmbeddingBuilds(t *testing.T) {
	vetProgram(t, "docs/library.md's embedding program", goBlock(t, "docs/library.md", "embedding"))
}

// TestReadmeEmbeddingBuilds compiles the README's embedding snippet, a function and the
// job it runs, with readmeSnippetImports before it: the snippet as it is written, against
// this module.
func TestReadmeEmbeddingBuilds(t *testing.T) {
	vetProgram(t, "the README's embedding snippet", readmeSnippetImports+goBlock(t, "README.md", "embedding")+"\nfunc main() {}\n")
}

// readmeSnippetImports is what the README's embedding snippet may use without showing
// its imports. Each package is named once below, so that one the snippet does not use is
// no error.
const readmeSnippetImports = `package main

import (
	"context"
	"errors"
	"log"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pg-liveness/pg_liveness_exporter/liveness"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

var (
	_ = context.Background
	_ = errors.New
	_ = log.Print
	_ = os.Getenv
	_ sync.WaitGroup
	_ time.Duration
	_ = uuid.New
	_ pgx.Tx
	_ *pgxpool.Pool
	_ = liveness.NewAgent
	_ = migrations.Apply
)

`

// goBlock returns the Go code of the named block of the Markdown file at path.
func goBlock(t *testing.T, path, name string) string {
	t.Helper()
	block := docBlock(t, path, name)
	start := strings.Index(block, "```go\n")
	end := strings.LastIndex(block, "```")
	if start < 0 || end <= start {
		t.Fatalf("the %s block of %s has no Go code", name, path)
	}
	return block[start+len("```go\n") : end]
}

// vetProgram builds (go vet) the Go program code in a folder inside the module, so that
// it builds against this checkout. The folder's name starts with "_", which ./... never
// matches: other packages' tests list the module while this one runs, and a half-written
// main.go would fail them.
func vetProgram(t *testing.T, what, code string) {
	t.Helper()
	dir, err := os.MkdirTemp(".", "_readme-embedding-")
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
		t.Fatalf("%s does not build: %v\n%s", what, err, out)
	}
}

// The README is the front door: what it is, why, how to start, run, embed and deploy it,
// and links. The reference lives in docs/.
func TestReadmeIsAFrontDoor(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(string(b), "\n"); lines > 500 {
		t.Errorf("README.md has %d lines, at most 500: move reference to docs/", lines)
	}
	var sections []string
	for _, h := range markdownHeadings(string(b)) {
		if h.level == 2 {
			sections = append(sections, h.text)
		}
	}
	if len(sections) > 10 {
		t.Errorf("README.md has %d ## sections, at most 10: %q", len(sections), sections)
	}
}

// Every relative link of README.md and docs/*.md names a file or folder of the
// repository, and its #anchor, if any, a heading of that Markdown file as GitHub names it.
func TestDocsLinksResolve(t *testing.T) {
	files, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{"README.md"}, files...)
	anchors := map[string]map[string]bool{} // by file, read once
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		a := map[string]bool{}
		seen := map[string]int{}
		for _, h := range markdownHeadings(string(b)) {
			id := gitHubAnchor(h.text)
			if n := seen[id]; n > 0 {
				a[fmt.Sprintf("%s-%d", id, n)] = true
			} else {
				a[id] = true
			}
			seen[id]++
		}
		anchors[path] = a
		return a
	}
	links := 0
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range markdownLinks(string(b)) {
			if regexp.MustCompile(`^[a-z][a-z0-9+.-]*:`).MatchString(l.target) {
				continue // a URL
			}
			links++
			path, anchor, _ := strings.Cut(l.target, "#")
			where := fmt.Sprintf("%s:%d: link %q", file, l.line, l.target)
			switch {
			case strings.HasPrefix(path, "/"):
				t.Errorf("%s: an absolute path; write it relative to %s", where, filepath.Dir(file))
				continue
			case path == "":
				path = file
			default:
				path = filepath.Join(filepath.Dir(file), path)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s: no such file: %v", where, err)
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(path, ".md") {
				t.Errorf("%s: an anchor into %s, which is not Markdown", where, path)
			} else if !anchorsOf(path)[anchor] {
				t.Errorf("%s: %s has no heading whose anchor is #%s", where, path, anchor)
			}
		}
	}
	if links == 0 {
		t.Fatal("no relative link found: the link reader is broken")
	}
}

// markdownHeading is an ATX heading ("## Title") outside fenced code blocks.
type markdownHeading struct {
	level int
	text  string
}

type markdownLink struct {
	line   int
	target string
}

// markdownHeadings returns the headings of a Markdown text, in order.
func markdownHeadings(md string) []markdownHeading {
	var hs []markdownHeading
	forEachProseLine(md, func(_ int, line string) {
		level := len(line) - len(strings.TrimLeft(line, "#"))
		if level >= 1 && level <= 6 && strings.HasPrefix(line[level:], " ") {
			hs = append(hs, markdownHeading{level, strings.TrimSpace(line[level:])})
		}
	})
	return hs
}

var (
	inlineCodeRE   = regexp.MustCompile("`[^`]*`")
	markdownLinkRE = regexp.MustCompile(`\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
)

// markdownLinks returns the targets of the inline links and images of a Markdown text,
// outside fenced code blocks and code spans.
func markdownLinks(md string) []markdownLink {
	var ls []markdownLink
	forEachProseLine(md, func(n int, line string) {
		for _, m := range markdownLinkRE.FindAllStringSubmatch(inlineCodeRE.ReplaceAllString(line, ""), -1) {
			ls = append(ls, markdownLink{n, m[1]})
		}
	})
	return ls
}

// forEachProseLine calls f with each line (numbered from 1) outside fenced code blocks.
func forEachProseLine(md string, f func(n int, line string)) {
	fence := ""
	for i, line := range strings.Split(md, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		if fence == "" && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")) {
			fence = trimmed[:3]
			continue
		}
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		f(i+1, line)
	}
}

// gitHubAnchor is the anchor GitHub gives a heading: its text without markup, lower-cased,
// spaces as "-", and every character but letters, digits, "-" and "_" dropped.
func gitHubAnchor(heading string) string {
	text := regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
