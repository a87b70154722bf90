package store

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The one renderer. A statement's text holds {placeholders}; rendering fills each of
// them in one pass over the template, in this order of lookup:
//
//  1. a value this package's Go code gives: an identifier (quoted with pgx.Identifier),
//     a regclass or text literal, a bind parameter (numbered after the statement's own),
//     a fragment chosen by name, or a text of our own embedded files (the state rule);
//  2. the fragment <source>.<name> of the source being read (liveness., whizbang.);
//  3. the fragment <name>.
//
// A fragment is rendered by the same pass, recursively, with the same values. Filled-in
// text is never scanned again: an identifier that holds "{table}" stays that text, in
// quotes. An unknown placeholder is a defect of this package's files, which the tests
// render for every source; rendering panics on it rather than send half a statement.

// valueKind is what a value is made of.
type valueKind int

const (
	valSQL valueKind = iota // text ready to insert: a quoted identifier or literal, or our own embedded text
	valUse                  // the fragment of that name
	valArg                  // a bind parameter, numbered after the statement's own
)

type value struct {
	kind valueKind
	sql  string
	arg  any
}

// values are what one rendering fills placeholders with, by name.
type values map[string]value

// ident is a quoted identifier: "schema" or "schema"."table".
func ident(parts ...string) value { return value{kind: valSQL, sql: pgx.Identifier(parts).Sanitize()} }

// regclassLiteral is the object as a string literal of its quoted identifier, as
// nextval takes a sequence: the literal's own quotes doubled, so that neither kind of
// quoting can end inside the other.
func regclassLiteral(parts ...string) value {
	return value{kind: valSQL, sql: quoteLiteral(pgx.Identifier(parts).Sanitize())}
}

// literal is a text literal, for scripts (a function parameter's default). E” strings
// read the same whatever standard_conforming_strings is.
func literal(s string) value { return value{kind: valSQL, sql: quoteLiteral(s)} }

func quoteLiteral(s string) string {
	if strings.Contains(s, `\`) {
		return `E'` + strings.NewReplacer(`\`, `\\`, `'`, `''`).Replace(s) + `'`
	}
	return `'` + strings.ReplaceAll(s, `'`, `''`) + `'`
}

// ownText is text of this package's embedded files, inserted as it is.
func ownText(s string) value { return value{kind: valSQL, sql: s} }

// use fills the placeholder with the fragment name.
func use(name string) value { return value{kind: valUse, sql: name} }

// arg is a bind parameter whose value the Query carries: Query.Args puts it after the
// caller's own arguments.
func arg(v any) value { return value{kind: valArg, arg: v} }

// Query is a statement rendered for one schema or source: the text to send, and the
// arguments that follow the caller's own (a source's timing and key prefix).
type Query struct {
	Name  string // the statement's name in sql/
	SQL   string
	extra []any
}

// Args returns the statement's arguments: own, in the order of the statement's own $1,
// $2, …, and then the source's.
func (q Query) Args(own ...any) []any {
	if len(q.extra) == 0 {
		return own
	}
	return append(append(make([]any, 0, len(own)+len(q.extra)), own...), q.extra...)
}

// maxDepth bounds fragments within fragments: a cycle is a defect of the files.
const maxDepth = 8

// renderer is one rendering in progress.
type renderer struct {
	vals   values
	source string         // the source's fragment prefix, "" for none
	next   int            // the next bind parameter's number
	argNum map[string]int // a value's number, once given
	extra  []any
}

// render fills s's placeholders from vals and the source's fragments.
func render(s *section, source string, vals values) Query {
	r := &renderer{vals: vals, source: source, argNum: map[string]int{}}
	r.next = r.maxParam(s.body, 0) + 1
	return Query{Name: s.name, SQL: r.fill(s.name, s.body, 0), extra: r.extra}
}

// maxParam is the highest $n of the template and of every fragment it reaches, so that
// the source's parameters come after all of the statement's own.
func (r *renderer) maxParam(text string, depth int) int {
	n := maxParam(text)
	for _, m := range placeholder.FindAllStringSubmatch(text, -1) {
		if frag := r.fragment(m[1], depth); frag != nil {
			n = max(n, r.maxParam(frag.body, depth+1))
		}
	}
	return n
}

// fragment is the fragment a placeholder resolves to, or nil for a value.
func (r *renderer) fragment(name string, depth int) *section {
	if depth > maxDepth {
		panic(fmt.Sprintf("store: fragments nested deeper than %d at {%s}: a cycle in sql/", maxDepth, name))
	}
	if v, ok := r.vals[name]; ok {
		if v.kind == valUse {
			return sections.section(v.sql, kindFragment)
		}
		return nil
	}
	if r.source != "" {
		if s := sections.byName[r.source+"."+name]; s != nil && s.kind == kindFragment {
			return s
		}
	}
	if s := sections.byName[name]; s != nil && s.kind == kindFragment {
		return s
	}
	panic(fmt.Sprintf("store: {%s} is neither a value of this rendering nor a fragment (source %q)", name, r.source))
}

// fill is the one pass over one template.
func (r *renderer) fill(of, text string, depth int) string {
	var b strings.Builder
	last := 0
	for _, m := range placeholder.FindAllStringSubmatchIndex(text, -1) {
		b.WriteString(text[last:m[0]])
		name := text[m[2]:m[3]]
		var filled string
		if frag := r.fragment(name, depth); frag != nil {
			filled = r.fill(frag.name, frag.body, depth+1)
		} else {
			filled = r.value(name)
		}
		// Continuation lines line up under the placeholder's line, for people who read
		// the rendered text (a generated script, a statement in pg_stat_statements).
		line := text[strings.LastIndexByte(text[:m[0]], '\n')+1:]
		indent := line[:len(line)-len(strings.TrimLeft(line, " \t"))]
		b.WriteString(strings.ReplaceAll(filled, "\n", "\n"+indent))
		last = m[1]
	}
	b.WriteString(text[last:])
	return b.String()
}

func (r *renderer) value(name string) string {
	v := r.vals[name]
	switch v.kind {
	case valArg:
		n, ok := r.argNum[name]
		if !ok {
			n = r.next
			r.next++
			r.argNum[name] = n
			r.extra = append(r.extra, v.arg)
		}
		return "$" + strconv.Itoa(n)
	}
	return v.sql
}
