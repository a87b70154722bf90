package collector

import (
	"strings"
	"testing"

	"github.com/alecthomas/kingpin/v2"

	"github.com/pg-liveness/pg_liveness_exporter/liveness"
)

// testAgentCollector is the agent collector on testAgent, as New builds it.
func testAgentCollector(t testing.TB) collector {
	t.Helper()
	c, err := newAgentCollector(deps{cfg: &Config{}, agent: testAgent})
	if err != nil || c == nil {
		t.Fatalf("agent collector: %v, %v", c, err)
	}
	return c
}

// TestRegistry: every row names a distinct collector with its own switch, which
// DefaultConfig sets as the row says and --[no-]collector.<name> turns, and New builds
// exactly the enabled ones.
func TestRegistry(t *testing.T) {
	seen := map[string]bool{}
	cfg := DefaultConfig()
	switches := map[*bool]string{}
	for _, r := range registry {
		if r.name == "" || seen[r.name] || r.help == "" || r.build == nil || r.settings == nil {
			t.Errorf("registry row %q is incomplete or repeated", r.name)
		}
		seen[r.name] = true
		s := r.settings(&cfg)
		if other, ok := switches[s.enabled()]; ok {
			t.Errorf("%s and %s share one switch", r.name, other)
		}
		switches[s.enabled()] = r.name
		if *s.enabled() != r.on {
			t.Errorf("DefaultConfig enables %s: %v, want %v", r.name, *s.enabled(), r.on)
		}
	}

	for _, off := range registry {
		app := kingpin.New("test", "")
		c := AddFlags(app)
		if _, err := app.Parse([]string{"--no-collector." + off.name}); err != nil {
			t.Fatal(err)
		}
		for _, r := range registry {
			if got := *r.settings(c).enabled(); got != (r.name != off.name) {
				t.Errorf("--no-collector.%s: %s enabled = %v", off.name, r.name, got)
			}
		}
		// Without a pool, New builds only the collectors that need none.
		only := DefaultConfig()
		for _, r := range registry {
			*r.settings(&only).enabled() = r.name == off.name
		}
		only.NodeAgent.Source = fixedNodeAgent{}
		e, err := New(only, nil, testAgent, nil)
		if off.db {
			if err == nil || !strings.Contains(err.Error(), "collector "+off.name+" needs a database pool") {
				t.Errorf("%s without a pool: error %v", off.name, err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := e.Enabled(); len(got) != 1 || got[0] != off.name {
			t.Errorf("only %s enabled: New built %v", off.name, got)
		}
	}
}

// fixedNodeAgent is a stand-in for the node agent: its collector only reads the snapshot.
type fixedNodeAgent liveness.NodeAgentSnapshot

func (n fixedNodeAgent) Snapshot() liveness.NodeAgentSnapshot { return liveness.NodeAgentSnapshot(n) }
