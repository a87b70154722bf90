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
