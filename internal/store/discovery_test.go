package store

import "testing"

// DiscoverSource's argument is the source's instances table, quoted: ours in its schema,
// or Whizbang's.
func TestInstancesTableIsTheSourcesQuoted(t *testing.T) {
	ours, err := NewSource(SourceConfig{Schema: "Live ness"})
	if err != nil {
		t.Fatal(err)
	}
	wb, err := NewSource(SourceConfig{Kind: SourceWhizbang, Whizbang: Whizbang{Schema: "app", Prefix: "wh_"}})
	if err != nil {
		t.Fatal(err)
	}
	for src, want := range map[*Source]string{
		nil:  `"liveness"."instances"`,
		ours: `"Live ness"."instances"`,
		wb:   `"app"."wh_service_instances"`,
	} {
		if got := src.InstancesTable(); got != want {
			t.Errorf("%v: %s, want %s", src.Config(), got, want)
		}
	}
}
