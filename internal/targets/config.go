package targets

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/pg-liveness/pg_liveness_exporter/internal/dsn"
	"github.com/pg-liveness/pg_liveness_exporter/internal/regularfile"
)

// MaxFileSize bounds the configuration file and each password file.
const MaxFileSize = 1 << 20

// Config is a loaded configuration file: every target with its DSN, ready for a pool.
type Config struct {
	targets  map[string]Target
	discover map[string]Server
	files    []string // the password and DSN files read, for Files
}

// Files returns the password and DSN files the configuration was read from, sorted: a
// change of one is a change of the configuration.
func (c *Config) Files() []string {
	out := slices.Clone(c.files)
	slices.Sort(out)
	return slices.Compact(out)
}

// Server is a discover entry: a server whose databases holding the source's instances
// table are found at start and re-checked every Interval.
type Server struct {
	Name string
	// Maintenance is the database pg_database is read from.
	Maintenance string
	Interval    time.Duration
	// MaxDatabases bounds the databases watched (the first by name): the database label's
	// values, and so every discovered series, stay bounded however many a server holds.
	MaxDatabases int
	// Describe is the server's DSN (its maintenance database's) without its password.
	Describe string
	base     string // secret: the DSN without dbname, which dsn appends
}

// dsn is the DSN of the server's database db.
func (s Server) dsn(db string) string { return s.base + " dbname=" + quote(db) }

// Discover returns the discover entries, sorted by name.
func (c *Config) Discover() []Server {
	out := make([]Server, 0, len(c.discover))
	for _, s := range c.discover {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Server) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// DefaultDiscoverInterval is a discover entry's interval when it gives none;
// MinDiscoverInterval the least it may give.
const (
	DefaultDiscoverInterval = time.Minute
	MinDiscoverInterval     = time.Second
)

// DefaultMaxDatabases is a discover entry's max_databases when it gives none.
const DefaultMaxDatabases = 100

// Target is one database that /probe answers for.
type Target struct {
	Name string
	// Describe is the target's DSN rebuilt without its password, for log lines.
	Describe string
	dsn      string // secret: it may hold the password
	dsnFile  string // where dsn was read from, if from a file of its own
}

// Names returns the targets' names, sorted.
func (c *Config) Names() []string {
	names := make([]string, 0, len(c.targets))
	for n := range c.targets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Target returns the named target.
func (c *Config) Target(name string) (Target, bool) {
	t, ok := c.targets[name]
	return t, ok
}

// validName is what a target or credentials name may be: it is a URL parameter and,
// relabelled, the database label's value. Its length is checked apart: a bounded
// repetition ({0,62}) compiles into 62 copies of the class, 28 KB kept for the
// process's life.
var validNameChars = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

func validName(s string) bool { return len(s) <= 63 && validNameChars.MatchString(s) }

// fieldError is an error about one field of the file, named by its path.
type fieldError struct {
	path string
	line int
	msg  string
}

func (e *fieldError) Error() string {
	if e.line > 0 {
		return fmt.Sprintf("line %d: %s: %s", e.line, e.path, e.msg)
	}
	return e.path + ": " + e.msg
}

func errAt(n *yaml.Node, path, format string, args ...any) error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &fieldError{path: path, line: line, msg: fmt.Sprintf(format, args...)}
}

// credentials as written in the file.
type credentials struct {
	user, passwordFile, dsnFile, sslmode string
}

// Load reads and checks the configuration file at path: its targets' DSNs are built, and
// the password and DSN files they name are read, now. Errors start with the field path
// and never quote a secret.
func Load(path string) (*Config, error) {
	b, err := regularfile.Read(path, MaxFileSize)
	if err != nil {
		return nil, err
	}
	return parse(b)
}

func parse(b []byte) (*Config, error) {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the file is empty: it needs a targets section")
		}
		return nil, fmt.Errorf("not valid YAML: %w", err)
	}
	if len(doc.Content) != 1 {
		return nil, errors.New("the file is empty: it needs a targets section")
	}
	// A second document (after a --- line) would otherwise be dropped without a word, and
	// with it whatever targets and credentials it holds.
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, fmt.Errorf("a --- line starts a second YAML document, not valid YAML (%w); write the configuration as one document", err)
	default:
		return nil, fmt.Errorf("line %d: a --- line starts a second YAML document; write the configuration as one document", next.Line)
	}
	root := doc.Content[0]
	sections, err := mapping(root, "", []string{"credentials", "targets", "discover"})
	if err != nil {
		return nil, err
	}
	creds := map[string]credentials{}
	var files []string
	if n := sections["credentials"]; n != nil {
		entries, err := named(n, "credentials")
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			c, err := readCredentials(e.node, "credentials."+e.name)
			if err != nil {
				return nil, err
			}
			creds[e.name] = c
			for _, f := range []string{c.passwordFile, c.dsnFile} {
				if f != "" {
					files = append(files, f)
				}
			}
		}
	}
	cfg := &Config{targets: map[string]Target{}, discover: map[string]Server{}, files: files}
	tn, dn := sections["targets"], sections["discover"]
	if tn == nil && dn == nil {
		return nil, errors.New("targets: missing; name at least one target (or a server under discover)")
	}
	if tn != nil {
		entries, err := named(tn, "targets")
		if err != nil {
			return nil, err
		}
		if len(entries) == 0 && dn == nil {
			return nil, errAt(tn, "targets", "is empty; name at least one target")
		}
		for _, e := range entries {
			t, err := readTarget(e.node, "targets."+e.name, creds)
			if err != nil {
				return nil, err
			}
			t.Name = e.name
			cfg.targets[e.name] = t
			if t.dsnFile != "" {
				cfg.files = append(cfg.files, t.dsnFile)
			}
		}
	}
	if dn != nil {
		entries, err := named(dn, "discover")
		if err != nil {
			return nil, err
		}
		if len(entries) == 0 {
			return nil, errAt(dn, "discover", "is empty; name at least one server")
		}
		for _, e := range entries {
			srv, err := readServer(e.node, "discover."+e.name, creds)
			if err != nil {
				return nil, err
			}
			srv.Name = e.name
			cfg.discover[e.name] = srv
		}
	}
	return cfg, nil
}

// mapping checks that n is a mapping whose keys are among allowed, each once, and
// returns their values.
func mapping(n *yaml.Node, path string, allowed []string) (map[string]*yaml.Node, error) {
	if n.Kind != yaml.MappingNode {
		return nil, errAt(n, orRoot(path), "must be a mapping")
	}
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		p := join(path, k.Value)
		if !slices.Contains(allowed, k.Value) {
			return nil, errAt(k, p, "unknown field (known: %s)", strings.Join(allowed, ", "))
		}
		if _, dup := out[k.Value]; dup {
			return nil, errAt(k, p, "given twice")
		}
		out[k.Value] = v
	}
	return out, nil
}

type entry struct {
	name string
	node *yaml.Node
}

// named reads a mapping from names to entries: each name valid and given once.
func named(n *yaml.Node, path string) ([]entry, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, errAt(n, path, "must be a mapping of names to entries")
	}
	var out []entry
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !validName(k.Value) {
			return nil, errAt(k, path, "%q is not a valid name: 1 to 63 letters, digits, '_', '.' or '-', starting with a letter or digit", k.Value)
		}
		if seen[k.Value] {
			return nil, errAt(k, join(path, k.Value), "the name is given twice")
		}
		seen[k.Value] = true
		out = append(out, entry{k.Value, v})
	}
	return out, nil
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func orRoot(path string) string { return cmp.Or(path, "the file") }

// scalar is a field's string value.
func scalar(fields map[string]*yaml.Node, path, key string) (string, error) {
	n := fields[key]
	if n == nil {
		return "", nil
	}
	if n.Kind != yaml.ScalarNode {
		return "", errAt(n, join(path, key), "must be a string")
	}
	v := strings.TrimSpace(n.Value)
	if v == "" {
		return "", errAt(n, join(path, key), "is empty")
	}
	return v, nil
}

var sslModes = []string{"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}

func readSSLMode(fields map[string]*yaml.Node, path string) (string, error) {
	m, err := scalar(fields, path, "sslmode")
	if err != nil || m == "" {
		return m, err
	}
	if !slices.Contains(sslModes, m) {
		return "", errAt(fields["sslmode"], join(path, "sslmode"), "%q is not one of %s", m, strings.Join(sslModes, ", "))
	}
	return m, nil
}

func readCredentials(n *yaml.Node, path string) (credentials, error) {
	f, err := mapping(n, path, []string{"user", "password_file", "dsn_file", "sslmode"})
	if err != nil {
		return credentials{}, err
	}
	var c credentials
	if c.user, err = scalar(f, path, "user"); err != nil {
		return c, err
	}
	if c.passwordFile, err = scalar(f, path, "password_file"); err != nil {
		return c, err
	}
	if c.dsnFile, err = scalar(f, path, "dsn_file"); err != nil {
		return c, err
	}
	if c.sslmode, err = readSSLMode(f, path); err != nil {
		return c, err
	}
	switch {
	case c.dsnFile != "" && (c.user != "" || c.passwordFile != ""):
		return c, errAt(n, path, "give either dsn_file or user (with password_file), not both")
	case c.dsnFile == "" && c.user == "":
		return c, errAt(n, path, "needs user (with password_file) or dsn_file")
	}
	return c, nil
}

func readTarget(n *yaml.Node, path string, creds map[string]credentials) (Target, error) {
	f, err := mapping(n, path, []string{"dsn_file", "host", "port", "database", "credentials", "sslmode"})
	if err != nil {
		return Target{}, err
	}
	dsnFile, err := scalar(f, path, "dsn_file")
	if err != nil {
		return Target{}, err
	}
	if dsnFile != "" {
		for _, k := range []string{"host", "port", "database", "credentials", "sslmode"} {
			if f[k] != nil {
				return Target{}, errAt(f[k], join(path, k), "a target with dsn_file takes its connection from that file alone")
			}
		}
		s, err := dsn.ReadFile(dsnFile)
		if err == nil {
			err = dsn.Validate(s)
		}
		if err != nil {
			return Target{}, errAt(f["dsn_file"], join(path, "dsn_file"), "%v", err)
		}
		return Target{dsn: s, Describe: dsn.Describe(s), dsnFile: dsnFile}, nil
	}
	if f["host"] == nil {
		return Target{}, errAt(n, path, "needs dsn_file, or host, database and credentials")
	}
	db, err := scalar(f, path, "database")
	if err != nil {
		return Target{}, err
	}
	if db == "" {
		return Target{}, errAt(n, join(path, "database"), "missing")
	}
	base, err := hostDSN(n, f, path, creds)
	if err != nil {
		return Target{}, err
	}
	s := base + " dbname=" + quote(db)
	if err := dsn.Validate(s); err != nil {
		return Target{}, errAt(n, path, "%v", err)
	}
	return Target{dsn: s, Describe: dsn.Describe(s)}, nil
}

// hostDSN builds the DSN, without dbname, of an entry's host, port, credentials and
// sslmode fields (f, at path), reading the credentials' files.
func hostDSN(n *yaml.Node, f map[string]*yaml.Node, path string, creds map[string]credentials) (string, error) {
	var kv []string
	host, err := scalar(f, path, "host")
	if err != nil {
		return "", err
	}
	kv = append(kv, "host="+quote(host))
	if p := f["port"]; p != nil {
		port, err := strconv.Atoi(p.Value)
		if err != nil || port < 1 || port > 65535 {
			return "", errAt(p, join(path, "port"), "%q is not a port (1 to 65535)", p.Value)
		}
		kv = append(kv, "port="+strconv.Itoa(port))
	}
	cname, err := scalar(f, path, "credentials")
	if err != nil {
		return "", err
	}
	if cname == "" {
		return "", errAt(n, join(path, "credentials"), "missing: name an entry of credentials")
	}
	c, ok := creds[cname]
	if !ok {
		return "", errAt(f["credentials"], join(path, "credentials"), "no credentials named %q", cname)
	}
	cpath := "credentials." + cname
	var base string
	if c.dsnFile != "" {
		s, err := dsn.ReadFile(c.dsnFile)
		if err == nil {
			err = dsn.Validate(s)
		}
		if err == nil && (strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")) {
			err = errors.New("holds a URL, which cannot take a target's host and database: write it as keyword=value pairs")
		}
		if err != nil {
			return "", &fieldError{path: cpath + ".dsn_file", msg: err.Error()}
		}
		base = s + " " // the entry's host, port and dbname come later and win
	} else {
		kv = append(kv, "user="+quote(c.user))
		if c.passwordFile != "" {
			pw, err := readPassword(c.passwordFile)
			if err != nil {
				return "", &fieldError{path: cpath + ".password_file", msg: err.Error()}
			}
			kv = append(kv, "password="+quote(pw))
		}
	}
	if m, err := readSSLMode(f, path); err != nil {
		return "", err
	} else if m = cmp.Or(m, c.sslmode); m != "" {
		kv = append(kv, "sslmode="+m)
	}
	return base + strings.Join(kv, " "), nil
}

// readServer reads a discover entry: host, port, credentials and sslmode as a target
// has them, the maintenance database (postgres unless given) and the re-check interval.
func readServer(n *yaml.Node, path string, creds map[string]credentials) (Server, error) {
	f, err := mapping(n, path, []string{"host", "port", "credentials", "sslmode", "maintenance_database", "interval", "max_databases"})
	if err != nil {
		return Server{}, err
	}
	srv := Server{Maintenance: "postgres", Interval: DefaultDiscoverInterval, MaxDatabases: DefaultMaxDatabases}
	if m := f["max_databases"]; m != nil {
		n, err := strconv.Atoi(m.Value)
		if err != nil || n < 1 {
			return Server{}, errAt(m, join(path, "max_databases"), "%q is not a number of databases (1 or more)", m.Value)
		}
		srv.MaxDatabases = n
	}
	if m, err := scalar(f, path, "maintenance_database"); err != nil {
		return Server{}, err
	} else if m != "" {
		srv.Maintenance = m
	}
	if iv, err := scalar(f, path, "interval"); err != nil {
		return Server{}, err
	} else if iv != "" {
		d, err := time.ParseDuration(iv)
		if err != nil || d < MinDiscoverInterval {
			return Server{}, errAt(f["interval"], join(path, "interval"), "%q is not a duration of at least %s (such as 1m)", iv, MinDiscoverInterval)
		}
		srv.Interval = d
	}
	// The connection is a target's without its database: build one for the maintenance
	// database to check it all, and keep the rest as the base of every database's DSN.
	tf := map[string]*yaml.Node{}
	for _, k := range []string{"host", "port", "credentials", "sslmode"} {
		if f[k] != nil {
			tf[k] = f[k]
		}
	}
	if tf["host"] == nil {
		return Server{}, errAt(n, join(path, "host"), "missing")
	}
	base, err := hostDSN(n, tf, path, creds)
	if err != nil {
		return Server{}, err
	}
	srv.base = base
	s := srv.dsn(srv.Maintenance)
	if err := dsn.Validate(s); err != nil {
		return Server{}, errAt(n, path, "%v", err)
	}
	srv.Describe = dsn.Describe(s)
	return srv, nil
}

// quote writes a keyword/value DSN value in single quotes.
func quote(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// readPassword reads a password file: its first line, without the line end. A file
// whose further lines are not blank is refused, since one of them may be the password.
func readPassword(path string) (string, error) {
	b, err := regularfile.ReadSecret(path, 64<<10)
	if err != nil {
		return "", err
	}
	text := strings.TrimPrefix(string(b), "\uFEFF")
	first, rest, _ := strings.Cut(text, "\n")
	first = strings.TrimSuffix(first, "\r")
	if strings.TrimSpace(rest) != "" {
		return "", fmt.Errorf("%s holds more than one line; write the password alone on its first line", path)
	}
	if first == "" {
		return "", fmt.Errorf("%s holds no password", path)
	}
	return first, nil
}
