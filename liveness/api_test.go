package liveness_test

import (
	"context"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/liveness"
	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

const module = "github.com/pg-liveness/pg_liveness_exporter"

// userPackages are the packages of this module a service imports: this one, and
// migrations to apply the schema.
var userPackages = []string{module + "/liveness", module + "/migrations"}

// The library is one package for its users: what `go doc -all` shows of it names no
// other package of this module but migrations, neither by import path, nor as a
// qualified name (store.Timing), nor as "package store"; nor the words store and logging,
// the internal packages it is built on.
func TestAPINamesNoOtherPackage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	doc, err := exec.CommandContext(ctx, "go", "doc", "-all", ".").Output()
	if err != nil {
		t.Fatalf("go doc -all: %v", err)
	}
	list, err := exec.CommandContext(ctx, "go", "list", "-f", "{{.ImportPath}} {{.Name}}", module+"/...").Output()
	if err != nil {
		var stderr []byte
		if exit, ok := err.(*exec.ExitError); ok {
			stderr = exit.Stderr
		}
		t.Fatalf("go list: %v\n%s", err, stderr)
	}
	var names []string
	for line := range strings.Lines(string(list)) {
		path, name, _ := strings.Cut(strings.TrimSpace(line), " ")
		if name != "main" && !slices.Contains(userPackages, path) {
			names = append(names, regexp.QuoteMeta(name))
		}
	}
	if len(names) < 10 || !strings.Contains(strings.Join(names, " "), "store") {
		t.Fatalf("go list found only these packages of the module: %v", names)
	}
	forbidden := []*regexp.Regexp{
		regexp.MustCompile(regexp.QuoteMeta(module) + `/[\w./-]*`),
		regexp.MustCompile(`\b(` + strings.Join(names, "|") + `)\.[A-Za-z_]\w*`),
		regexp.MustCompile(`\bpackage (` + strings.Join(names, "|") + `)\b`),
		regexp.MustCompile(`\b(store|logging)\b`),
	}
lines:
	for n, line := range strings.Split(string(doc), "\n") {
		for _, re := range forbidden {
			for _, m := range re.FindAllString(line, -1) {
				if !slices.Contains(userPackages, strings.TrimRight(m, ".")) {
					t.Errorf("go doc -all line %d names %q, another package of this module:\n\t%s", n+1, m, line)
					continue lines
				}
			}
		}
	}
}

// The runnable examples import only what a service imports: liveness and migrations.
// (Their tests may use the module's test kit.)
func TestExamplesImportOnlyTheLibrary(t *testing.T) {
	files, err := filepath.Glob("../examples/*/*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, spec := range f.Imports {
			path, _ := strconv.Unquote(spec.Path.Value)
			if (path == module || strings.HasPrefix(path, module+"/")) && !slices.Contains(userPackages, path) {
				t.Errorf("%s imports %s; an example imports only %s", file, path, strings.Join(userPackages, " and "))
			}
		}
	}
	if checked < 2 {
		t.Fatalf("found %d example programs in ../examples (%v)", checked, files)
	}
}

// The library's documented defaults cannot name the data layer's constants, nor the data
// layer import the library: the two definitions are held equal here.
func TestDefaultsAreTheDataLayers(t *testing.T) {
	if defaults.Schema != store.DefaultSchema || migrations.DefaultSchema != store.DefaultSchema {
		t.Errorf("defaults.Schema: liveness %q, migrations %q, the data layer %q", defaults.Schema, migrations.DefaultSchema, store.DefaultSchema)
	}
	if defaults.StaleThreshold != store.DefaultStaleThreshold || defaults.DefinitiveDeadCutoff != store.DefaultDefinitiveDeadCutoff {
		t.Errorf("the fallback: liveness %s and %s, the data layer %s and %s", defaults.StaleThreshold,
			defaults.DefinitiveDeadCutoff, store.DefaultStaleThreshold, store.DefaultDefinitiveDeadCutoff)
	}
}

// ReaderConfig carries the data layer's SourceConfig under the same field names (its
// Kind is whether Whizbang is set), and WhizbangSource its Whizbang, so that the one
// check of a source names ReaderConfig's fields, and a field added there cannot be
// forgotten here. (Timing and FleetQuery are converted, which the compiler checks.)
func TestReaderConfigCarriesTheSourceFields(t *testing.T) {
	// fields are a struct's fields, name and type, the library's and the data layer's
	// names of one type made the same.
	same := strings.NewReplacer("*", "", "store.", "", "liveness.", "", "WhizbangSource", "Whizbang")
	fields := func(v any) map[string]string {
		out := map[string]string{}
		for f := range reflect.TypeOf(v).Fields() {
			out[f.Name] = same.Replace(f.Type.String())
		}
		return out
	}
	reader := fields(liveness.ReaderConfig{})
	source := fields(store.SourceConfig{})
	if len(source) < 4 {
		t.Fatalf("store.SourceConfig has only %v", source)
	}
	for name, typ := range source {
		if name != "Kind" && reader[name] != typ {
			t.Errorf("store.SourceConfig has %s %s, liveness.ReaderConfig %s %q", name, typ, name, reader[name])
		}
	}
	if w, s := fields(liveness.WhizbangSource{}), fields(store.Whizbang{}); !reflect.DeepEqual(w, s) {
		t.Errorf("liveness.WhizbangSource has %v, store.Whizbang %v", w, s)
	}
}

// The layers, as the imports show them (each package's own, not its tests'): the library
// does not carry the node agent's server, which is the binary's, nor does the server
// depend on the library; the internal packages are below the library, except the
// binary's front ends, which configure and read it; the node agent's protocol is
// self-contained (both ends speak it); the alive lock, whose state machine the library
// runs and whose settings the node agent's server shares, knows neither of them; and the
// notifications (their encoding and the hub that wakes a process's waiters) import
// nothing of this module.
func TestLayers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "list", "-e", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", module+"/...")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if exit, ok := err.(*exec.ExitError); ok {
			stderr = exit.Stderr
		}
		t.Fatalf("go list: %v\n%s", err, stderr)
	}
	imports := map[string][]string{} // this module's packages, by their short path: the module's they import
	short := func(path string) string { return strings.TrimPrefix(strings.TrimPrefix(path, module), "/") }
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		var own []string
		for _, imp := range fields[1:] {
			if strings.HasPrefix(imp, module+"/") {
				own = append(own, short(imp))
			}
		}
		imports[short(fields[0])] = own
	}
	for _, p := range []string{"liveness", "internal/nodeagent", "internal/nodeagent/proto", "internal/alivelock", "internal/notify"} {
		if _, ok := imports[p]; !ok {
			t.Fatalf("go list did not list %s among %d packages", p, len(imports))
		}
	}
	// path is how from comes to import to, through this module's packages ("a → b → c"),
	// or "" when it does not.
	path := func(from, to string) string {
		prev := map[string]string{from: ""}
		queue := []string{from}
		for len(queue) > 0 {
			p := queue[0]
			queue = queue[1:]
			for _, next := range imports[p] {
				if _, seen := prev[next]; seen {
					continue
				}
				prev[next] = p
				if next == to {
					chain := []string{to}
					for at := p; at != ""; at = prev[at] {
						chain = append([]string{at}, chain...)
					}
					return strings.Join(chain, " → ")
				}
				queue = append(queue, next)
			}
		}
		return ""
	}
	if chain := path("liveness", "internal/nodeagent"); chain != "" {
		t.Errorf("the library imports the node agent's server, which is the binary's: %s", chain)
	}
	// No internal package imports the library, but the binary's command line and status
	// page, which sit above it: they configure it (AgentConfig) and read it (Reader,
	// AgentSnapshot). (The binary's parts that use the collectors, which read the library,
	// are above it too; they do not import it themselves.) The node agent's server and
	// everything it is built from do not depend on the library at all.
	frontEnds := []string{"internal/cli", "internal/status"}
	for p, imps := range imports {
		if strings.HasPrefix(p, "internal/") && !slices.Contains(frontEnds, p) && slices.Contains(imps, "liveness") {
			t.Errorf("%s imports liveness; the internal packages are below the library (but %v)", p, frontEnds)
		}
	}
	if chain := path("internal/nodeagent", "liveness"); chain != "" {
		t.Errorf("the node agent's server depends on the library: %s", chain)
	}
	for _, imp := range imports["internal/nodeagent/proto"] {
		if imp != "internal/defaults" {
			t.Errorf("internal/nodeagent/proto imports %s; the protocol imports nothing of this module but internal/defaults", imp)
		}
	}
	for _, imp := range imports["internal/notify"] {
		t.Errorf("internal/notify imports %s; the notifications' encoding and hub import nothing of this module", imp)
	}
	for _, above := range []string{"liveness", "internal/nodeagent"} {
		if chain := path("internal/alivelock", above); chain != "" {
			t.Errorf("internal/alivelock, the alive lock below the library and the server, imports %s: %s", above, chain)
		}
	}
	for _, shared := range []string{"internal/notify", "internal/nodeagent/proto"} {
		if chain := path(shared, "internal/nodeagent"); chain != "" {
			t.Errorf("%s, which the library shares with the node agent, imports the server: %s", shared, chain)
		}
	}
}
