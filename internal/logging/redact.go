package logging

import (
	"errors"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
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

// RedactError returns an error whose text has no password. It is nil for nil. A parse
// error of pgx anywhere in err's chain is replaced by a fixed description, so the DSN it
// quotes is not printed.
func RedactError(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	var pce *pgconn.ParseConfigError
	if errors.As(err, &pce) {
		full := pce.Error()
		if i := strings.Index(msg, full); i >= 0 {
			msg = msg[:i] + describeParseError(pce) + msg[i+len(full):]
		} else {
			msg = describeParseError(pce)
		}
	}
	return redacted{msg: Redact(msg), err: err}
}

// parseProblems are the fixed messages of pgx's ParseConfigError, in the order they are
// looked for, with what this package says instead. None of the replacements quotes the
// input: a mistake in quoting can put password bytes into any other field.
var parseProblems = []struct{ pgx, say string }{
	{"failed to parse as URL", "not a valid URL; percent-encode reserved characters such as @ : / ? # % in the user name and password"},
	{"failed to parse as keyword/value", `not valid keyword/value syntax; put a value with spaces or quotes in single quotes and escape ' and \ in it with a backslash`},
	{"invalid port", "invalid port"},
	{"could not match", "the number of ports does not match the number of hosts"},
	{"invalid connect_timeout", "invalid connect_timeout"},
	{"invalid sslcertmode", "invalid sslcertmode"},
	{"failed to configure TLS", "invalid TLS settings (sslmode, sslrootcert, sslcert, sslkey, sslpassword)"},
	{"unknown target_session_attrs", "unknown target_session_attrs value"},
	{"min_protocol_version cannot be greater", "min_protocol_version is above max_protocol_version"},
	{"invalid min_protocol_version", "invalid min_protocol_version"},
	{"invalid max_protocol_version", "invalid max_protocol_version"},
	{"unknown channel_binding", "unknown channel_binding value"},
	{"invalid require_auth", "invalid require_auth"},
	{"failed to read service", "cannot read the service file"},
	{"statement_cache_capacity", "invalid statement_cache_capacity"},
	{"description_cache_capacity", "invalid description_cache_capacity"},
	{"default_query_exec_mode", "invalid default_query_exec_mode"},
	{"ConnStringAllowedKeys", "a key that is not allowed"},
}

// describeParseError says what is wrong with a DSN without quoting any of it.
func describeParseError(pce *pgconn.ParseConfigError) string {
	text := pce.Error()
	// pgx writes "cannot parse `<DSN, best-effort redacted>`: <problem>"; the problem
	// follows the last "`: ", but the DSN may contain that too, so only fixed texts are
	// matched, after it.
	if i := strings.LastIndex(text, "`: "); i >= 0 {
		text = text[i:]
	}
	for _, p := range parseProblems {
		if strings.Contains(text, p.pgx) {
			return "cannot parse DSN: " + p.say
		}
	}
	return "cannot parse DSN"
}

type redacted struct {
	msg string
	err error
}

func (r redacted) Error() string { return r.msg }

// Unwrap keeps errors.Is and errors.As working; the wrapped text is never printed by it.
func (r redacted) Unwrap() error { return r.err }
