package dsn

import (
	"os"
	"strings"
	"testing"
)

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
		checkResolved(t, "Resolve: "+tc.name, got, err, tc.want, tc.errHas)
	}
}

// checkResolved fails the test unless err mentions errHas (and never the password
// hunter2), or, when errHas is "", got is want.
func checkResolved(t *testing.T, what, got string, err error, want, errHas string) {
	t.Helper()
	if err != nil && strings.Contains(err.Error(), "hunter2") {
		t.Errorf("%s: error leaks the password: %v", what, err)
	}
	if errHas != "" {
		if err == nil || !strings.Contains(err.Error(), errHas) {
			t.Errorf("%s: err = %v, want it to mention %q", what, err, errHas)
		}
		return
	}
	if err != nil || got != want {
		t.Errorf("%s = %q, %v; want %q", what, got, err, want)
	}
}

// The alive lock's DSN: either flag, neither (the main DSN is used), never both.
func TestResolveDirect(t *testing.T) {
	file := t.TempDir() + "/direct"
	if err := os.WriteFile(file, []byte("host=direct password=filepw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, flag, file, want, errHas string
	}{
		{name: "neither", want: ""},
		{name: "flag", flag: "host=a", want: "host=a"},
		{name: "file", file: file, want: "host=direct password=filepw"},
		{name: "both", flag: "host=a", file: file, errHas: "--db.direct-dsn and --db.direct-dsn-file are both set"},
		{name: "missing file", file: file + ".missing", errHas: "--db.direct-dsn-file: "},
		{name: "malformed flag", flag: "host=a password=hunter2 port=x", errHas: "--db.direct-dsn: malformed DSN"},
	} {
		got, err := ResolveDirect(tc.flag, tc.file)
		checkResolved(t, "ResolveDirect: "+tc.name, got, err, tc.want, tc.errHas)
	}
}

// A DSN file holds one DSN: a byte-order mark is dropped (it would turn "host" into
// another keyword), comments and blank lines are skipped, and a second line is refused
// rather than merged into the first. Nothing of the contents is quoted in an error.
func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	write := func(content string) string {
		t.Helper()
		f, err := os.CreateTemp(dir, "dsn")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(content); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		return f.Name()
	}
	for _, c := range []struct{ content, want string }{
		{"host=db password=hunter2\n", "host=db password=hunter2"},
		{"\uFEFFhost=db password=hunter2\r\n", "host=db password=hunter2"},
		{"# rotated by vault\n\n  host=db password=hunter2  \n# end\n", "host=db password=hunter2"},
		{"postgres://u:hunter2@db/x", "postgres://u:hunter2@db/x"},
	} {
		got, err := ReadFile(write(c.content))
		if err != nil || got != c.want {
			t.Errorf("ReadFile(%q) = %q, %v; want %q", c.content, got, err, c.want)
		}
	}
	for _, c := range []struct{ content, want string }{
		{"host=a password=hunter2\nhost=b password=hunter2\n", "holds 2 lines"},
		{"host=a\n# comment\npassword=hunter2\n", "holds 2 lines"},
		{"", "holds no DSN"},
		{"\uFEFF# only a comment\n", "holds no DSN"},
		{"\xff\xfeh\x00o\x00s\x00t\x00", "UTF-16"},
		{strings.Repeat("x", MaxFileSize+1), "larger than 64 KiB"},
	} {
		p := write(c.content)
		_, err := ReadFile(p)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p) {
			t.Errorf("ReadFile(%.40q): %v; want an error naming the file and %q", c.content, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("the error quotes the password: %v", err)
		}
	}
	// Not a regular file: refused at once (regularfile tests the kinds one by one).
	for _, p := range []string{"/dev/zero", dir} {
		if _, err := ReadFile(p); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("ReadFile(%s): %v", p, err)
		}
	}
}
