package alerts

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// The module has no YAML library, so the tests do not parse the rules file themselves:
// they load it into a real Prometheus server and read the rules back from its HTTP API.
// That is also the strongest check that the file loads where users load it.

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
	loadErr    error
)

// needTool returns the path of a Debian-packaged binary, or fails the test with the
// package to install.
func needTool(t *testing.T, name, pkg string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found: apt-get install %s", name, pkg)
	}
	return path
}

// loadedRules returns the rule groups of pg_liveness.rules.yml as a real Prometheus
// loads them. Prometheus is started once per test binary and stopped at once.
func loadedRules(t *testing.T) []apiGroup {
	t.Helper()
	prom := needTool(t, "prometheus", "prometheus")
	loadOnce.Do(func() { loadGroups, loadErr = loadRulesWithPrometheus(prom) })
	if loadErr != nil {
		t.Fatal(loadErr)
	}
	return loadGroups
}

func loadRulesWithPrometheus(prom string) ([]apiGroup, error) {
	rules, err := filepath.Abs(rulesFile)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pg-liveness-alerts-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	cfg := filepath.Join(dir, "prometheus.yml")
	rulesJSON, _ := json.Marshal(rules)
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "rule_files: [%s]\n", rulesJSON), 0o600); err != nil {
		return nil, err
	}
	port, err := testutil.FreePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)

	var out bytes.Buffer
	cmd := exec.Command(prom,
		"--config.file="+cfg,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
	}()

	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-exited:
			exited <- err
			return nil, fmt.Errorf("prometheus exited (%v) before serving rules:\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("prometheus did not get ready on %s:\n%s", addr, out.String())
		}
		resp, err := client.Get("http://" + addr + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}

	resp, err := client.Get("http://" + addr + "/api/v1/rules")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Data   struct {
			Groups []apiGroup `json:"groups"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("decoding /api/v1/rules: %w", err)
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("/api/v1/rules: status %q", body.Status)
	}
	for _, g := range body.Data.Groups {
		if g.File != rules {
			return nil, fmt.Errorf("group %q comes from %s, not %s", g.Name, g.File, rules)
		}
	}
	return body.Data.Groups, nil
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
