package binaries

import (
	"os"
	"slices"
	"testing"
	"time"
)

// Build makes both programs; the exporter's help shows a default for every agent flag,
// each a duration but the keepalive count; Remove deletes them.
func TestBuildAndAgentDefaults(t *testing.T) {
	b, err := Build("pg_liveness_binaries_test_")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Remove()
	for _, p := range []string{b.Exporter, b.Agent} {
		if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
			t.Fatalf("%s: %v, not an executable", p, err)
		}
	}
	d, err := b.AgentDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range AgentFlags {
		if name == "agent.tcp-keepalive-count" {
			continue
		}
		if _, err := time.ParseDuration(d[name]); err != nil {
			t.Errorf("--%s=%q: %v", name, d[name], err)
		}
	}
	b.Remove()
	if _, err := os.Stat(b.Dir); !os.IsNotExist(err) {
		t.Errorf("after Remove, %s: %v", b.Dir, err)
	}
	if _, err := (Built{Exporter: b.Exporter}).AgentDefaults(); err == nil {
		t.Error("AgentDefaults of a removed exporter: no error")
	}
	if !slices.Contains(AgentFlags, "agent.stale-threshold") {
		t.Error("AgentFlags leaves out the stale threshold, which the samplers read verdicts at")
	}
}
