package liveness

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/lease"
)

// Every error this package writes starts with "liveness: ", then says the part or the
// operation ("liveness: alive lock: ...", "liveness: acquire lease ..."): errors.New and
// fmt.Errorf with a literal text that starts so, or fmt.Errorf("%w: ...", errX) that
// starts with a sentinel of this package (whose own text is checked here too). The one
// exception is a cause written to sit inside another error of the package, as a
// FencedError's Err. So do the errors of its leases (internal/lease), of the internal
// packages its alive lock shares with the node agent, and of the node agent's server,
// whose errors reach the same logs.
func TestErrorsStartWithLiveness(t *testing.T) {
	var files []string
	for _, dir := range []string{".", "../internal/lease", "../internal/alivelock", "../internal/notify",
		"../internal/nodeagent", "../internal/nodeagent/proto"} {
		matched, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(matched) == 0 {
			t.Fatalf("no Go files in %s: %v", dir, err)
		}
		files = append(files, matched...)
	}
	fset := token.NewFileSet()
	var parsed []*ast.File
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, f)
	}
	// The package's sentinels: package-level variables whose value is errors.New(...).
	sentinels := map[string]bool{}
	for _, f := range parsed {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, spec := range g.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, v := range vs.Values {
					if isCall(v, "errors", "New") {
						sentinels[vs.Names[i].Name] = true
					}
				}
			}
		}
	}
	if len(sentinels) < 10 || !sentinels["ErrLeaseLost"] {
		t.Fatalf("found only these sentinels: %v", sentinels)
	}
	// internal/lease wraps this package's sentinels, which it holds as the fields of its
	// Errors (le.leases.errs.Lost): those fields count as sentinels, and hold this
	// package's.
	for name, e := range map[string]error{"Held": leaseErrors.Held, "Lost": leaseErrors.Lost, "Released": leaseErrors.Released} {
		if e != ErrLeaseHeld && e != ErrLeaseLost && e != ErrLeaseReleased {
			t.Errorf("lease.Errors.%s is %v, not a sentinel of this package", name, e)
		}
		sentinels[name] = true
	}

	checked := 0
	for _, f := range parsed {
		// Calls that are the Err of a composite literal: causes inside another error.
		causes := map[ast.Expr]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			if kv, ok := n.(*ast.KeyValueExpr); ok {
				if key, ok := kv.Key.(*ast.Ident); ok && key.Name == "Err" {
					causes[kv.Value] = true
				}
			}
			return true
		})
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || !(isCall(call, "errors", "New") || isCall(call, "fmt", "Errorf")) || causes[call] {
				return true
			}
			checked++
			at := fset.Position(call.Pos())
			text, ok := literal(call.Args[0])
			switch {
			case !ok:
				t.Errorf("%s: an error whose text is not a literal: the convention cannot be checked", at)
			case strings.HasPrefix(text, "liveness: "):
			case strings.HasPrefix(text, "%w") && isCall(call, "fmt", "Errorf") && len(call.Args) > 1 && isSentinel(call.Args[1], sentinels):
			default:
				t.Errorf("%s: error %q does not start with \"liveness: \" (or with a sentinel of the package, %%w first)", at, text)
			}
			return true
		})
	}
	if checked < 40 {
		t.Fatalf("checked %d errors; the package writes more", checked)
	}

	// The package's error types say it too.
	types := map[string]error{
		"ConfigError":    &ConfigError{Field: "X.Y", Reason: "must be set"},
		"LeaseLostError": &LeaseLostError{Name: "jobs", Epoch: 1, Reason: lease.ReasonTaken},
		"FencedError":    &FencedError{Lease: "jobs", Epoch: 1},
		"HeldError":      &lease.HeldError{Err: ErrLeaseHeld},
		"Loss":           &lease.Loss{Name: "jobs", Epoch: 1, Reason: lease.ReasonTaken},
	}
	// Causes that only ever travel inside a LeaseLostError (its Err): the wrapper says
	// "liveness: ", so they must not say it again.
	causes := map[string]error{
		"OutlivedError": &lease.OutlivedError{},
	}
	var found []string
	for _, f := range parsed {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || fd.Name.Name != "Error" {
				continue
			}
			recv := fd.Recv.List[0].Type
			if star, ok := recv.(*ast.StarExpr); ok {
				recv = star.X
			}
			found = append(found, recv.(*ast.Ident).Name)
		}
	}
	slices.Sort(found)
	var want []string
	for name, e := range types {
		want = append(want, name)
		if !strings.HasPrefix(e.Error(), "liveness: ") {
			t.Errorf("%s's Error() = %q, want it to start with \"liveness: \"", name, e.Error())
		}
	}
	for name, e := range causes {
		want = append(want, name)
		if strings.HasPrefix(e.Error(), "liveness: ") {
			t.Errorf("%s's Error() = %q: it is wrapped by LeaseLostError, which already starts with \"liveness: \"", name, e.Error())
		}
		wrapped := (&LeaseLostError{Name: "jobs", Epoch: 1, Reason: lease.ReasonExpired, Err: e}).Error()
		if strings.Count(wrapped, "liveness: ") != 1 {
			t.Errorf("a LeaseLostError wrapping %s reads %q", name, wrapped)
		}
	}
	slices.Sort(want)
	if !slices.Equal(found, want) {
		t.Errorf("the package's error types are %v; this test checks %v", found, want)
	}
}

func isCall(e ast.Expr, pkg, name string) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != name {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == pkg
}

// isSentinel reports whether e names one of sentinels, as errX or, from another of the
// packages checked, pkg.ErrX.
func isSentinel(e ast.Expr, sentinels map[string]bool) bool {
	if sel, ok := e.(*ast.SelectorExpr); ok {
		e = sel.Sel
	}
	id, ok := e.(*ast.Ident)
	return ok && sentinels[id.Name]
}

// literal is the text of a string literal or of a concatenation of them.
func literal(e ast.Expr) (string, bool) {
	switch x := e.(type) {
	case *ast.BasicLit:
		if x.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(x.Value)
		return s, err == nil
	case *ast.BinaryExpr:
		if x.Op != token.ADD {
			return "", false
		}
		l, ok1 := literal(x.X)
		r, ok2 := literal(x.Y)
		return l + r, ok1 && ok2
	case *ast.ParenExpr:
		return literal(x.X)
	}
	return "", false
}
