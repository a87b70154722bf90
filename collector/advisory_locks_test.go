package collector

import "testing"

func TestFoldApps(t *testing.T) {
	apps := map[string]*appStats{}
	add := func(name string, backends, waiters, idle float64, holders map[string]float64) {
		apps[name] = &appStats{backends: backends, waiters: waiters, idleMax: idle, holders: holders}
	}
	add("big", 10, 1, 5, map[string]float64{"idle": 3})
	add("mid", 5, 0, 0, map[string]float64{"active": 1})
	add("a-small", 1, 2, 50, map[string]float64{"idle": 1})
	add("b-small", 1, 1, 7, map[string]float64{"idle": 1, "active": 0})

	if got := foldApps(apps, 4); len(got) != 4 {
		t.Fatalf("4 names with a limit of 4: folded to %d", len(got))
	}
	got := foldApps(apps, 2)
	if len(got) != 3 || got["big"] == nil || got["mid"] == nil || got["other"] == nil {
		t.Fatalf("kept %v, want big, mid and other", keys(got))
	}
	o := got["other"]
	if o.backends != 2 || o.waiters != 3 || o.idleMax != 50 || o.holders["idle"] != 2 || o.holders["active"] != 0 {
		t.Errorf("other = %+v, want the sums of a-small and b-small and the larger idle time", *o)
	}
	// Ties are broken by name, so the fold is stable from scrape to scrape.
	got = foldApps(apps, 3)
	if got["a-small"] == nil || got["b-small"] != nil {
		t.Errorf("kept %v, want a-small (ties by name)", keys(got))
	}
}

func keys(m map[string]*appStats) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
