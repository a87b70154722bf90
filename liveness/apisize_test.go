package liveness_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/defaults"
)

// maxAPINames bounds the library's public API: top-level types, functions, constants and
// variables, and the methods of exported types. Every name is one more thing a user
// must learn and one more promise to keep; a new one should replace one.
const maxAPINames = 80

// apiDecl is one public name of the package and whether it has a doc comment.
type apiDecl struct {
	name       string
	documented bool
}

// packageAPI parses the package's non-test files and lists its public names.
func packageAPI(t *testing.T) []apiDecl {
	t.Helper()
	fset := token.NewFileSet()
	files, err := parsePackage(fset)
	if err != nil {
		t.Fatal(err)
	}
	exportedTypes := map[string]bool{}
	for _, f := range files {
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok {
				for _, s := range g.Specs {
					if ts, ok := s.(*ast.TypeSpec); ok && ts.Name.IsExported() {
						exportedTypes[ts.Name.Name] = true
					}
				}
			}
		}
	}
	var api []apiDecl
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				name := d.Name.Name
				if d.Recv != nil {
					recv := d.Recv.List[0].Type
					if star, ok := recv.(*ast.StarExpr); ok {
						recv = star.X
					}
					id, ok := recv.(*ast.Ident)
					if !ok || !exportedTypes[id.Name] {
						continue
					}
					name = id.Name + "." + name
				}
				api = append(api, apiDecl{name, d.Doc != nil})
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							api = append(api, apiDecl{s.Name.Name, d.Doc != nil || s.Doc != nil})
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								api = append(api, apiDecl{n.Name, d.Doc != nil || s.Doc != nil || s.Comment != nil})
							}
						}
					}
				}
			}
		}
	}
	slices.SortFunc(api, func(a, b apiDecl) int { return strings.Compare(a.name, b.name) })
	return api
}

// parsePackage parses the package's non-test Go files in the working directory.
func parsePackage(fset *token.FileSet) ([]*ast.File, error) {
	entries, err := os.ReadDir(".")
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, e.Name(), nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// TestAPIStaysSmallAndDocumented: the public API has at most maxAPINames names, and each
// has a doc comment (a constant or variable may share its group's).
func TestAPIStaysSmallAndDocumented(t *testing.T) {
	api := packageAPI(t)
	if len(api) < 40 || !slices.ContainsFunc(api, func(d apiDecl) bool { return d.name == "Agent.Elect" }) {
		t.Fatalf("the count found %d names, without Agent.Elect: it does not read the package", len(api))
	}
	var names []string
	for _, d := range api {
		names = append(names, d.name)
		if !d.documented {
			t.Errorf("%s has no doc comment: say what it is and what it guarantees", d.name)
		}
	}
	if len(api) > maxAPINames {
		t.Errorf("the public API has %d names, more than %d: %s", len(api), maxAPINames, strings.Join(names, ", "))
	}
}

// TestDocumentedDefaultsAreTheDefaults: a config field's comment says what zero takes, as
// a figure; that figure must be the value the library takes, so that neither can change
// without the other.
func TestDocumentedDefaultsAreTheDefaults(t *testing.T) {
	files, err := parsePackage(token.NewFileSet())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		field string // Type.Field
		value time.Duration
	}{
		{"AgentConfig.VerifyInterval", defaults.VerifyInterval},
		{"AgentConfig.KeepaliveIdle", defaults.KeepaliveIdle},
		{"AgentConfig.KeepaliveInterval", defaults.KeepaliveInterval},
		{"AgentConfig.UserTimeout", defaults.UserTimeout},
		{"AgentConfig.ReaperInterval", defaults.ReaperInterval},
		{"AgentConfig.ReaperLeaseTTL", defaults.ReaperLeaseTTL},
		{"AgentConfig.HistoryRetention", defaults.HistoryRetention},
		{"AgentConfig.JobWindDown", defaults.JobWindDown},
		{"AgentConfig.ShutdownTimeout", defaults.ShutdownTimeout},
		{"AgentConfig.DuplicateTimeout", defaults.DuplicateTimeout},
		{"Timing.HeartbeatInterval", defaults.HeartbeatInterval},
		{"Timing.HeartbeatSlowInterval", defaults.HeartbeatSlowInterval},
		{"Timing.StaleThreshold", defaults.StaleThreshold},
		{"Timing.DefinitiveDeadCutoff", defaults.DefinitiveDeadCutoff},
		{"Timing.LockGrace", defaults.LockGrace},
		{"ElectorConfig.TTL", defaults.ElectorTTL},
		{"ElectorConfig.RetryPeriod", defaults.ElectorRetryPeriod},
		{"ElectorConfig.QuietPeriod", defaults.ElectorQuietPeriod},
		{"ShardsConfig.TTL", defaults.ElectorTTL},
		{"ShardsConfig.PollPeriod", defaults.ShardsPollPeriod},
	} {
		doc := fieldDoc(t, files, c.field)
		if !slices.Contains(durationFigures(doc), c.value) {
			t.Errorf("%s's comment gives %v, not the default %s: %q", c.field, durationFigures(doc), c.value, doc)
		}
	}
	if doc := fieldDoc(t, files, "AgentConfig.KeepaliveCount"); !strings.Contains(doc, strconv.Itoa(defaults.KeepaliveCount)+" probes") {
		t.Errorf("AgentConfig.KeepaliveCount's comment does not give the default %d probes: %q", defaults.KeepaliveCount, doc)
	}
	if doc := fieldDoc(t, files, "AgentConfig.Schema"); !strings.Contains(doc, strconv.Quote(defaults.Schema)) {
		t.Errorf("AgentConfig.Schema's comment does not give the default %q: %q", defaults.Schema, doc)
	}
}

// figure is a duration as the comments write one: "250 ms", "30 s", "2 min", "7 days".
var figure = regexp.MustCompile(`\b(\d+(?:\.\d+)?) (ms|s|min|h|days?)\b`)

// durationFigures lists the durations a comment gives.
func durationFigures(doc string) []time.Duration {
	unit := map[string]time.Duration{"ms": time.Millisecond, "s": time.Second, "min": time.Minute, "h": time.Hour,
		"day": 24 * time.Hour, "days": 24 * time.Hour}
	var out []time.Duration
	for _, m := range figure.FindAllStringSubmatch(doc, -1) {
		n, err := strconv.ParseFloat(m[1], 64)
		if err == nil {
			out = append(out, time.Duration(n*float64(unit[m[2]])))
		}
	}
	return out
}

// fieldDoc is the comment of a struct field, or of the group it is declared in (fields
// declared together under one comment, or on one line, share it).
func fieldDoc(t *testing.T, files []*ast.File, typeField string) string {
	t.Helper()
	typeName, fieldName, _ := strings.Cut(typeField, ".")
	for _, f := range files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok {
				continue
			}
			for _, s := range g.Specs {
				ts, ok := s.(*ast.TypeSpec)
				if !ok || ts.Name.Name != typeName {
					continue
				}
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					t.Fatalf("%s is not a struct", typeName)
				}
				group := ""
				for _, fl := range st.Fields.List {
					if fl.Doc != nil {
						group = fl.Doc.Text()
					} else if fl.Comment != nil {
						group = fl.Comment.Text()
					}
					for _, n := range fl.Names {
						if n.Name == fieldName {
							return group
						}
					}
					if fl.Doc == nil && fl.Comment == nil {
						continue // a field without a comment of its own stays in the group above
					}
				}
				t.Fatalf("%s has no field %s", typeName, fieldName)
			}
		}
	}
	t.Fatalf("no type %s", typeName)
	return ""
}
