package alerts

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/proctest"
)

// The tests do not parse the rules file themselves: they load it into a real Prometheus
// server and read the rules back from its HTTP API. That is also the strongest check that
// the file loads where users load it.

// apiRule is one rule as GET /api/v1/rules returns it. Query is the expression as
// Prometheus prints it after parsing.
type apiRule struct {
	Type        string            `json:"type"`
	Name        string            `json:"name"`
	Query       string            `json:"query"`
	Duration    float64           `json:"duration"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

type apiGroup struct {
	Name  string    `json:"name"`
	File  string    `json:"file"`
	Rules []apiRule `json:"rules"`
}

var (
	loadOnce   sync.Once
	loadGroups []apiGroup
)

// loadedRules returns the rule groups of pg_liveness.rules.yml as a real Prometheus
// loads them. Prometheus is started once per test binary, by the first test that asks,
// and stopped as soon as it has answered.
func loadedRules(t *testing.T) []apiGroup {
	t.Helper()
	loadOnce.Do(func() { loadGroups = loadRulesWithPrometheus(t) })
	if loadGroups == nil {
		t.Fatal("Prometheus did not load the rules: see the first test that asked for them")
	}
	return loadGroups
}

func loadRulesWithPrometheus(t *testing.T) []apiGroup {
	t.Helper()
	rules, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	prom := proctest.StartPrometheus(t, map[string]any{"rule_files": []string{rules}})
	defer prom.Stop(10 * time.Second)
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + prom.Addr + "/api/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Data   struct {
			Groups []apiGroup `json:"groups"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("decoding /api/v1/rules: %v", err)
	}
	if body.Status != "success" {
		t.Fatalf("/api/v1/rules: status %q", body.Status)
	}
	for _, g := range body.Data.Groups {
		if g.File != rules {
			t.Fatalf("group %q comes from %s, not %s", g.Name, g.File, rules)
		}
	}
	return body.Data.Groups
}

// ruleFileJSON renders rule groups as a Prometheus rule file. JSON is YAML, so promtool
// and Prometheus read it like the hand-written file.
func ruleFileJSON(groups []apiGroup) ([]byte, error) {
	type rule struct {
		Alert       string            `json:"alert,omitempty"`
		Record      string            `json:"record,omitempty"`
		Expr        string            `json:"expr"`
		For         string            `json:"for,omitempty"`
		Labels      map[string]string `json:"labels,omitempty"`
		Annotations map[string]string `json:"annotations,omitempty"`
	}
	type group struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	}
	var file struct {
		Groups []group `json:"groups"`
	}
	for _, g := range groups {
		out := group{Name: g.Name, Rules: []rule{}}
		for _, r := range g.Rules {
			nr := rule{Expr: r.Query, Labels: r.Labels, Annotations: r.Annotations}
			if r.Type == "recording" {
				nr.Record = r.Name
			} else {
				nr.Alert = r.Name
				if r.Duration > 0 {
					nr.For = fmt.Sprintf("%.0fs", r.Duration)
				}
			}
			out.Rules = append(out.Rules, nr)
		}
		file.Groups = append(file.Groups, out)
	}
	return json.MarshalIndent(file, "", "  ")
}
