package migrations

import (
	"strings"
	"testing"
	"testing/fstest"
)

// loadValid is load of a set the test says is valid.
func loadValid(t *testing.T, fsys fstest.MapFS) []Migration {
	t.Helper()
	ms, err := load(fsys, true)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

func TestLoadOrdersAndValidates(t *testing.T) {
	ms := loadValid(t, fstest.MapFS{
		"0002_b.sql": {Data: []byte("-- compatible-from: 1\nB")},
		"0001_a.sql": {Data: []byte("-- compatible-from: 1\nA")},
	})
	if len(ms) != 2 || ms[0].Name != "a" || ms[1].Version != 2 || !strings.HasSuffix(ms[1].SQL, "\nB") || ms[1].CompatibleFrom != 1 {
		t.Fatalf("load = %+v", ms)
	}
	for name, fsys := range map[string]fstest.MapFS{
		"gap":      {"0001_a.sql": {}, "0003_c.sql": {}},
		"bad name": {"0001_a.sql": {}, "2_b.sql": {}},
		"no 0001":  {"0002_b.sql": {}},
		// Every file states the oldest binary it still serves, within 1..its version.
		"no compatible-from":                {"0001_a.sql": {Data: []byte("-- compatible-from: 1\nA")}, "0002_b.sql": {Data: []byte("-- just a comment\nB")}},
		"compatible-from after the SQL":     {"0001_a.sql": {Data: []byte("A\n-- compatible-from: 1\n")}},
		"compatible-from above own version": {"0001_a.sql": {Data: []byte("-- compatible-from: 2\nA")}},
		"compatible-from zero":              {"0001_a.sql": {Data: []byte("-- compatible-from: 0\nA")}},
	} {
		if _, err := load(fsys, false); err == nil {
			t.Errorf("%s: load accepted it", name)
		}
	}
}

func TestEmbeddedMigrationsLoad(t *testing.T) {
	if Latest() < 2 || len(All()) != Latest() {
		t.Fatalf("embedded migrations: latest %d, %d files", Latest(), len(All()))
	}
}

func TestCompatibleFromHeader(t *testing.T) {
	ms := loadValid(t, fstest.MapFS{
		"0001_a.sql": {Data: []byte("-- compatible-from: 1\nA")},
		"0002_b.sql": {Data: []byte("-- What b does.\n\n--   compatible-from:  2  \n-- more\nB")},
	})
	if ms[0].CompatibleFrom != 1 || ms[1].CompatibleFrom != 2 {
		t.Fatalf("compatible-from = %d, %d; want 1, 2", ms[0].CompatibleFrom, ms[1].CompatibleFrom)
	}
	for _, m := range All() {
		if m.CompatibleFrom < 1 || m.CompatibleFrom > m.Version {
			t.Errorf("%04d_%s: compatible-from %d", m.Version, m.Name, m.CompatibleFrom)
		}
	}
}

// The embedded set keeps no SQL in memory and reads each file's when it applies it:
// the same text as All's.
func TestEmbeddedReadsItsSQLWhenApplying(t *testing.T) {
	full := All()
	for i, m := range Embedded {
		if m.SQL != "" {
			t.Errorf("%04d_%s: Embedded holds its SQL", m.Version, m.Name)
		}
		sql, err := m.text()
		if err != nil || sql != full[i].SQL || sql == "" {
			t.Errorf("%04d_%s: text() = %d bytes, %v; want All's %d bytes", m.Version, m.Name, len(sql), err, len(full[i].SQL))
		}
	}
}
