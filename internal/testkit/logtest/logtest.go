// Package logtest checks, in tests, that a logger removes passwords.
package logtest

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Password is the password LogPasswords logs; no piece of it may appear in the output.
const Password = "Tr0ub4dor-3"

// Lines is how many lines LogPasswords logs, one per way a password reaches a log line.
const Lines = 8

// LogPasswords logs through l, at error level, one line for each way a password reaches
// a log line: the message, a string, an error, a pgx error quoting a DSN that does not
// parse, a struct, bytes, a group, and attributes added with With.
func LogPasswords(l *slog.Logger) {
	kv := "host=db user=app password=" + Password + " dbname=app"
	url := "postgres://app:" + Password + "@db/app"
	_, parseErr := pgx.ParseConfig("host=db password='" + Password + " port=x")
	l.Error("connecting to " + kv)
	l.Error("string", "dsn", url)
	l.Error("error", "err", fmt.Errorf("connect %s: refused", kv))
	l.Error("parse error", "err", parseErr)
	l.Error("struct", "cfg", struct{ DSN string }{kv})
	l.Error("bytes", "raw", []byte(url+"?sslmode=disable&password="+Password))
	l.Error("group", slog.Group("db", "dsn", kv))
	l.With("dsn", kv).WithGroup("g").Error("with", "query", url)
}

// Leak returns what of Password out shows (the whole password, or its first half), or ""
// when it shows none. It also returns a problem when out does not hold Lines lines, so
// that a logger that logs nothing does not pass.
func Leak(out string) (leak, problem string) {
	if n := strings.Count(out, "\n"); n != Lines {
		problem = fmt.Sprintf("%d lines, want %d", n, Lines)
	}
	for _, s := range []string{Password, Password[:len(Password)/2]} {
		if strings.Contains(out, s) {
			return s, problem
		}
	}
	return "", problem
}
