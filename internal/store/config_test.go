package store

import (
	"strings"
	"testing"
)

// Names PostgreSQL would cut or refuses are refused before any statement is sent.
func TestValidateSchemaName(t *testing.T) {
	for _, ok := range []string{"liveness", "Live Ness", strings.Repeat("s", MaxIdentifierLength), "ünïcode", "Pg_upper"} {
		if err := ValidateSchemaName(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", strings.Repeat("s", MaxIdentifierLength+1), strings.Repeat("é", 32), "pg_liveness", "pg_", "a\x00b", "a\xffb"} {
		if err := ValidateSchemaName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// One rule for every identifier from the configuration; "pg_" is reserved for schemas
// only.
func TestValidateIdentifier(t *testing.T) {
	for _, c := range []struct {
		kind IdentifierKind
		name string
		ok   bool
	}{
		{TableName, "pg_leases", true},
		{SchemaName, "pg_leases", false},
		{TableName, "wh_service_instances", true},
		{TableName, strings.Repeat("t", 63), true},
		{TableName, strings.Repeat("t", 64), false},
		{TableName, "", false},
		{TableName, "lea\tses", false},
		{SchemaName, "live\u0085ness", false}, // a C1 control character
		{SchemaName, "Live Ness", true},
		{TableName, "caf\xe9", false},
	} {
		err := ValidateIdentifier(c.kind, c.name)
		if (err == nil) != c.ok {
			t.Errorf("ValidateIdentifier(%v, %q) = %v, want ok %v", c.kind, c.name, err, c.ok)
		}
	}
}

// "table" is looked up in the search_path, "schema.table" in its schema; every part is
// checked like any identifier, and the error quotes what was given.
func TestParseTable(t *testing.T) {
	for in, want := range map[string]string{"leases": `"leases"`, "blog.leases": `"blog"."leases"`, `a"b.c d`: `"a""b"."c d"`} {
		got, err := ParseTable(in)
		if err != nil || got.Quoted() != want || got.String() != in {
			t.Errorf("ParseTable(%q) = %s (%s), %v; want %s", in, got.Quoted(), got, err, want)
		}
	}
	for _, bad := range []string{"", ".leases", "x.", "a.b.c", "pg_catalog.leases", strings.Repeat("l", 64)} {
		if _, err := ParseTable(bad); err == nil || !strings.Contains(err.Error(), `"`+bad+`"`) {
			t.Errorf("ParseTable(%q): %v, want an error quoting it", bad, err)
		}
	}
}
