// Package migrationstest builds migration sets that are newer than the binary's, to test
// how a binary behaves against a database a later release has migrated.
package migrationstest

import (
	"fmt"
	"testing"
	"testing/fstest"

	"github.com/pg-liveness/pg_liveness_exporter/migrations"
)

// Future returns the embedded migrations plus one more, of version Latest()+1, that
// adds a table and states compatibleFrom as the oldest binary it still serves.
func Future(t testing.TB, compatibleFrom int) migrations.Set {
	t.Helper()
	fsys := fstest.MapFS{}
	for _, m := range migrations.All() {
		fsys[fmt.Sprintf("%04d_%s.sql", m.Version, m.Name)] = &fstest.MapFile{Data: []byte(m.SQL)}
	}
	next := migrations.Latest() + 1
	fsys[fmt.Sprintf("%04d_from_the_future.sql", next)] = &fstest.MapFile{Data: []byte(fmt.Sprintf(
		"-- A later release's migration.\n-- compatible-from: %d\nCREATE TABLE future_additions (id integer PRIMARY KEY);\n", compatibleFrom))}
	set, err := migrations.LoadSet(fsys)
	if err != nil {
		t.Fatal(err)
	}
	return set
}
