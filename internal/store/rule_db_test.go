package store_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
)

// The rule's body, where its parameters are columns of that name (as whizbang.verdicts
// inserts it), gives what the installed function gives, for every combination of inputs
// that tells the states apart: an observer that binds its own values judges exactly as
// instance_state_verdicts does.
func TestStateRuleBodyJudgesAsTheInstalledFunction(t *testing.T) {
	_, pool := testdb.MigratedPool(t, 2)
	rule := store.InstanceStateRule()
	var call []string
	for _, p := range rule.Params {
		call = append(call, "c."+p)
	}
	// Every input of the rule over values on both sides of each boundary.
	sql := `SELECT count(*), count(*) FILTER (WHERE liveness.instance_state_rule(` + strings.Join(call, ", ") + `) IS DISTINCT FROM (` + rule.Body + `)),
	               count(DISTINCT liveness.instance_state_rule(` + strings.Join(call, ", ") + `))
	  FROM (SELECT l AS p_locked, h AS p_holds_alive_lock, now() - age AS p_last_heartbeat_at, now() AS p_now,
	               interval '90 seconds' AS p_stale, interval '5 minutes' AS p_dead,
	               now() - missing AS p_missing_since, interval '1 second' AS p_grace
	          FROM unnest(ARRAY[true, false]) l, unnest(ARRAY[true, false]) h,
	               unnest(ARRAY[interval '1 second', interval '2 minutes', interval '10 minutes']) age,
	               unnest(ARRAY[NULL, interval '0.5 seconds', interval '3 seconds']) missing) c`
	var n, differ, states int
	if err := pool.QueryRow(testutil.Context(t, 30*time.Second), sql).Scan(&n, &differ, &states); err != nil {
		t.Fatalf("%v\n%s", err, sql)
	}
	if differ != 0 {
		t.Fatalf("%d of %d input combinations give another state from the rule's body than from the function", differ, n)
	}
	if states != 6 {
		t.Fatalf("the inputs reach %d states, want all 6: the test does not cover the rule", states)
	}
}
