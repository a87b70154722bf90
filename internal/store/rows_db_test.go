package store_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"

	"github.com/jackc/pgx/v5"

	"github.com/pg-liveness/pg_liveness_exporter/internal/store"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testdb"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/whizbangtest"
)

// dbTags are a row type's column names, in field order, an embedded struct's in its
// place (as pgx.RowToStructByName reads them).
func dbTags(row any) []string {
	var out []string
	t := reflect.TypeOf(row)
	for i := range t.NumField() {
		if f := t.Field(i); f.Anonymous {
			out = append(out, dbTags(reflect.Zero(f.Type).Interface())...)
		} else {
			out = append(out, f.Tag.Get("db"))
		}
	}
	return out
}

// jsonKeys are a type's JSON keys, sorted.
func jsonKeys(v any) []string {
	var out []string
	t := reflect.TypeOf(v)
	for i := range t.NumField() {
		out = append(out, strings.Split(t.Field(i).Tag.Get("json"), ",")[0])
	}
	slices.Sort(out)
	return out
}

// Every row type is its statement's columns, by name and in order, for every source, as
// this major describes the rendered statement; and read_fleet's objects have exactly the
// keys of their types.
func TestRowTypesAreTheirStatementsColumns(t *testing.T) {
	db, admin := testdb.MigratedPool(t, 2)
	db.Exec(t, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	wh := whizbangtest.NewFixture(t, db)
	whizbang := wh.Reads(t)
	table := store.Table{Schema: store.DefaultSchema, Name: "leases"}
	queries := map[string][]store.Query{
		store.LeaseLeader.Name():         {store.LeaseLeader.In("")},
		store.StatStatements.Name():      {store.StatStatements.In("public")},
		store.StatStatementsTexts.Name(): {store.StatStatementsTexts.In("public")},
		"leases":                         {store.LeasesFor(table, store.OurLeasesShape()), store.LeasesFor(table, nil)},
	}
	for _, st := range []store.SourceStatement{store.Instances, store.AdvisoryLocks, store.AdvisoryLocksOfSnapshot, store.ReadInstances, store.ReadFleet} {
		queries[st.Name()] = []store.Query{st.For(nil), st.For(whizbang)}
	}
	queries[store.Instances.Name()] = append(queries[store.Instances.Name()], store.InstancesOfLocks(nil), store.InstancesOfLocks(whizbang))
	queries[store.ServerAdvisoryLocks.Name()] = []store.Query{store.ServerAdvisoryLocks.In("")}
	conn, err := admin.Acquire(testutil.Context(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	checked := 0
	for _, d := range store.Statements() {
		if d.Row == nil {
			continue
		}
		qs := queries[d.Name]
		if len(qs) == 0 {
			t.Errorf("%s has the row type %T, which this test does not check", d.Name, d.Row)
		}
		for i, q := range qs {
			desc, err := conn.Conn().Prepare(testutil.Context(t, 30*time.Second), "", q.SQL)
			if err != nil {
				t.Errorf("%s (%d): %v", d.Name, i, err)
				continue
			}
			var cols []string
			for _, f := range desc.Fields {
				cols = append(cols, f.Name)
			}
			if want := dbTags(d.Row); !slices.Equal(cols, want) {
				t.Errorf("%s (%d): columns %v, but %T reads %v", d.Name, i, cols, d.Row, want)
			}
			checked++
		}
	}
	if checked < 10 {
		t.Fatalf("%d statements checked", checked)
	}

	// read_fleet's objects, one of each kind: an instance and a lease of ours.
	db.Exec(t, `INSERT INTO liveness.instances (instance_id, service_name, last_heartbeat_at) VALUES (gen_random_uuid(), 'orders', now());
		INSERT INTO liveness.leases (name, holder, expires_at) VALUES ('mail', 'node-1:1', now() + interval '1 minute')`)
	q := store.ReadFleet.For(nil)
	rows, err := admin.Query(testutil.Context(t, 30*time.Second), q.SQL, q.Args(nil, nil, 0, 10, nil, 0, 10)...)
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := pgx.CollectRows(rows, pgx.RowToStructByName[store.FleetRow])
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]any{"meta": store.FleetMeta{}, "count": store.FleetCount{}, "instance": store.InstanceRow{}, "lease": store.FleetLease{}}
	seen := map[string]bool{}
	for _, r := range fleet {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(r.Object, &obj); err != nil {
			t.Fatal(err)
		}
		var keys []string
		for k := range obj {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if want := jsonKeys(types[r.Kind]); !slices.Equal(keys, want) {
			t.Errorf("read_fleet's %q object has the keys %v, but %T reads %v", r.Kind, keys, types[r.Kind], want)
		}
		dec := json.NewDecoder(bytes.NewReader(r.Object))
		dec.DisallowUnknownFields()
		into := reflect.New(reflect.TypeOf(types[r.Kind])).Interface()
		if err := dec.Decode(into); err != nil {
			t.Errorf("read_fleet's %q object into %T: %v", r.Kind, types[r.Kind], err)
		}
		seen[r.Kind] = true
	}
	if len(seen) != len(types) {
		t.Errorf("read_fleet returned the kinds %v, want meta, count, instance and lease", seen)
	}
}
