package probe

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/collector"
	"github.com/pg-liveness/pg_liveness_exporter/internal/targets"
)

// testProber is the Prober of two targets whose server is not there: nothing here
// connects (pools open lazily), so every answer below is the Prober's own.
func testProber(t *testing.T, collectors collector.Config) (*Prober, error) {
	t.Helper()
	dir := t.TempDir()
	dsn := filepath.Join(dir, "dsn")
	if err := os.WriteFile(dsn, []byte("host=127.0.0.1 port=1 user=u password=hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "targets.yml")
	if err := os.WriteFile(file, []byte("targets:\n  s1-db1: {dsn_file: "+dsn+"}\n  s1-db2: {dsn_file: "+dsn+"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := targets.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	pools, err := targets.NewPools(cfg, targets.Options{MaxConns: 4, MaxConnsPerTarget: 2, IdleTimeout: time.Minute, ConnectTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pools.Close)
	return New(pools, collectors, slog.New(slog.DiscardHandler))
}

// get serves one request of method on target and returns the status and the body.
func get(h http.HandlerFunc, method, target string) (int, http.Header, string) {
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(method, target, nil)
	if name, ok := strings.CutPrefix(r.URL.Path, "/targets/"); ok {
		r.SetPathValue("target", strings.TrimSuffix(strings.TrimSuffix(name, ".json"), "/status"))
	}
	h(rec, r)
	body, _ := io.ReadAll(rec.Body)
	return rec.Code, rec.Header(), string(body)
}

// Bad requests are 4xx answers that name the parameter or the target, never a 5xx, and
// never repeat a value that could be a secret.
func TestBadRequestsNameTheParameter(t *testing.T) {
	p, err := testProber(t, collector.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	for q, want := range map[string]string{
		"target=nope":                     `parameter target: "nope" is no target of --config.file`,
		"":                                "parameter target: give one target name of --config.file",
		"target=s1-db1&target=s1-db2":     "parameter target: give one target name",
		"target=":                         "parameter target: give one target name",
		"target=s1-db1&collector=agent":   `parameter collector: collector "agent" is not enabled`,
		"target=s1-db1&collector=no_such": `parameter collector: collector "no_such" is not enabled`,
		"target=s1-db1&module=x":          `parameter "module": unknown (known: target, collector)`,
		"target=s1-db1&password=hunter2":  `parameter "password": unknown`,
		"target=s1-db1&%zz":               "the query string is malformed",
	} {
		code, _, body := get(p.ServeHTTP, http.MethodGet, "/probe?"+q)
		if code != http.StatusBadRequest || !strings.Contains(body, want) || strings.Contains(body, "hunter2") {
			t.Errorf("/probe?%s: %d %q, want 400 saying %q", q, code, body, want)
		}
	}
	if code, h, _ := get(p.ServeHTTP, http.MethodPost, "/probe?target=s1-db1"); code != http.StatusMethodNotAllowed || h.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /probe: %d, Allow %q; want 405, GET, HEAD", code, h.Get("Allow"))
	}
	for _, path := range []string{"/targets/nope/status", "/targets/nope/status.json"} {
		if code, _, body := get(p.StatusPage, http.MethodGet, path); code != http.StatusNotFound ||
			!strings.Contains(body, `"nope" is no target of --config.file (/targets lists them)`) {
			t.Errorf("%s: %d %q, want 404 naming the target", path, code, body)
		}
	}
}

// A bad collector setting is refused when the Prober is made, not at a target's first
// probe; the error names the field.
func TestNewRefusesABadCollectorSetting(t *testing.T) {
	cfg := collector.DefaultConfig()
	cfg.Leases.MaxSeries = -1
	if _, err := testProber(t, cfg); err == nil || !strings.HasPrefix(err.Error(), "Config.Leases.MaxSeries ") {
		t.Fatalf("New with Leases.MaxSeries -1: %v, want an error naming Config.Leases.MaxSeries", err)
	}
}
