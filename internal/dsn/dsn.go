// Package dsn reads and checks the PostgreSQL connection strings of the binaries' flags
// (--db.dsn, --db.dsn-file, DATA_SOURCE_NAME, --db.direct-dsn, --db.direct-dsn-file) as
// secrets. Removing passwords from what may be printed is the public logging package's
// (logging.Redact, logging.RedactError), which every logger of the module passes. It must never log or return a password in an
// error.
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
	"net/url"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pg-liveness/pg_liveness_exporter/internal/logging"
	"github.com/pg-liveness/pg_liveness_exporter/internal/regularfile"
)

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
			// The fixed description of the problem, which quotes nothing of s.
			return nil, errors.New(logging.RedactError(pce).Error())
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
	s, source, err := pick("--db.dsn", flagDSN, file)
	switch {
	case err != nil:
		return "", err
	case source == "" && env == "":
		return "", errors.New("no database given: set --db.dsn-file, --db.dsn, DATA_SOURCE_NAME or DATA_SOURCE_URI")
	case source == "":
		s, source = env, "DATA_SOURCE_NAME"
	}
	return s, validateFrom(s, source)
}

// ResolveDirect picks the alive lock's DSN from --db.direct-dsn or --db.direct-dsn-file
// and validates it; "" when neither is set (the caller then uses the main DSN). Setting
// both is an error. Errors name the flag and never contain the password.
func ResolveDirect(flagDSN, file string) (string, error) {
	s, source, err := pick("--db.direct-dsn", flagDSN, file)
	if err != nil || source == "" {
		return "", err
	}
	return s, validateFrom(s, source)
}

// pick returns the DSN of the flag named flag or of its -file twin, and which one it
// came from ("" when neither is set).
func pick(flag, flagDSN, file string) (s, source string, err error) {
	switch {
	case flagDSN != "" && file != "":
		return "", "", fmt.Errorf("%s and %s-file are both set; use one", flag, flag)
	case flagDSN != "":
		return flagDSN, flag, nil
	case file != "":
		if s, err = ReadFile(file); err != nil {
			return "", "", fmt.Errorf("%s-file: %w", flag, err)
		}
		return s, flag + "-file " + file, nil
	}
	return "", "", nil
}

func validateFrom(s, source string) error {
	if err := Validate(s); err != nil {
		return fmt.Errorf("%s: malformed DSN: %w", source, err)
	}
	return nil
}

// MaxFileSize bounds a DSN file: a DSN is a line, and anything much larger is the wrong
// file.
const MaxFileSize = 64 << 10

// ReadFile returns the one DSN in the file at path: a regular file of at most
// MaxFileSize bytes, UTF-8 with or without a byte-order mark, holding one line besides
// blank lines and # comments. A DSN split over two lines is refused rather than read as
// one (pgx would let the second line's keywords override the first's), and so is a file
// other users may read (regularfile.ReadSecret). Errors name the path and never quote
// the contents.
func ReadFile(path string) (string, error) {
	b, err := regularfile.ReadSecret(path, MaxFileSize)
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

// The variables of postgres_exporter that name a database, read as it reads them.
const (
	EnvName     = "DATA_SOURCE_NAME"      // a whole DSN
	EnvURI      = "DATA_SOURCE_URI"       // host[:port]/dbname[?params], no scheme, no user
	EnvURIFile  = "DATA_SOURCE_URI_FILE"  // a file holding EnvURI's value
	EnvUser     = "DATA_SOURCE_USER"      // the user, with EnvURI
	EnvUserFile = "DATA_SOURCE_USER_FILE" // a file holding the user
	EnvPass     = "DATA_SOURCE_PASS"      // the password, with EnvURI
	EnvPassFile = "DATA_SOURCE_PASS_FILE" // a file holding the password (a secret's file)
)

// FromEnvironment returns the DSN that postgres_exporter's variables give, read with
// getenv: DATA_SOURCE_NAME as it is, or postgresql://USER:PASS@URI from
// DATA_SOURCE_URI (or _URI_FILE), DATA_SOURCE_USER (or _USER_FILE) and DATA_SOURCE_PASS
// (or _PASS_FILE), files trimmed of surrounding white space as postgres_exporter trims
// them, the user and password URL-encoded. It is "" when none is set. Where
// postgres_exporter would silently pick one of two settings (a variable and its _FILE,
// DATA_SOURCE_NAME and DATA_SOURCE_URI), or ignore a user or password without a URI, it
// is an error that names the variables. Errors never quote the password.
func FromEnvironment(getenv func(string) string) (string, error) {
	both := func(a, b string) error {
		if getenv(a) != "" && getenv(b) != "" {
			return fmt.Errorf("%s and %s are both set; use one", a, b)
		}
		return nil
	}
	for _, pair := range [][2]string{{EnvName, EnvURI}, {EnvName, EnvURIFile}, {EnvURI, EnvURIFile}, {EnvUser, EnvUserFile}, {EnvPass, EnvPassFile}} {
		if err := both(pair[0], pair[1]); err != nil {
			return "", err
		}
	}
	value := func(name, file string, secret bool) (string, error) {
		path := getenv(file)
		if path == "" {
			return getenv(name), nil
		}
		read := regularfile.Read
		if secret {
			read = regularfile.ReadSecret
		}
		b, err := read(path, MaxFileSize)
		if err != nil {
			return "", fmt.Errorf("%s: %w", file, err)
		}
		v := strings.TrimSpace(strings.TrimPrefix(string(b), "\uFEFF"))
		if v == "" {
			return "", fmt.Errorf("%s: %s is empty", file, path)
		}
		return v, nil
	}
	uri, err := value(EnvURI, EnvURIFile, false)
	if err != nil {
		return "", err
	}
	user, err := value(EnvUser, EnvUserFile, false)
	if err != nil {
		return "", err
	}
	pass, err := value(EnvPass, EnvPassFile, true)
	if err != nil {
		return "", err
	}
	if name := getenv(EnvName); name != "" {
		if user != "" || pass != "" {
			return "", fmt.Errorf("%s and a DATA_SOURCE_USER or DATA_SOURCE_PASS variable are both set: the user and password go with %s", EnvName, EnvURI)
		}
		return name, nil
	}
	if uri == "" {
		if user != "" || pass != "" {
			return "", fmt.Errorf("DATA_SOURCE_USER or DATA_SOURCE_PASS is set without %s (host:port/dbname)", EnvURI)
		}
		return "", nil
	}
	if strings.Contains(uri, "://") || strings.Contains(uri, "@") {
		return "", fmt.Errorf("%s is host:port/dbname?params, as postgres_exporter reads it: no scheme and no user (they go in DATA_SOURCE_USER and DATA_SOURCE_PASS)", EnvURI)
	}
	info := url.User(user)
	if pass != "" {
		info = url.UserPassword(user, pass)
	}
	s := "postgresql://" + info.String() + "@" + uri
	if user == "" && pass == "" {
		s = "postgresql://" + uri
	}
	if err := Validate(s); err != nil {
		return "", fmt.Errorf("%s: malformed DSN: %w", EnvURI, err)
	}
	return s, nil
}
