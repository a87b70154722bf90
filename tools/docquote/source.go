package docquote

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// timeUnits are the time package's units a constant is written in.
var timeUnits = map[string]time.Duration{
	"Nanosecond": time.Nanosecond, "Microsecond": time.Microsecond, "Millisecond": time.Millisecond,
	"Second": time.Second, "Minute": time.Minute, "Hour": time.Hour,
}

// SourceValue is the value of a package-level constant or variable of the repository's
// code as its declaration writes it, for a setting the docs quote that the code keeps
// unexported (the library's public API stays as small as it is for it). dir is the
// package's directory under root. It reads declarations of integers and durations
// written with literals, the time package's units, conversions, <<, *, /, +, - and other
// such declarations of the same package or of internal/defaults; anything else is an
// error, never a guess.
func SourceValue(root, dir, name string) (any, error) {
	r := sourceReader{root: root, files: map[string][]*ast.File{}}
	v, err := r.lookup(dir, name, 0)
	if err != nil {
		return nil, fmt.Errorf("%s.%s: %w", filepath.Base(dir), name, err)
	}
	if v.duration {
		return time.Duration(v.n), nil
	}
	return int(v.n), nil
}

// value is a declaration's value: a duration or a plain integer.
type value struct {
	n        int64
	duration bool
}

// sourceReader reads packages' files once each.
type sourceReader struct {
	root  string
	files map[string][]*ast.File
}

func (r sourceReader) parse(dir string) ([]*ast.File, error) {
	if fs, ok := r.files[dir]; ok {
		return fs, nil
	}
	paths, err := filepath.Glob(filepath.Join(r.root, dir, "*.go"))
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	r.files[dir] = files
	return files, nil
}

func (r sourceReader) lookup(dir, name string, depth int) (value, error) {
	if depth > 8 {
		return value{}, fmt.Errorf("declarations nested too deep at %s", name)
	}
	files, err := r.parse(dir)
	if err != nil {
		return value{}, err
	}
	for _, f := range files {
		for _, decl := range f.Decls {
			g, ok := decl.(*ast.GenDecl)
			if !ok || (g.Tok != token.CONST && g.Tok != token.VAR) {
				continue
			}
			for _, spec := range g.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if n.Name != name {
						continue
					}
					if i >= len(vs.Values) {
						return value{}, fmt.Errorf("%s has no value of its own (iota or a type's zero)", name)
					}
					return r.eval(dir, vs.Values[i], depth)
				}
			}
		}
	}
	return value{}, fmt.Errorf("no package-level declaration of %s in %s", name, dir)
}

func (r sourceReader) eval(dir string, e ast.Expr, depth int) (value, error) {
	switch e := e.(type) {
	case *ast.ParenExpr:
		return r.eval(dir, e.X, depth)
	case *ast.BasicLit:
		if e.Kind != token.INT {
			return value{}, fmt.Errorf("the literal %s is no integer", e.Value)
		}
		n, err := strconv.ParseInt(strings.ReplaceAll(e.Value, "_", ""), 0, 64)
		return value{n: n}, err
	case *ast.Ident:
		return r.lookup(dir, e.Name, depth+1)
	case *ast.SelectorExpr:
		pkg, ok := e.X.(*ast.Ident)
		switch {
		case ok && pkg.Name == "time":
			u, ok := timeUnits[e.Sel.Name]
			if !ok {
				return value{}, fmt.Errorf("time.%s is no unit", e.Sel.Name)
			}
			return value{n: int64(u), duration: true}, nil
		case ok && pkg.Name == "defaults":
			return r.lookup("internal/defaults", e.Sel.Name, depth+1)
		}
	case *ast.CallExpr:
		// A conversion, time.Duration(x) or int(x), keeps the value.
		if len(e.Args) == 1 {
			v, err := r.eval(dir, e.Args[0], depth)
			if sel, ok := e.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Duration" {
				v.duration = true
			}
			return v, err
		}
	case *ast.BinaryExpr:
		x, err := r.eval(dir, e.X, depth)
		if err != nil {
			return value{}, err
		}
		y, err := r.eval(dir, e.Y, depth)
		if err != nil {
			return value{}, err
		}
		d := x.duration || y.duration
		switch e.Op {
		case token.MUL:
			return value{x.n * y.n, d}, nil
		case token.QUO:
			if y.n == 0 {
				return value{}, fmt.Errorf("a division by zero")
			}
			return value{x.n / y.n, x.duration && !y.duration}, nil
		case token.ADD:
			return value{x.n + y.n, d}, nil
		case token.SUB:
			return value{x.n - y.n, d}, nil
		case token.SHL:
			return value{x.n << y.n, x.duration}, nil
		}
	}
	return value{}, fmt.Errorf("cannot read the expression at %T", e)
}
