package targets

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const secret = "s3cr'et\\pw"

// files writes a password file and a DSN file into a temporary folder and returns the
// folder.
func files(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	write(t, dir, "pw", secret+"\n")
	write(t, dir, "two-lines", "one\ntwo\n")
	write(t, dir, "orders.dsn", "host=db2 port=5433 user=obs password=dsnsecret dbname=orders sslmode=disable\n")
	write(t, dir, "base.dsn", "user=obs password=basesecret sslmode=require\n")
	write(t, dir, "url.dsn", "postgres://obs:urlsecret@db/x\n")
	if err := os.Chmod(write(t, dir, "open.pw", secret+"\n"), 0o646); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(write(t, dir, "open.dsn", "host=db2 password=dsnsecret\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	return dir
}

func write(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func load(t *testing.T, dir, yaml string) (*Config, error) {
	t.Helper()
	return Load(write(t, dir, "config.yml", strings.ReplaceAll(yaml, "DIR", dir)))
}

func TestLoadBuildsEachTargetsDSN(t *testing.T) {
	dir := files(t)
	cfg, err := load(t, dir, `
credentials:
  observer: {user: liveness_observer, password_file: DIR/pw, sslmode: verify-full}
  base: {dsn_file: DIR/base.dsn}
targets:
  billing: {host: db1.internal, port: 6432, database: billing, credentials: observer}
  orders: {dsn_file: DIR/orders.dsn}
  users: {host: db1.internal, database: "us'ers", credentials: base, sslmode: disable}
`)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Names(), ","); got != "billing,orders,users" {
		t.Fatalf("names %s", got)
	}
	want := map[string]string{
		"billing": `host='db1.internal' port=6432 user='liveness_observer' password='s3cr\'et\\pw' sslmode=verify-full dbname='billing'`,
		"orders":  "host=db2 port=5433 user=obs password=dsnsecret dbname=orders sslmode=disable",
		"users":   `user=obs password=basesecret sslmode=require host='db1.internal' sslmode=disable dbname='us\'ers'`,
	}
	for name, dsn := range want {
		tg, ok := cfg.Target(name)
		if !ok || tg.dsn != dsn {
			t.Errorf("%s: dsn %q, want %q", name, tg.dsn, dsn)
		}
		if strings.Contains(tg.Describe, "secret") || strings.Contains(tg.Describe, "s3cr") {
			t.Errorf("%s: Describe shows the password: %s", name, tg.Describe)
		}
	}
	if d := cfg.targets["users"].Describe; !strings.Contains(d, "dbname=us'ers") || !strings.Contains(d, "user=obs") {
		t.Errorf("users: Describe %q", d)
	}
}

func TestLoadRefusesBadInputNamingTheField(t *testing.T) {
	dir := files(t)
	cases := []struct{ name, yaml, want string }{
		{"unknown top-level field", "targetz: {}\n", "line 1: targetz: unknown field"},
		{"unknown target field", "targets:\n  a: {host: h, database: d, credentials: c, hostt: x}\ncredentials:\n  c: {user: u}\n", "targets.a.hostt: unknown field"},
		{"unknown credentials field", "credentials:\n  c: {user: u, password: x}\ntargets:\n  a: {host: h, database: d, credentials: c}\n", "credentials.c.password: unknown field"},
		{"duplicate target", "targets:\n  a: {dsn_file: DIR/orders.dsn}\n  a: {dsn_file: DIR/orders.dsn}\n", "line 3: targets.a: the name is given twice"},
		{"duplicate field", "targets:\n  a: {dsn_file: DIR/orders.dsn, dsn_file: DIR/orders.dsn}\n", "targets.a.dsn_file: given twice"},
		{"unknown credentials", "targets:\n  orders: {host: h, database: d, credentials: nobody}\n", `targets.orders.credentials: no credentials named "nobody"`},
		{"missing credentials", "targets:\n  orders: {host: h, database: d}\n", "targets.orders.credentials: missing"},
		{"missing database", "credentials:\n  c: {user: u}\ntargets:\n  orders: {host: h, credentials: c}\n", "targets.orders.database: missing"},
		{"nothing", "targets:\n  orders: {}\n", "targets.orders: needs dsn_file, or host, database and credentials"},
		{"dsn_file and host", "targets:\n  orders: {dsn_file: DIR/orders.dsn, host: h}\n", "targets.orders.host: a target with dsn_file"},
		{"bad port", "credentials:\n  c: {user: u}\ntargets:\n  o: {host: h, port: 70000, database: d, credentials: c}\n", `targets.o.port: "70000" is not a port`},
		{"bad sslmode", "credentials:\n  c: {user: u, sslmode: maybe}\ntargets:\n  o: {dsn_file: DIR/orders.dsn}\n", `credentials.c.sslmode: "maybe" is not one of`},
		{"bad name", "targets:\n  \"a b\": {dsn_file: DIR/orders.dsn}\n", `targets: "a b" is not a valid name`},
		{"long name", "targets:\n  " + strings.Repeat("a", 64) + ": {dsn_file: DIR/orders.dsn}\n", `targets: "` + strings.Repeat("a", 64) + `" is not a valid name`},
		{"no targets", "credentials: {}\n", "targets: missing"},
		{"empty discover", "discover: {}\n", "discover: is empty"},
		{"discover without host", "credentials:\n  c: {user: u}\ndiscover:\n  s: {credentials: c}\n", "discover.s.host: missing"},
		{"discover database", "credentials:\n  c: {user: u}\ndiscover:\n  s: {host: h, database: d, credentials: c}\n", "discover.s.database: unknown field"},
		{"discover credentials", "discover:\n  s: {host: h, credentials: nobody}\n", `discover.s.credentials: no credentials named "nobody"`},
		{"discover interval", "credentials:\n  c: {user: u}\ndiscover:\n  s: {host: h, credentials: c, interval: 10ms}\n", `discover.s.interval: "10ms" is not a duration of at least 1s`},
		{"discover max_databases", "credentials:\n  c: {user: u}\ndiscover:\n  s: {host: h, credentials: c, max_databases: 0}\n", `discover.s.max_databases: "0" is not a number of databases`},
		{"discover password file", "credentials:\n  c: {user: u, password_file: DIR/nope}\ndiscover:\n  s: {host: h, credentials: c}\n", "credentials.c.password_file: open"},
		{"empty targets", "targets: {}\n", "targets: is empty"},
		{"empty file", "", "the file is empty"},
		{"not yaml", "targets: [\n", "not valid YAML"},
		// A second document would be dropped, with the targets it names.
		{"two documents", "targets:\n  a: {dsn_file: DIR/orders.dsn}\n---\ntargets:\n  b: {dsn_file: DIR/orders.dsn}\n", "line 3: a --- line starts a second YAML document; write the configuration as one document"},
		{"an empty second document", "targets:\n  a: {dsn_file: DIR/orders.dsn}\n---\n", "line 3: a --- line starts a second YAML document"},
		{"a second document not valid", "targets:\n  a: {dsn_file: DIR/orders.dsn}\n---\ntargets: [\n", "a --- line starts a second YAML document, not valid YAML"},
		{"unreadable dsn file", "targets:\n  o: {dsn_file: DIR/missing.dsn}\n", "targets.o.dsn_file: open"},
		{"unreadable password file", "credentials:\n  c: {user: u, password_file: DIR/nope}\ntargets:\n  o: {host: h, database: d, credentials: c}\n", "credentials.c.password_file: open"},
		{"password file of two lines", "credentials:\n  c: {user: u, password_file: DIR/two-lines}\ntargets:\n  o: {host: h, database: d, credentials: c}\n", "credentials.c.password_file: " + dir + "/two-lines holds more than one line"},
		{"world-writable password file", "credentials:\n  c: {user: u, password_file: DIR/open.pw}\ntargets:\n  o: {host: h, database: d, credentials: c}\n", "credentials.c.password_file: " + dir + "/open.pw is writable by every user (mode 0646)"},
		{"world-writable dsn file", "targets:\n  o: {dsn_file: DIR/open.dsn}\n", "targets.o.dsn_file: " + dir + "/open.dsn is writable by every user (mode 0666)"},
		{"user and dsn_file", "credentials:\n  c: {user: u, dsn_file: DIR/base.dsn}\ntargets:\n  o: {host: h, database: d, credentials: c}\n", "credentials.c: give either dsn_file or user"},
		{"credentials URL", "credentials:\n  c: {dsn_file: DIR/url.dsn}\ntargets:\n  o: {host: h, database: d, credentials: c}\n", "credentials.c.dsn_file: holds a URL"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := load(t, dir, c.yaml)
			if err == nil {
				t.Fatalf("accepted:\n%s", c.yaml)
			}
			msg := err.Error()
			if want := strings.ReplaceAll(c.want, "DIR", dir); !strings.Contains(msg, want) {
				t.Errorf("error %q does not say %q", msg, want)
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("error is more than one line: %q", msg)
			}
			for _, s := range []string{"s3cr", "secret"} {
				if strings.Contains(msg, s) {
					t.Errorf("error shows a secret: %q", msg)
				}
			}
		})
	}
}

func TestLoadReadsDiscoverEntries(t *testing.T) {
	dir := files(t)
	cfg, err := load(t, dir, `
credentials:
  observer: {user: liveness_observer, password_file: DIR/pw, sslmode: verify-full}
discover:
  main: {host: db1.internal, port: 6432, credentials: observer}
  other: {host: db2.internal, credentials: observer, maintenance_database: admin, interval: 30s, max_databases: 7, sslmode: disable}
`)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Names()) != 0 {
		t.Fatalf("targets %v from a file of discover entries only", cfg.Names())
	}
	got := cfg.Discover()
	if len(got) != 2 || got[0].Name != "main" || got[1].Name != "other" {
		t.Fatalf("discover entries %+v", got)
	}
	if got[0].MaxDatabases != DefaultMaxDatabases || got[1].MaxDatabases != 7 {
		t.Errorf("max_databases: %d and %d, want the default and 7", got[0].MaxDatabases, got[1].MaxDatabases)
	}
	if got[0].Maintenance != "postgres" || got[0].Interval != DefaultDiscoverInterval || got[1].Maintenance != "admin" || got[1].Interval != 30*time.Second {
		t.Errorf("maintenance databases and intervals: %+v", got)
	}
	if d, want := got[0].dsn("orders"), `host='db1.internal' port=6432 user='liveness_observer' password='s3cr\'et\\pw' sslmode=verify-full dbname='orders'`; d != want {
		t.Errorf("dsn %q, want %q", d, want)
	}
	if d := got[1].dsn("o'rders"); !strings.HasSuffix(d, `sslmode=disable dbname='o\'rders'`) {
		t.Errorf("dsn %q: the entry's sslmode and a quoted database name", d)
	}
	for _, s := range got {
		if strings.Contains(s.Describe, "s3cr") || !strings.Contains(s.Describe, "dbname="+s.Maintenance) {
			t.Errorf("%s: Describe %q", s.Name, s.Describe)
		}
	}
}

// The example the multi-target overlay ships loads, once its password file exists.
func TestShippedExampleLoads(t *testing.T) {
	b, err := os.ReadFile("../../deploy/kubernetes/overlays/multi-target/targets.yml.example")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write(t, dir, "observer.password", "pw\n")
	cfg, err := load(t, dir, strings.ReplaceAll(string(b), "/etc/pg-liveness-exporter", "DIR"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Names(), ","); got != "billing,orders" {
		t.Errorf("targets %s", got)
	}
}

// A name is 1 to 63 letters, digits, '_', '.' or '-', starting with a letter or digit.
func TestValidName(t *testing.T) {
	for name, want := range map[string]bool{
		"a": true, "orders-2.eu_west": true, "9": true, strings.Repeat("x", 63): true,
		"": false, strings.Repeat("x", 64): false, ".a": false, "-a": false, "_a": false, "a b": false,
		"a/b": false, "a\n": false, "é": false,
	} {
		if got := validName(name); got != want {
			t.Errorf("validName(%q) = %v, want %v", name, got, want)
		}
	}
}
