// Package dsn handles PostgreSQL connection strings as secrets: it validates them and
// removes passwords from anything that may be printed. It must never log or return a
// password in an error.
//
// A DSN that fails to parse is never echoed, not even redacted: where its password ends
// is exactly what a malformed DSN leaves unclear (a quoted password with \' or \ in it, an
// unencoded @ in a URL). Errors about it carry a fixed description of what is wrong. A DSN
// that parses is shown only as Describe rebuilds it from the parsed fields, without the
// password.
package dsn

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pg-liveness/pg_liveness_exporter/internal/regularfile"
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

// Validate parses s as pgx would. The error for a malformed DSN is a fixed description
// of the problem that quotes nothing of s.
func Validate(s string) error {
	_, err := parse(s)
	return err
}

func parse(s string) (*pgx.ConnConfig, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("empty DSN")
	}
	if strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://") {
		// pgx ends the user info at the first @: a password with an unencoded @ would
		// put its tail into the host name, which connection errors print.
		authority := s[strings.Index(s, "://")+3:]
		if i := strings.IndexAny(authority, "/?#"); i >= 0 {
			authority = authority[:i]
		}
		if strings.Count(authority, "@") > 1 {
			return nil, errors.New("cannot parse DSN: the user info of the URL holds an unencoded @; write it as %40")
		}
	}
	cfg, err := pgx.ParseConfig(s)
	if err != nil {
		var pce *pgconn.ParseConfigError
		if errors.As(err, &pce) {
			return nil, errors.New(describeParseError(pce))
		}
		return nil, errors.New("cannot parse DSN")
	}
	for _, h := range append([]*pgconn.FallbackConfig{{Host: cfg.Host}}, cfg.Fallbacks...) {
		if strings.ContainsAny(h.Host, "@'\\ \t\n") {
			return nil, errors.New("cannot parse DSN: a host name holds @, a quote, a backslash or a space; check the quoting of the password")
		}
	}
	return cfg, nil
}

// Describe renders the DSN from its parsed fields, without the password, for log lines:
// host=… port=… user=… dbname=… (with one host:port per line of a multi-host DSN). It
// is "unparsable DSN" for one that does not parse.
func Describe(s string) string {
	cfg, err := parse(s)
	if err != nil {
		return "unparsable DSN"
	}
	hosts := []string{fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)}
	for _, fb := range cfg.Fallbacks {
		if h := fmt.Sprintf("%s:%d", fb.Host, fb.Port); !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	out := "host=" + strings.Join(hosts, ",") + " user=" + cfg.User + " dbname=" + cfg.Database
	if cfg.TLSConfig == nil {
		out += " tls=off"
	} else {
		out += " tls=on"
	}
	return out
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
		var err error
		if s, err = ReadFile(file); err != nil {
			return "", fmt.Errorf("--db.dsn-file: %w", err)
		}
		source = "--db.dsn-file " + file
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

// MaxFileSize bounds a DSN file: a DSN is a line, and anything much larger is the wrong
// file.
const MaxFileSize = 64 << 10

// ReadFile returns the one DSN in the file at path: a regular file of at most
// MaxFileSize bytes, UTF-8 with or without a byte-order mark, holding one line besides
// blank lines and # comments. A DSN split over two lines is refused rather than read as
// one (pgx would let the second line's keywords override the first's). Errors name the
// path and never quote the contents.
func ReadFile(path string) (string, error) {
	b, err := regularfile.Read(path, MaxFileSize)
	if err != nil {
		return "", err
	}
	if len(b) >= 2 && (b[0] == 0xff && b[1] == 0xfe || b[0] == 0xfe && b[1] == 0xff) {
		return "", fmt.Errorf("%s is UTF-16 encoded; save it as UTF-8", path)
	}
	// An editor's byte-order mark would otherwise become part of the first keyword (and
	// "\uFEFFhost=db" sets no host).
	text := strings.TrimPrefix(string(b), "\uFEFF")
	var lines []string
	for line := range strings.Lines(text) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			lines = append(lines, line)
		}
	}
	switch len(lines) {
	case 0:
		return "", fmt.Errorf("%s holds no DSN (only blank lines and comments)", path)
	case 1:
		return lines[0], nil
	}
	return "", fmt.Errorf("%s holds %d lines besides blank lines and comments; write the one DSN on one line", path, len(lines))
}
