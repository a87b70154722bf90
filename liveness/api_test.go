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

// libraryLayers are the library's packages and what it is built from, bottom up: a
// package may import, of this module, only packages of a lower layer. The library is the
// facade users import; the node agent's server sits beside it, built from the same
// layers, and neither imports the other. The binary's packages (the collectors, the
// command line, the status page, ...) are above every layer: they may import any of them,
// and none of them may import one of the binary's.
var libraryLayers = [][]string{
	// Leaves: the shared defaults, the pure life gate (evidence and time in, a verdict
	// out), the notifications and the hub that hands them to a process's waiters, the
	// node agent's protocol (both ends speak it), and the redacting logger.
	{"internal/defaults", "internal/lifegate", "internal/notify", "internal/nodeagent/proto", "internal/logging"},
	{"internal/store"}, // the data layer: every statement and row
	// The alive lock (on the agent's own session or through a node agent); the leases and
	// their fence, which hold no connection and know nothing of the alive lock (the facade
	// hands them its life gate); the schema.
	{"internal/alivelock", "internal/lease", "migrations"},
	{"liveness", "internal/nodeagent"}, // the facade; the node agent's server, the binary's
}

// TestLayers: the imports show the layers (each package's own imports, not its tests'):
// nothing imports a package of its own layer or of one above it.
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
	layer := map[string]int{}
	for i, pkgs := range libraryLayers {
		for _, p := range pkgs {
			if _, ok := imports[p]; !ok {
				t.Fatalf("go list did not list %s among %d packages", p, len(imports))
			}
			layer[p] = i
		}
	}
	for p, l := range layer {
		for _, imp := range imports[p] {
			switch il, ok := layer[imp]; {
			case !ok:
				t.Errorf("%s (layer %d) imports %s, which is in no layer below it: the binary's, or new (add it to libraryLayers)", p, l, imp)
			case il >= l:
				t.Errorf("%s (layer %d) imports %s (layer %d): an import runs sideways or back up", p, l, imp, il)
			}
		}
	}
}
