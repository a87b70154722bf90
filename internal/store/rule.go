package store

import (
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"sort"
	"strings"
)

//go:embed schema/*.sql
var migrationFiles embed.FS

// MigrationFiles is the schema's history, the files schema/NNNN_name.sql, in the order
// package migrations applies them. The files are the one definition of every object the
// product relies on; schema.sql beside the folder shows the objects as they stand after
// the last one.
func MigrationFiles() fs.FS {
	sub, err := fs.Sub(migrationFiles, "schema")
	if err != nil {
		panic(err) // a literal path of this package's own embed
	}
	return sub
}

// StateRule is the body of instance_state_rule as the newest migration that defines it
// states it: the one definition of instance states, as a SQL expression in the
// parameters Params. Observers that cannot create functions in the database they watch
// (a Whizbang database is watched as it is) insert it where a subquery's columns named
// after the parameters hold their own values (whizbang.verdicts), so that they judge by
// the same rules and no second copy of them exists.
type StateRule struct {
	Body   string   // a CASE expression
	Params []string // the parameter names in declaration order, e.g. p_locked
}

var (
	ruleFunc   = regexp.MustCompile(`(?s)CREATE (?:OR REPLACE )?FUNCTION instance_state_rule\((.*?)\)\s*RETURNS text.*?AS \$\$\s*SELECT (.*?)\s*\$\$;`)
	ruleParam  = regexp.MustCompile(`^\s*(p_[a-z_]+)\s+[a-z ]+$`)
	paramToken = regexp.MustCompile(`\bp_[a-z_]+\b`)
	boundParam = regexp.MustCompile(`\bAS (p_[a-z_]+)\b`)
)

// stateRule is the newest migration's rule, checked against the Whizbang verdict's
// binding of its parameters when the package loads.
var stateRule = mustStateRule()

// InstanceStateRule returns the newest migration's instance_state_rule.
func InstanceStateRule() StateRule {
	return StateRule{Body: stateRule.Body, Params: slices.Clone(stateRule.Params)}
}

func mustStateRule() StateRule {
	r, err := parseStateRule(MigrationFiles())
	if err == nil {
		err = checkRuleBinding(r, sections.section("whizbang.verdicts", kindFragment))
	}
	if err != nil {
		panic(err)
	}
	return r
}

// parseStateRule finds the rule in the newest migration of fsys that defines it.
func parseStateRule(fsys fs.FS) (StateRule, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return StateRule{}, err
	}
	sort.Sort(sort.Reverse(sort.StringSlice(names)))
	for _, name := range names {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return StateRule{}, err
		}
		m := ruleFunc.FindStringSubmatch(string(b))
		if m == nil {
			continue
		}
		var r StateRule
		for _, p := range strings.Split(m[1], ",") {
			pm := ruleParam.FindStringSubmatch(p)
			if pm == nil {
				return StateRule{}, fmt.Errorf("store: %s: instance_state_rule parameter %q is not \"p_name type\"", name, strings.TrimSpace(p))
			}
			r.Params = append(r.Params, pm[1])
		}
		r.Body = dedent(m[2])
		if strings.Contains(r.Body, "--") {
			return StateRule{}, fmt.Errorf("store: %s: instance_state_rule's body holds a -- comment, which would swallow what follows it where it is inserted", name)
		}
		for _, tok := range paramToken.FindAllString(r.Body, -1) {
			if !slices.Contains(r.Params, tok) {
				return StateRule{}, fmt.Errorf("store: %s: instance_state_rule's body names %s, which is not a parameter", name, tok)
			}
		}
		return r, nil
	}
	return StateRule{}, fmt.Errorf("store: no migration defines instance_state_rule")
}

// dedent removes the indentation the lines after the first share, so that the body lines
// up wherever it is inserted.
func dedent(s string) string {
	lines := strings.Split(s, "\n")
	common := -1
	for _, l := range lines[1:] {
		if strings.TrimSpace(l) == "" {
			continue
		}
		if n := len(l) - len(strings.TrimLeft(l, " ")); common < 0 || n < common {
			common = n
		}
	}
	for i := 1; i < len(lines) && common > 0; i++ {
		if len(lines[i]) >= common {
			lines[i] = lines[i][common:]
		}
	}
	return strings.Join(lines, "\n")
}

// checkRuleBinding: the fragment that inserts the rule gives a column for each of its
// parameters, and no other p_ column, so that a new rule parameter cannot be left to
// resolve to something else.
func checkRuleBinding(r StateRule, frag *section) error {
	var bound []string
	for _, m := range boundParam.FindAllStringSubmatch(frag.body, -1) {
		bound = append(bound, m[1])
	}
	want := slices.Sorted(slices.Values(r.Params))
	slices.Sort(bound)
	if !slices.Equal(bound, want) {
		return fmt.Errorf("store: %s binds the rule's parameters %v, want exactly %v", frag.name, bound, want)
	}
	return nil
}
