package store

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"
)

// sources are the two kinds of source, with every default.
func sources(t *testing.T) map[SourceKind]*Source {
	t.Helper()
	out := map[SourceKind]*Source{}
	for _, k := range []SourceKind{SourceLiveness, SourceWhizbang} {
		s, err := NewSource(SourceConfig{Kind: k})
		if err != nil {
			t.Fatal(err)
		}
		out[k] = s
	}
	return out
}

// rendered is every statement of sql/ rendered the ways the product renders it: a
// schema statement for a schema, a source statement for each source, the leases
// statement for each shape.
func rendered(t *testing.T) map[string][]Query {
	t.Helper()
	out := map[string][]Query{}
	for _, st := range []Statement{AliveLockClaim, AliveLockVerify, AliveLockHolder, AliveLockRelease, LockDatabase, NodeAgentDeadInstances,
		NodeAgentRowsClaimingLocks, Heartbeat, HeartbeatDelete, Cleanup,
		WatchAliveLocks, NotifyDeadInstances, WatchFresh, EventsListen, MembersListen, MembersUnlisten,
		LeaseAcquire, LeaseRenew, LeaseRenewMany, LeaseAcquireMany, LeaseAbandonMany, LeaseReleaseMany, LeaseDetachMany,
		ShardMembers, ShardFree, LeaseRelease, LeaseAbandon, LeaseDetach, LeaseLeader, LeaseFence,
		LeaseFenceStrict, LeaseFenceCommit, LeaseFenceExec, SchemaState, SchemaMigrations, SchemaVersion,
		MigrateLock, MigrateSchema, MigrateBookkeeping, MigrateApplied, MigrateSearchPath, MigrateRecord,
		StatStatementsSchema, StatStatements, StatStatementsTexts,
		DiscoverDatabases, DiscoverSource, ServerAdvisoryLocks, DatabaseIdentity,
		HistorySince, HistoryLastID, HistoryRecent, LeaseLeaderless, HistoryPrune} {
		out[st.Name()] = append(out[st.Name()], st.In("liveness"))
	}
	for _, src := range sources(t) {
		for _, st := range []SourceStatement{ReadInstances, ReadFleet, Instances, AdvisoryLocks, AdvisoryLocksOfSnapshot} {
			out[st.Name()] = append(out[st.Name()], st.For(src))
		}
		out[Instances.Name()] = append(out[Instances.Name()], InstancesOfLocks(src))
	}
	table := Table{Schema: "liveness", Name: "leases"}
	for _, shape := range [][]string{nil, OurLeasesShape(), {"epoch"}, {LeasesUniqueName}} {
		out[leasesStatement] = append(out[leasesStatement], LeasesFor(table, shape))
	}
	out[whizbangTable] = append(out[whizbangTable], render(sections.section(whizbangTable, kindStatement), "", nil))
	return out
}

// Every statement of sql/ is rendered somewhere above, fills every placeholder, and
// carries its tag right after its first keyword, where PostgreSQL 14 to 18 all keep it in
// pg_stat_statements' text; untagged ones carry none.
func TestEveryStatementRendersWithItsTag(t *testing.T) {
	all := rendered(t)
	for _, d := range Statements() {
		qs := all[d.Name]
		if len(qs) == 0 {
			t.Errorf("%s (%s) is rendered by nothing in this test", d.Name, d.File)
			continue
		}
		for _, q := range qs {
			if m := placeholder.FindString(q.SQL); m != "" {
				t.Errorf("%s: %s left in:\n%s", d.Name, m, q.SQL)
			}
			tags := regexp.MustCompile(regexp.QuoteMeta(TagPrefix)+`[a-z_]+`).FindAllString(q.SQL, -1)
			if d.Tag == "" {
				if len(tags) != 0 {
					t.Errorf("%s is untagged but sends %v", d.Name, tags)
				}
				continue
			}
			want := regexp.MustCompile(`^[A-Za-z]+ /\* ` + regexp.QuoteMeta(TagPrefix+d.Tag) + ` \*/ `)
			if !want.MatchString(q.SQL) || len(tags) != 1 {
				t.Errorf("%s: want its one tag %s right after its first keyword, got %v in:\n%.120s", d.Name, d.Tag, tags, q.SQL)
			}
		}
	}
}

// Tags lists each tag once, well formed; statements sent under another's tag name a tag
// that a statement of its own carries.
func TestTagsAreListedOnce(t *testing.T) {
	tags := Tags()
	if len(tags) < 10 {
		t.Fatalf("Tags() = %v", tags)
	}
	seen := map[string]bool{}
	for _, tag := range tags {
		if seen[tag] || !statementName.MatchString(tag) {
			t.Errorf("tag %q: listed twice or malformed", tag)
		}
		seen[tag] = true
	}
	for _, d := range Statements() {
		if d.Tag != "" && d.Tag != d.Name && !slices.ContainsFunc(Statements(), func(o Described) bool { return o.Name == d.Tag }) {
			t.Errorf("%s is sent as %s, which no statement of that name carries", d.Name, d.Tag)
		}
	}
	if Heartbeat.Tag() != "heartbeat" || MigrateLock.Tag() != "" || LeaseAbandon.Tag() != "lease_release" {
		t.Errorf("tags: heartbeat %q, migrate_lock %q, lease_abandon %q", Heartbeat.Tag(), MigrateLock.Tag(), LeaseAbandon.Tag())
	}
}

// A user's identifier is quoted once and never scanned again: a leases table and schema
// named like placeholders, and a schema with quotes, come out as the same names.
func TestIdentifiersAreFilledInOnePass(t *testing.T) {
	q := LeasesFor(Table{Schema: "{epoch}", Name: "{table}"}, OurLeasesShape())
	if n := strings.Count(q.SQL, `"{epoch}"."{table}"`); n != 2 {
		t.Errorf("the table is named %d times, want 2:\n%s", n, q.SQL)
	}
	if strings.Contains(q.SQL, "NULL::bigint AS epoch") || !strings.Contains(q.SQL, "l.epoch AS epoch") {
		t.Errorf("the epoch column of a table with one is not read:\n%s", q.SQL)
	}
	q = LeaseAcquire.In(`{epoch_seq}"x'`)
	if !strings.Contains(q.SQL, `FROM "{epoch_seq}""x'".lease_take(`) {
		t.Errorf("schema with placeholders and quotes:\n%s", q.SQL)
	}
	src, err := NewSource(SourceConfig{Kind: SourceWhizbang, Whizbang: Whizbang{Schema: "{lock_key_prefix}", Prefix: "{table}"}})
	if err != nil {
		t.Fatal(err)
	}
	q = Instances.For(src)
	if n := strings.Count(q.SQL, `"{lock_key_prefix}"."{table}service_instances"`); n != 3 {
		t.Errorf("the Whizbang table is named %d times, want 3:\n%s", n, q.SQL)
	}
}

// The source's values are bind parameters after the statement's own, in the order they
// first appear, each once however often it is used; Args puts them after the caller's.
func TestSourceValuesAreParametersAfterTheStatementsOwn(t *testing.T) {
	src := sources(t)[SourceWhizbang]
	q := AdvisoryLocks.For(src)
	if strings.Count(q.SQL, "$1::text") != 1 || strings.Contains(q.SQL, "$2") {
		t.Errorf("advisory_locks takes no parameter of its own, so the key prefix is $1 alone:\n%s", q.SQL)
	}
	if got := q.Args(); len(got) != 1 || got[0] != DefaultWhizbangLockKeyPrefix {
		t.Errorf("Args() = %v", got)
	}
	q = Instances.For(src)
	if strings.Count(q.SQL, "$2::text") != 2 || !strings.Contains(q.SQL, "$3::interval AS p_stale") ||
		!strings.Contains(q.SQL, "$4::interval AS p_dead") || !strings.Contains(q.SQL, "LIMIT $1") {
		t.Errorf("instances: its own $1, then the key prefix (twice), the stale threshold and the cutoff:\n%s", q.SQL)
	}
	if got := q.Args(500); len(got) != 4 || got[0] != 500 || got[1] != DefaultWhizbangLockKeyPrefix ||
		got[2] != DefaultWhizbangStaleThreshold || got[3] != DefaultWhizbangDefinitiveDeadCutoff {
		t.Errorf("Args(500) = %v", got)
	}
	ours, err := NewSource(SourceConfig{Schema: "s", Fallback: Timing{StaleThreshold: time.Minute, DefinitiveDeadCutoff: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	q = ReadFleet.For(ours)
	if !strings.Contains(q.SQL, `"s".instance_states($8::interval, $9::interval)`) {
		t.Errorf("read_fleet has 7 parameters of its own; the fallback timing follows:\n%s", q.SQL)
	}
	if got := q.Args(1, 2, 3, 4, 5, 6, 7); len(got) != 9 || got[7] != time.Minute || got[8] != time.Hour {
		t.Errorf("Args = %v", got)
	}
	// A fragment that names a higher parameter of the statement's own than the
	// statement's text does moves the source's parameters past it.
	sections.byName["test.own_param"] = &section{name: "test.own_param", kind: kindFragment, body: "$3::int + {stale}::int"}
	defer delete(sections.byName, "test.own_param")
	q = render(&section{name: "test", kind: kindStatement, body: "SELECT $1, {own_param}"}, "test", ours.vals)
	if q.SQL != "SELECT $1, $3::int + $4::int" {
		t.Errorf("a fragment's own $3: got %s, want the stale threshold as $4", q.SQL)
	}
}

// What the files may not hold is refused when they load, naming the file.
func TestLoadRefusesMalformedFiles(t *testing.T) {
	for name, text := range map[string]string{
		"text before the first section":  "SELECT 1\n-- name: a_b\nSELECT 1",
		"a malformed statement name":     "-- name: A\nSELECT 1",
		"an unknown option":              "-- name: a_b sometimes\nSELECT 1",
		"a malformed tag":                "-- name: a_b tag=X\nSELECT 1",
		"no text":                        "-- name: a_b\n-- only a comment\n",
		"no keyword to tag":              "-- name: a_b\n(SELECT 1)",
		"a fragment ending in a comment": "-- fragment: f\nx -- trailing",
		"a malformed fragment name":      "-- fragment: Whizbang.x\nx",
	} {
		if _, err := load(fstest.MapFS{"sql/x.sql": {Data: []byte(text)}}); err == nil || !strings.Contains(err.Error(), "x.sql") {
			t.Errorf("%s: got %v, want an error naming x.sql", name, err)
		}
	}
	_, err := load(fstest.MapFS{"sql/a.sql": {Data: []byte("-- name: a_b\nSELECT 1")}, "sql/b.sql": {Data: []byte("-- fragment: a_b\nx")}})
	if err == nil || !strings.Contains(err.Error(), "a.sql") || !strings.Contains(err.Error(), "b.sql") {
		t.Errorf("a name defined twice: got %v, want an error naming both files", err)
	}
	c, err := load(fstest.MapFS{"sql/x.sql": {Data: []byte("-- The file's doc.\n\n-- name: a_b\n-- Its doc.\nSELECT 1,\n       2\n\n-- name: c_d untagged\nSELECT 3")}})
	if err != nil {
		t.Fatal(err)
	}
	if a := c.byName["a_b"]; a.doc != "Its doc." || a.body != "SELECT /* pg_liveness:a_b */ 1,\n       2" || c.byName["c_d"].body != "SELECT 3" {
		t.Errorf("parsed: %q %q / %q", a.doc, a.body, c.byName["c_d"].body)
	}
}

// The rule's parameters must all be bound by the fragment that inserts it, and nothing
// else: a rule that grew a parameter would otherwise resolve it to something else.
func TestRuleBindingMustMatchTheRule(t *testing.T) {
	rule := InstanceStateRule()
	frag := sections.section("whizbang.verdicts", kindFragment)
	if err := checkRuleBinding(rule, frag); err != nil {
		t.Fatal(err)
	}
	grown := StateRule{Body: rule.Body, Params: append(slices.Clone(rule.Params), "p_new")}
	if err := checkRuleBinding(grown, frag); err == nil || !strings.Contains(err.Error(), "p_new") {
		t.Errorf("a rule with a parameter the fragment does not bind: %v", err)
	}
	shrunk := StateRule{Body: rule.Body, Params: rule.Params[1:]}
	if err := checkRuleBinding(shrunk, frag); err == nil {
		t.Error("a fragment binding a parameter the rule does not have was accepted")
	}
	_, err := parseStateRule(fstest.MapFS{"0001_a.sql": {Data: []byte(
		"CREATE FUNCTION instance_state_rule(p_a boolean) RETURNS text LANGUAGE sql AS $$ SELECT CASE WHEN p_b THEN 'x' END $$;")}})
	if err == nil || !strings.Contains(err.Error(), "p_b") {
		t.Errorf("a body naming a non-parameter: %v", err)
	}
}

// The side-by-side script is the Whizbang verdict inside a function whose parameters
// hold the timing and key prefix, their defaults the source's.
func TestSideBySideScriptRendersTheSourcesVerdict(t *testing.T) {
	src, err := NewSource(SourceConfig{Kind: SourceWhizbang, Whizbang: Whizbang{LockKeyPrefix: `it's\`}})
	if err != nil {
		t.Fatal(err)
	}
	script, err := src.SideBySideScript("my schema")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`CREATE OR REPLACE FUNCTION "my schema".whizbang_instance_states(`,
		`p_lock_key_prefix        text     DEFAULT E'it''s\\')`, `hashtext(p_lock_key_prefix::text || i.instance_id::text)`,
		`p_stale_threshold::interval AS p_stale`, `FROM "public"."wh_service_instances" i`} {
		if !strings.Contains(script, want) {
			t.Errorf("no %s in:\n%s", want, script)
		}
	}
	if m := placeholder.FindString(script); m != "" || strings.Contains(script, "$1") {
		t.Errorf("%q or a bind parameter left in the script", m)
	}
	if _, err := sources(t)[SourceLiveness].SideBySideScript("liveness"); err == nil {
		t.Error("a side-by-side script for our own source")
	}
}
