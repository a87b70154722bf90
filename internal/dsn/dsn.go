// Package dsn handles PostgreSQL connection strings as secrets: it validates them and
// removes passwords from anything that may be printed. It must never log or return a
// password in an error.
package dsn

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

var (
	kvPassword  = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)
	urlPassword = regexp.MustCompile(`(?i)(postgres(?:ql)?://[^:/@\s]*:)[^@\s]*@`)
	urlQueryPW  = regexp.MustCompile(`(?i)([?&]password=)[^&\s]*`)
)

// Redact replaces every password in s (keyword/value DSNs, URLs and their query
// parameters) with "xxxxx". It works on any text, such as an error that quotes a DSN.
func Redact(s string) string {
	s = kvPassword.ReplaceAllString(s, "${1}xxxxx")
	s = urlPassword.ReplaceAllString(s, "${1}xxxxx@")
	return urlQueryPW.ReplaceAllString(s, "${1}xxxxx")
}

// RedactError returns an error whose text has no password. It is nil for nil.
func RedactError(err error) error {
	if err == nil {
		return nil
	}
	return redacted{msg: Redact(err.Error()), err: err}
}

type redacted struct {
	msg string
	err error
}

func (r redacted) Error() string { return r.msg }

// Unwrap keeps errors.Is and errors.As working; the wrapped text is never printed by it.
func (r redacted) Unwrap() error { return r.err }

// Validate parses s as pgx would and returns an error without the password if it is
// malformed.
func Validate(s string) error {
	if strings.TrimSpace(s) == "" {
		return errors.New("empty DSN")
	}
	if _, err := pgx.ParseConfig(s); err != nil {
		return RedactError(err)
	}
	return nil
}

// Resolve picks the DSN from --db.dsn, --db.dsn-file or the DATA_SOURCE_NAME value, in
// that order, and validates it. Setting both flags is an error. Errors name the source
// and never contain the password.
func Resolve(flagDSN, file, env string) (string, error) {
	var s, source string
	switch {
	case flagDSN != "" && file != "":
		return "", errors.New("--db.dsn and --db.dsn-file are both set; use one")
	case flagDSN != "":
		s, source = flagDSN, "--db.dsn"
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--db.dsn-file: %w", err)
		}
		s, source = strings.TrimSpace(string(b)), "--db.dsn-file "+file
	case env != "":
		s, source = env, "DATA_SOURCE_NAME"
	default:
		return "", errors.New("no database given: set DATA_SOURCE_NAME, --db.dsn or --db.dsn-file")
	}
	if err := Validate(s); err != nil {
		return "", fmt.Errorf("%s: malformed DSN: %w", source, err)
	}
	return s, nil
}
