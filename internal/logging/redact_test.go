package logging

import (
	"errors"
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
