package collector

import (
	"strings"
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/nodeagent"
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
// DefaultConfig sets as the row says and Switches lists (the binary's
// --[no-]collector.<name>), and New builds exactly the enabled ones.
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

	for i, off := range registry {
		c := DefaultConfig()
		switches := c.Switches()
		if len(switches) != len(registry) {
			t.Fatalf("%d switches for %d collectors", len(switches), len(registry))
		}
		if s := switches[i]; s.Name != off.name || s.Help != off.help || s.On != off.on || s.Enabled != off.settings(&c).enabled() {
			t.Errorf("switch %d is %+v, not %s's", i, s, off.name)
		}
		*switches[i].Enabled = false
		for _, r := range registry {
			if got := *r.settings(&c).enabled(); got != (r.name != off.name && r.on) {
				t.Errorf("%s switched off: %s enabled = %v", off.name, r.name, got)
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
type fixedNodeAgent nodeagent.Snapshot

func (n fixedNodeAgent) Snapshot() nodeagent.Snapshot { return nodeagent.Snapshot(n) }
