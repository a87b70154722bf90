package store

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// TagPrefix starts every tag's name inside its comment: a statement tagged lease_acquire
// is sent as INSERT /* pg_liveness:lease_acquire */ INTO ….
const TagPrefix = "pg_liveness:"

//go:embed sql/*.sql
var sqlFiles embed.FS

// sectionKind is what a section of a file in sql/ is.
type sectionKind int

const (
	kindStatement sectionKind = iota // -- name: sent by the product
	kindFragment                     // -- fragment: filled in for a {placeholder}
	kindScript                       // -- script: a script for people to run, never sent
)

// section is one named statement, fragment or script of sql/.
type section struct {
	kind sectionKind
	name string
	tag  string // a tagged statement's tag name; "" untagged, and for fragments and scripts
	file string
	doc  string // the comment lines under the marker, without their "-- "
	body string // as sent: for a tagged statement, with its tag after the first keyword
}

var (
	// markerLine starts a section: "-- name: lease_abandon tag=lease_release".
	markerLine = regexp.MustCompile(`^-- (name|fragment|script): (\S+)\s*(.*?)\s*$`)
	// placeholder is a {name} that rendering fills.
	placeholder = regexp.MustCompile(`\{([a-z_][a-z0-9_.]*)\}`)
	// paramRef is a statement's own bind parameter, $1.
	paramRef        = regexp.MustCompile(`\$([0-9]+)`)
	statementName   = regexp.MustCompile(`^[a-z][a-z_]*[a-z]$`)
	fragmentName    = regexp.MustCompile(`^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)?$`)
	firstKeyword    = regexp.MustCompile(`^[A-Za-z]+`)
	lineCommentTail = regexp.MustCompile(`--.*$`)
)

// catalog is every section of sql/, by name, and the statements in reading order (the
// files by name, each top to bottom).
type catalog struct {
	byName     map[string]*section
	statements []*section
}

var sections = mustLoad(sqlFiles)

func mustLoad(fsys fs.FS) *catalog {
	c, err := load(fsys)
	if err != nil {
		panic(err)
	}
	return c
}

// load reads every file of sql/ into sections and checks what can be checked without
// rendering: well-formed, unique names; tags well placed; nothing outside a section but
// comments; no fragment whose last line holds a -- comment (it would swallow what
// follows its placeholder).
func load(fsys fs.FS) (*catalog, error) {
	entries, err := fs.ReadDir(fsys, "sql")
	if err != nil {
		return nil, err
	}
	c := &catalog{byName: map[string]*section{}}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".sql") {
			return nil, fmt.Errorf("store: sql/%s is not a .sql file", e.Name())
		}
		b, err := fs.ReadFile(fsys, path.Join("sql", e.Name()))
		if err != nil {
			return nil, err
		}
		secs, err := parseFile(e.Name(), string(b))
		if err != nil {
			return nil, err
		}
		for _, s := range secs {
			if prev := c.byName[s.name]; prev != nil {
				return nil, fmt.Errorf("store: %s and %s both define %q", prev.file, s.file, s.name)
			}
			c.byName[s.name] = s
			if s.kind == kindStatement {
				c.statements = append(c.statements, s)
			}
		}
	}
	return c, nil
}

// parseFile splits one file into its sections.
func parseFile(file, text string) ([]*section, error) {
	var (
		out   []*section
		cur   *section
		lines []string
	)
	finish := func() error {
		if cur == nil {
			return nil
		}
		var doc []string
		i := 0
		for ; i < len(lines) && strings.HasPrefix(lines[i], "--"); i++ {
			doc = append(doc, strings.TrimPrefix(strings.TrimPrefix(lines[i], "--"), " "))
		}
		cur.doc = strings.Join(doc, "\n")
		cur.body = strings.Trim(strings.Join(lines[i:], "\n"), "\n")
		if strings.TrimSpace(cur.body) == "" {
			return fmt.Errorf("store: %s: %s has no text", file, cur.name)
		}
		if cur.kind == kindFragment {
			last := cur.body[strings.LastIndex(cur.body, "\n")+1:]
			if strings.Contains(last, "--") {
				return fmt.Errorf("store: %s: the last line of fragment %s holds a -- comment, which would swallow what follows its placeholder", file, cur.name)
			}
		}
		if cur.tag != "" {
			kw := firstKeyword.FindString(cur.body)
			if kw == "" {
				return fmt.Errorf("store: %s: statement %s must start with a keyword, which its tag follows", file, cur.name)
			}
			// After the first keyword: PostgreSQL 18 drops a comment before it from
			// pg_stat_statements' text, and every major from 14 on keeps one after it.
			cur.body = kw + " /* " + TagPrefix + cur.tag + " */" + cur.body[len(kw):]
		}
		out = append(out, cur)
		return nil
	}
	for n, line := range strings.Split(text, "\n") {
		m := markerLine.FindStringSubmatch(line)
		if m == nil {
			if cur == nil && strings.TrimSpace(line) != "" && !strings.HasPrefix(line, "--") {
				return nil, fmt.Errorf("store: %s:%d: text before the file's first section", file, n+1)
			}
			if cur != nil {
				lines = append(lines, line)
			}
			continue
		}
		if err := finish(); err != nil {
			return nil, err
		}
		cur, lines = &section{name: m[2], file: file}, nil
		switch m[1] {
		case "name":
			cur.kind = kindStatement
			if !statementName.MatchString(cur.name) {
				return nil, fmt.Errorf("store: %s:%d: statement name %q: want lower-case words joined by _", file, n+1, cur.name)
			}
			switch opt := m[3]; {
			case opt == "":
				cur.tag = cur.name
			case opt == "untagged":
			case strings.HasPrefix(opt, "tag="):
				cur.tag = strings.TrimPrefix(opt, "tag=")
				if !statementName.MatchString(cur.tag) {
					return nil, fmt.Errorf("store: %s:%d: tag %q: want lower-case words joined by _", file, n+1, cur.tag)
				}
			default:
				return nil, fmt.Errorf("store: %s:%d: %q after the statement's name: want nothing, untagged or tag=<tag>", file, n+1, opt)
			}
		case "fragment", "script":
			cur.kind = kindFragment
			if m[1] == "script" {
				cur.kind = kindScript
			}
			if !fragmentName.MatchString(cur.name) || m[3] != "" {
				return nil, fmt.Errorf("store: %s:%d: %s name %q: want lower-case words joined by _, with a source's prefix (liveness.) when it is one's", file, n+1, m[1], cur.name)
			}
		}
	}
	if err := finish(); err != nil {
		return nil, err
	}
	return out, nil
}

// maxParam is the highest $n in text outside -- comments: the statement's own
// parameters, after which rendering numbers the source's.
func maxParam(text string) int {
	n := 0
	for _, line := range strings.Split(text, "\n") {
		for _, m := range paramRef.FindAllStringSubmatch(lineCommentTail.ReplaceAllString(line, ""), -1) {
			v, _ := strconv.Atoi(m[1])
			n = max(n, v)
		}
	}
	return n
}

// Tags returns every tag's name once, in reading order: the statements collector's
// default patterns, one per tag.
func Tags() []string {
	var out []string
	for _, s := range sections.statements {
		if s.tag != "" && !slices.Contains(out, s.tag) {
			out = append(out, s.tag)
		}
	}
	return out
}

// Described is one statement of sql/ as its file describes it, for tests and tools that
// go over all of them.
type Described struct {
	Name string
	Tag  string // "" for an untagged statement
	File string
	Doc  string
	// Row is the statement's row type (a zero value of it), nil for a statement whose
	// row its one caller scans itself (the agent's writes; see the file).
	Row any
}

// Statements describes every statement of sql/, in reading order.
func Statements() []Described {
	out := make([]Described, 0, len(sections.statements))
	for _, s := range sections.statements {
		out = append(out, Described{Name: s.name, Tag: s.tag, File: s.file, Doc: s.doc, Row: rowTypes[s.name]})
	}
	return out
}

// section returns the statement, fragment or script name, which must exist: the
// handles below are checked when the package loads.
func (c *catalog) section(name string, kind sectionKind) *section {
	s := c.byName[name]
	if s == nil || s.kind != kind {
		panic(fmt.Sprintf("store: no %v %q in sql/", kind, name))
	}
	return s
}

func (k sectionKind) String() string {
	return [...]string{"statement", "fragment", "script"}[k]
}
