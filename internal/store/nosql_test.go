package store_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// sqlText is a string that starts like a statement.
var sqlText = regexp.MustCompile(`^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|ALTER|DROP|TRUNCATE|GRANT|REVOKE)\s`)

// Every statement the product sends is in internal/store/sql/: no package that the binary or the
// library links holds SQL text of its own (their tests and the tools may).
func TestNoSQLOutsideTheStore(t *testing.T) {
	const module = "github.com/pg-liveness/pg_liveness_exporter"
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{join .GoFiles \" \"}}",
		module, module+"/liveness").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		parts := strings.SplitN(line, "\t", 3)
		if len(parts) != 3 || (parts[0] != module && !strings.HasPrefix(parts[0], module+"/")) || parts[0] == module+"/internal/store" {
			continue
		}
		for _, name := range strings.Fields(parts[2]) {
			f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(parts[1], name), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			checked++
			file := strings.TrimPrefix(parts[0]+"/", module+"/") + name
			ast.Inspect(f, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				if s, err := strconv.Unquote(lit.Value); err == nil && sqlText.MatchString(s) {
					t.Errorf("%s holds SQL of its own; put it in internal/store/sql/: %.60q", file, s)
				}
				return true
			})
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d files of the product's packages; go list gave:\n%s", checked, out)
	}
}
