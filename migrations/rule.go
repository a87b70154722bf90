package migrations

import (
	"fmt"
	"regexp"
	"strings"
)

// StateRule is the body of instance_state_rule as the newest migration that defines it
// states it: the one definition of instance states, as a SQL expression in the
// parameters Params. Observers that cannot create functions in the database they watch
// (a Whizbang database is watched as it is) substitute their own expressions for the
// parameters, so that they judge by the same rules and no second copy of them exists.
type StateRule struct {
	Body   string   // a CASE expression
	Params []string // the parameter names in declaration order, e.g. p_locked
}

var (
	ruleFunc   = regexp.MustCompile(`(?s)CREATE (?:OR REPLACE )?FUNCTION instance_state_rule\((.*?)\)\s*RETURNS text.*?AS \$\$\s*SELECT (.*?)\s*\$\$;`)
	ruleParam  = regexp.MustCompile(`^\s*(p_[a-z_]+)\s+[a-z ]+$`)
	paramToken = regexp.MustCompile(`\bp_[a-z_]+\b`)
)

// LatestStateRule returns the rule of the newest embedded migration that defines it.
func LatestStateRule() (StateRule, error) { return Embedded.StateRule() }

// StateRule returns the rule of the newest migration in s that defines it.
func (s Set) StateRule() (StateRule, error) {
	for i := len(s) - 1; i >= 0; i-- {
		m := ruleFunc.FindStringSubmatch(s[i].SQL)
		if m == nil {
			continue
		}
		var r StateRule
		for _, p := range strings.Split(m[1], ",") {
			pm := ruleParam.FindStringSubmatch(p)
			if pm == nil {
				return StateRule{}, fmt.Errorf("migration %d: instance_state_rule parameter %q is not \"p_name type\"", s[i].Version, strings.TrimSpace(p))
			}
			r.Params = append(r.Params, pm[1])
		}
		r.Body = m[2]
		return r, nil
	}
	return StateRule{}, fmt.Errorf("no migration defines instance_state_rule")
}

// Expand returns the rule's body with every parameter replaced by its expression, each
// in parentheses. Every parameter must be given, and nothing else.
func (r StateRule) Expand(args map[string]string) (string, error) {
	if len(args) != len(r.Params) {
		return "", fmt.Errorf("instance_state_rule takes %s, got %d expressions", strings.Join(r.Params, ", "), len(args))
	}
	for _, p := range r.Params {
		if _, ok := args[p]; !ok {
			return "", fmt.Errorf("instance_state_rule: no expression for %s", p)
		}
	}
	var unknown string
	out := paramToken.ReplaceAllStringFunc(r.Body, func(tok string) string {
		e, ok := args[tok]
		if !ok {
			unknown = tok
			return tok
		}
		return "(" + e + ")"
	})
	if unknown != "" {
		return "", fmt.Errorf("instance_state_rule: its body names %s, which is not a parameter", unknown)
	}
	return out, nil
}
