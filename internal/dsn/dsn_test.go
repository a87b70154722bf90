package dsn

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func TestRedact(t *testing.T) {
	cases := []string{
		"host=db user=app password=s3cr3t dbname=x",
		"host=db user=app password = 's3 cr3t' dbname=x",
		"host=db PASSWORD=s3cr3t",
		"postgres://app:s3cr3t@db:5432/x?sslmode=disable",
		"postgresql://app:s3cr3t@db/x",
		"postgres://db/x?user=app&password=s3cr3t&sslmode=disable",
		`failed: cannot parse "host=db password=s3cr3t": bad`,
	}
	for _, c := range cases {
		got := Redact(c)
		if strings.Contains(got, "s3cr3t") || strings.Contains(got, "cr3t") {
			t.Errorf("Redact(%q) = %q: password left in", c, got)
		}
		if !strings.Contains(got, "xxxxx") {
			t.Errorf("Redact(%q) = %q: no placeholder", c, got)
		}
	}
	if got := Redact("host=db user=app"); got != "host=db user=app" {
		t.Errorf("Redact changed a DSN without password: %q", got)
	}
}

func TestValidateNeverEchoesPassword(t *testing.T) {
	for _, bad := range []string{
		"postgres://app:s3cr3t@db:notaport/x",
		"host=db password=s3cr3t port=notaport",
		"host=db password=s3cr3t sslmode=sometimes",
	} {
		err := Validate(bad)
		if err == nil {
			t.Fatalf("Validate(%q) accepted a malformed DSN", bad)
		}
		if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("Validate error leaks the password: %v", err)
		}
	}
	if err := Validate(""); err == nil {
		t.Error("Validate accepted an empty DSN")
	}
	if err := Validate("host=db user=app password=x dbname=y"); err != nil {
		t.Errorf("Validate rejected a good DSN: %v", err)
	}
}

func TestRedactErrorUnwraps(t *testing.T) {
	base := errors.New("password=s3cr3t failed")
	err := RedactError(base)
	if !errors.Is(err, base) {
		t.Error("RedactError broke errors.Is")
	}
	if strings.Contains(err.Error(), "s3cr3t") {
		t.Error("RedactError kept the password")
	}
	if RedactError(nil) != nil {
		t.Error("RedactError(nil) is not nil")
	}
}

func TestResolve(t *testing.T) {
	file := t.TempDir() + "/dsn"
	if err := os.WriteFile(file, []byte("host=fromfile password=filepw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, flag, file, env, want, errHas string
	}{
		{name: "flag wins over env", flag: "host=a", env: "host=b", want: "host=a"},
		{name: "file, trimmed", file: file, env: "host=b", want: "host=fromfile password=filepw"},
		{name: "env", env: "host=b", want: "host=b"},
		{name: "both flags", flag: "host=a", file: file, errHas: "--db.dsn and --db.dsn-file"},
		{name: "none", errHas: "DATA_SOURCE_NAME"},
		{name: "missing file", file: file + ".missing", errHas: "--db.dsn-file"},
		{name: "malformed flag", flag: "host=a password=hunter2 port=x", errHas: "--db.dsn: malformed DSN"},
		{name: "malformed env", env: "postgres://u:hunter2@h:x/db", errHas: "DATA_SOURCE_NAME: malformed DSN"},
	} {
		got, err := Resolve(tc.flag, tc.file, tc.env)
		if tc.errHas != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errHas) {
				t.Errorf("%s: err = %v, want it to mention %q", tc.name, err, tc.errHas)
			}
			if err != nil && strings.Contains(err.Error(), "hunter2") {
				t.Errorf("%s: error leaks the password: %v", tc.name, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: Resolve = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}
