package store

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// Every refusal names the SourceConfig field at fault, so that a binary can map it to
// its flag, and the defaults pass.
func TestNewSourceNamesTheField(t *testing.T) {
	whizbang := func(mutate func(*Whizbang)) SourceConfig {
		w := DefaultWhizbang()
		mutate(&w)
		return SourceConfig{Kind: SourceWhizbang, Whizbang: w}
	}
	for field, cfg := range map[string]SourceConfig{
		"SourceConfig.Kind":                              {Kind: "ours"},
		"SourceConfig.Schema":                            {Schema: "pg_catalog"},
		"SourceConfig.Fallback.StaleThreshold":           {Fallback: Timing{StaleThreshold: -time.Second}},
		"SourceConfig.Fallback.DefinitiveDeadCutoff":     {Fallback: Timing{StaleThreshold: time.Hour}},
		"SourceConfig.Whizbang.Schema":                   whizbang(func(w *Whizbang) { w.Schema = "pg_x" }),
		"SourceConfig.Whizbang.Prefix":                   whizbang(func(w *Whizbang) { w.Prefix = strings.Repeat("p", 60) }),
		"SourceConfig.Whizbang.NoPrefix":                 whizbang(func(w *Whizbang) { w.NoPrefix = true }),
		"SourceConfig.Whizbang.LockKeyPrefix":            whizbang(func(w *Whizbang) { w.LockKeyPrefix = "a\x00b" }),
		"SourceConfig.Whizbang.Timing.HeartbeatInterval": whizbang(func(w *Whizbang) { w.Timing.HeartbeatInterval = -time.Second }),
		"SourceConfig.Whizbang.Timing.HeartbeatSlowInterval": whizbang(func(w *Whizbang) {
			w.Timing.HeartbeatSlowInterval = time.Second
		}),
		"SourceConfig.Whizbang.Timing.StaleThreshold": whizbang(func(w *Whizbang) { w.Timing.StaleThreshold = w.Timing.HeartbeatSlowInterval }),
		"SourceConfig.Whizbang.Timing.DefinitiveDeadCutoff": whizbang(func(w *Whizbang) {
			w.Timing.DefinitiveDeadCutoff = w.Timing.StaleThreshold
		}),
		"SourceConfig.Whizbang.Timing.LockGrace": whizbang(func(w *Whizbang) { w.Timing.LockGrace = time.Second }),
	} {
		_, err := NewSource(cfg)
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != field {
			t.Errorf("%s out of range: got %v, want a ConfigError for %s", field, err, field)
		}
	}
	for _, cfg := range []SourceConfig{{}, {Kind: SourceWhizbang}, whizbang(func(*Whizbang) {})} {
		if _, err := NewSource(cfg); err != nil {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}

// Zero fields take the defaults; an empty prefix is Whizbang's wh_ unless NoPrefix, and
// then no prefix at all, for every statement the source renders.
func TestNewSourceFillsTheDefaults(t *testing.T) {
	src, err := NewSource(SourceConfig{Kind: SourceWhizbang})
	if err != nil {
		t.Fatal(err)
	}
	if got := src.Config().Whizbang; got != DefaultWhizbang() {
		t.Errorf("defaults: %+v, want %+v", got, DefaultWhizbang())
	}
	if src.Table() != "public.wh_service_instances" || src.Schema() != DefaultSchema || src.HasLeases() {
		t.Errorf("table %s, schema %s, leases %v", src.Table(), src.Schema(), src.HasLeases())
	}
	bare, err := NewSource(SourceConfig{Kind: SourceWhizbang, Whizbang: Whizbang{NoPrefix: true}})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []SourceStatement{Instances, AdvisoryLocks, ReadInstances, ReadFleet} {
		if q := st.For(bare); !strings.Contains(q.SQL, `"public"."service_instances"`) || strings.Contains(q.SQL, "wh_") {
			t.Errorf("%s without a prefix reads another table:\n%s", st.Name(), q.SQL)
		}
	}
	ours, err := NewSource(SourceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if c := ours.Config(); c.Kind != SourceLiveness || c.Fallback.StaleThreshold != DefaultStaleThreshold ||
		c.Fallback.DefinitiveDeadCutoff != DefaultDefinitiveDeadCutoff || !ours.HasLeases() {
		t.Errorf("our defaults: %+v", c)
	}
}
