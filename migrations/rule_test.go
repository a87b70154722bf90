package migrations_test

import (
	"strings"
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// The rule's text, expanded with expressions, gives what the installed function gives,
// for every combination of inputs that tells the states apart: an observer that
// substitutes its own expressions judges exactly as instance_state_verdicts does.
func TestStateRuleExpandsToTheInstalledFunction(t *testing.T) {
	_, pool := migrated(t)
	rule, err := migrations.LatestStateRule()
	if err != nil {
		t.Fatal(err)
	}
	args := map[string]string{}
	var call []string
	for _, p := range rule.Params {
		args[p] = "c." + p
		call = append(call, "c."+p)
	}
	expanded, err := rule.Expand(args)
	if err != nil {
		t.Fatal(err)
	}
	// Every input of the rule over values on both sides of each boundary.
	sql := `SELECT count(*), count(*) FILTER (WHERE liveness.instance_state_rule(` + strings.Join(call, ", ") + `) IS DISTINCT FROM (` + expanded + `)),
	               count(DISTINCT liveness.instance_state_rule(` + strings.Join(call, ", ") + `))
	  FROM (SELECT l AS p_locked, h AS p_holds_alive_lock, now() - age AS p_last_heartbeat_at, now() AS p_now,
	               interval '90 seconds' AS p_stale, interval '5 minutes' AS p_dead,
	               now() - missing AS p_missing_since, interval '1 second' AS p_grace
	          FROM unnest(ARRAY[true, false]) l, unnest(ARRAY[true, false]) h,
	               unnest(ARRAY[interval '1 second', interval '2 minutes', interval '10 minutes']) age,
	               unnest(ARRAY[NULL, interval '0.5 seconds', interval '3 seconds']) missing) c`
	var n, differ, states int
	if err := pool.QueryRow(ctxT(t), sql).Scan(&n, &differ, &states); err != nil {
		t.Fatalf("%v\n%s", err, sql)
	}
	if differ != 0 {
		t.Fatalf("%d of %d input combinations give another state from the expanded rule than from the function", differ, n)
	}
	if states != 6 {
		t.Fatalf("the inputs reach %d states, want all 6: the test does not cover the rule", states)
	}
}

func TestStateRuleExpandRefusesMissingOrExtraExpressions(t *testing.T) {
	rule, err := migrations.LatestStateRule()
	if err != nil {
		t.Fatal(err)
	}
	args := map[string]string{}
	for _, p := range rule.Params {
		args[p] = "NULL"
	}
	delete(args, rule.Params[0])
	if _, err := rule.Expand(args); err == nil || !strings.Contains(err.Error(), rule.Params[0]) {
		t.Fatalf("a missing expression: got %v, want an error naming %s", err, rule.Params[0])
	}
	args[rule.Params[0]] = "NULL"
	args["p_other"] = "NULL"
	if _, err := rule.Expand(args); err == nil {
		t.Fatal("an extra expression was accepted")
	}
}
