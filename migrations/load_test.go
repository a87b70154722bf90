package migrations

import (
	"testing"
	"testing/fstest"
)

func TestLoadOrdersAndValidates(t *testing.T) {
	ms, err := load(fstest.MapFS{
		"sql/0002_b.sql": {Data: []byte("B")},
		"sql/0001_a.sql": {Data: []byte("A")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].Name != "a" || ms[1].Version != 2 || ms[1].SQL != "B" {
		t.Fatalf("load = %+v", ms)
	}
	for name, fsys := range map[string]fstest.MapFS{
		"gap":      {"sql/0001_a.sql": {}, "sql/0003_c.sql": {}},
		"bad name": {"sql/0001_a.sql": {}, "sql/2_b.sql": {}},
		"no 0001":  {"sql/0002_b.sql": {}},
	} {
		if _, err := load(fsys); err == nil {
			t.Errorf("%s: load accepted it", name)
		}
	}
}

func TestEmbeddedMigrationsLoad(t *testing.T) {
	if Latest() < 2 || len(All()) != Latest() {
		t.Fatalf("embedded migrations: latest %d, %d files", Latest(), len(All()))
	}
}
