package sqltag

import (
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"regexp"
	"slices"
	"testing"
)

// Every constant of the tags' file is a well-formed tag, listed in All exactly once, and
// no two tags share a name.
func TestEveryTagIsListedOnce(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "sqltag.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	wellFormed := regexp.MustCompile(`^/\* pg_liveness:[a-z][a-z_]*[a-z] \*/$`)
	var consts []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			for i, n := range s.(*ast.ValueSpec).Names {
				lit, ok := s.(*ast.ValueSpec).Values[i].(*ast.BasicLit)
				if !ok {
					t.Fatalf("%s is not a string literal", n.Name)
				}
				v := constant.StringVal(constant.MakeFromLiteral(lit.Value, lit.Kind, 0))
				if n.Name == "Prefix" {
					continue
				}
				if !wellFormed.MatchString(v) {
					t.Errorf("%s = %q: want /* pg_liveness:<name> */", n.Name, v)
				}
				consts = append(consts, v)
			}
		}
	}
	if len(consts) == 0 {
		t.Fatal("no tag constants found")
	}
	names := map[string]int{}
	for _, tag := range All {
		names[Name(tag)]++
	}
	for _, c := range consts {
		if n := names[Name(c)]; n != 1 {
			t.Errorf("%s is listed %d times in All, want once", c, n)
		}
	}
	if len(All) != len(consts) {
		t.Errorf("All has %d tags, the file declares %d", len(All), len(consts))
	}
	if !slices.Contains(All, Heartbeat) || Name(Heartbeat) != "heartbeat" {
		t.Errorf("Name(%q) = %q", Heartbeat, Name(Heartbeat))
	}
}
