// Package webconfig hands exporter-toolkit the web configuration (--web.config.file: TLS
// and basic auth) as the last valid version of the operator's file, never as the file
// itself.
//
// The toolkit reads its configuration file again for every request and every TLS
// handshake, and the certificate files it names for every handshake. Served directly,
// an emptied file (or one reduced to a comment or to {}) switched authentication off
// while running, and a typo or a deleted file turned every request into a 500. Here the
// toolkit reads an in-memory copy instead (a sealed memfd, opened by the toolkit as
// /proc/self/fd/N: nothing is written to disk, so a read-only root filesystem is fine),
// with the certificate, key and client CA files inlined. A change of the file, or of a
// file it names, is checked with the checks made at start-up and swapped in atomically
// (dup3 onto the same descriptor) only when it passes; otherwise the previous
// configuration stays in force and Reload says why.
//
// A change that would weaken security is refused even when valid: removing TLS, basic
// auth, the requirement of verified client certificates or the allowed client SANs takes
// a restart, which is a deliberate act. So does turning TLS on, which the toolkit decides
// when it starts listening.
//
// TLS and basic auth stay exporter-toolkit's: this package only decides which
// configuration the toolkit reads. It never logs, and its errors never quote a password
// hash, a key or a certificate.
package webconfig

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	config_util "github.com/prometheus/common/config"
	"github.com/prometheus/exporter-toolkit/web"
	yamlv2 "go.yaml.in/yaml/v2"
	yamlv3 "go.yaml.in/yaml/v3"

	"github.com/pg-liveness/pg_liveness_exporter/internal/regularfile"
)

// MaxFileSize bounds the web configuration and each file it names.
const MaxFileSize = 1 << 20

// errEmpty: the file configures nothing, so the toolkit would serve without TLS and
// authentication.
var errEmpty = errors.New("it would serve without TLS and authentication; leave the flag out to mean that")

// Served is the web configuration in force. Path is what the toolkit reads.
type Served struct {
	file string // the operator's file
	path string // the in-memory copy's, for the toolkit

	mu       sync.Mutex
	mem      *memFile    // the configuration in force, as the toolkit reads it
	inForce  *web.Config // parsed from the operator's text
	current  [32]byte    // digest of the inputs of the configuration in force
	lastSeen [32]byte    // digest of the inputs last looked at, in force or refused
}

// Load reads and checks the file at start-up. An error names the file and says what is
// wrong in one line.
func Load(file string) (*Served, error) {
	c, err := read(file)
	if err != nil {
		return nil, err
	}
	mem, err := c.serve()
	if err != nil {
		return nil, err
	}
	return &Served{file: file, path: mem.path(), mem: mem, inForce: c.cfg, current: c.digest, lastSeen: c.digest}, nil
}

// Path is the file the toolkit is to read (web.FlagConfig.WebConfigFile). It names the
// configuration in force for as long as s is open.
func (s *Served) Path() string { return s.path }

// File is the operator's file.
func (s *Served) File() string { return s.file }

// Close releases the in-memory file; the toolkit must no longer read it.
func (s *Served) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mem.close()
}

// Result is what a Reload did.
type Result struct {
	// Attempted is false when nothing changed since the last look (a poll) and the
	// reload was not forced: there is nothing to report.
	Attempted bool
	// Changed: a new configuration is in force.
	Changed bool
	// Err says why the file was refused; the previous configuration stays in force.
	Err error
	// RestartOnly lists the settings that changed but that the toolkit reads only when
	// it starts listening (rate_limit, http_server_config.http2).
	RestartOnly []string
}

// Reload reads the file again. Unless force is set, a file and certificates just as they
// were at the last look are not checked again (polling costs one read, and a refused
// change is reported once). A change is checked as at start-up, then against the
// configuration in force (see the package doc), and swapped in only when it passes.
func (s *Served) Reload(force bool) Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := read(s.file)
	if !force && c.digest == s.lastSeen {
		return Result{}
	}
	s.lastSeen = c.digest
	if err == nil && c.digest == s.current {
		return Result{Attempted: true} // as in force
	}
	if err == nil {
		if err = compare(s.inForce, c.cfg); err != nil {
			err = fmt.Errorf("%s: %w", s.file, err)
		}
	}
	var mem *memFile
	if err == nil {
		mem, err = c.serve()
	}
	if err == nil {
		err = s.mem.replaceWith(mem)
	}
	if err != nil {
		return Result{Attempted: true, Err: err}
	}
	r := Result{Attempted: true, Changed: true, RestartOnly: restartOnly(s.inForce, c.cfg)}
	s.inForce, s.current = c.cfg, c.digest
	return r
}

// candidate is the file as read: its configuration and what the toolkit is to be given.
type candidate struct {
	file     string
	cfg      *web.Config
	rendered []byte   // the text the toolkit reads: the file's, with the TLS files inlined
	digest   [32]byte // of every input, errors included: a change of any is a change
}

// tlsFiles are the file settings of tls_server_config and the inline settings that take
// their contents; the file wins when both are set, as in the toolkit.
var tlsFiles = []struct{ file, inline string }{
	{"cert_file", "cert"}, {"key_file", "key"}, {"client_ca_file", "client_ca"},
}

// read reads and checks the file and the files it names. The digest is set even on
// error.
func read(file string) (c candidate, err error) {
	c.file = file
	h := sha256.New()
	defer func() { h.Sum(c.digest[:0]) }()
	text, err := regularfile.Read(file, MaxFileSize)
	if err != nil {
		fmt.Fprintf(h, "error %v\n", err)
		return c, err
	}
	h.Write(text)
	if blank(text) {
		return c, fmt.Errorf("%s is empty: %w", file, errEmpty)
	}
	cfg := &web.Config{} // the toolkit's own parse: the same type, library and strictness
	if err := yamlv2.UnmarshalStrict(text, cfg); err != nil {
		return c, fmt.Errorf("%s: %s", file, oneLine(err.Error()))
	}
	if setsNothing(cfg) {
		return c, fmt.Errorf("%s configures neither TLS nor basic auth (nor anything else): %w", file, errEmpty)
	}
	contents := map[string][]byte{}
	dir := filepath.Dir(file)
	for _, f := range tlsFiles {
		p := tlsFile(&cfg.TLSConfig, f.file)
		if *p == "" {
			continue
		}
		path := config_util.JoinDir(dir, *p) // relative to the configuration, as the toolkit reads it
		b, err := regularfile.Read(path, MaxFileSize)
		fmt.Fprintf(h, "\x00%s %s %v\x00", f.file, path, err)
		h.Write(b)
		if err != nil {
			return c, fmt.Errorf("%s: tls_server_config.%s: %w", file, f.file, err)
		}
		if !utf8.Valid(b) {
			return c, fmt.Errorf("%s: tls_server_config.%s %s is not PEM text", file, f.file, path)
		}
		contents[f.file] = b
	}
	rendered, err := inline(text, contents)
	if err != nil {
		return c, fmt.Errorf("%s: %w", file, err)
	}
	c.cfg, c.rendered = cfg, rendered
	return c, nil
}

// serve puts the candidate in an in-memory file and has the toolkit check it there,
// exactly as it will read it.
func (c candidate) serve() (*memFile, error) {
	mem, err := newMemFile(c.rendered)
	if err != nil {
		return nil, fmt.Errorf("%s: cannot keep it in memory: %w", c.file, err)
	}
	if err := web.Validate(mem.path()); err != nil {
		_ = mem.close()
		msg := strings.ReplaceAll(oneLine(err.Error()), mem.path(), c.file)
		return nil, fmt.Errorf("%s: %s", c.file, msg)
	}
	return mem, nil
}

func tlsFile(t *web.TLSConfig, key string) *string {
	switch key {
	case "cert_file":
		return &t.TLSCertPath
	case "key_file":
		return &t.TLSKeyPath
	}
	return &t.ClientCAs
}

// blank reports whether the text holds nothing but blank lines, comments and document
// markers.
func blank(text []byte) bool {
	for line := range strings.Lines(string(text)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") && line != "---" && line != "..." {
			return false
		}
	}
	return true
}

// setsNothing reports whether cfg has the toolkit serve as it does without a file ({},
// null, tls_server_config without a certificate, an empty basic_auth_users): without
// TLS and authentication, with nothing to show that it was meant. A file that sets only
// headers or a rate limit is taken as meant.
func setsNothing(cfg *web.Config) bool {
	return !cfg.TLSConfig.IsEnabled() && len(cfg.Users) == 0 && len(cfg.HTTPConfig.Header) == 0 &&
		cfg.RateLimiterConfig == web.RateLimiterConfig{}
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// inline returns text with tls_server_config's file settings replaced by inline ones
// holding the files' contents. Everything else is left as written (yaml.v3 keeps the
// nodes' styles and tags), and the result is checked to parse to what was meant.
func inline(text []byte, contents map[string][]byte) ([]byte, error) {
	if len(contents) == 0 {
		return text, nil
	}
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(text, &doc); err != nil {
		return nil, fmt.Errorf("cannot inline the TLS files: %s", oneLine(err.Error()))
	}
	tls := mapValue(&doc, "tls_server_config")
	if tls == nil {
		return nil, errors.New("cannot inline the TLS files: no tls_server_config mapping")
	}
	for _, f := range tlsFiles {
		b, ok := contents[f.file]
		if !ok {
			continue
		}
		removeKey(tls, f.inline)
		for i := 0; i+1 < len(tls.Content); i += 2 {
			if tls.Content[i].Value == f.file {
				tls.Content[i].SetString(f.inline)
				tls.Content[i+1].SetString(string(b))
			}
		}
	}
	var out bytes.Buffer
	enc := yamlv3.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("cannot inline the TLS files: %s", oneLine(err.Error()))
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	// What the toolkit will parse must be what the operator wrote, with the files inline.
	var got, want web.Config
	if err := yamlv2.UnmarshalStrict(out.Bytes(), &got); err != nil {
		return nil, fmt.Errorf("cannot inline the TLS files: %s", oneLine(err.Error()))
	}
	if err := yamlv2.UnmarshalStrict(text, &want); err != nil {
		return nil, err
	}
	for _, f := range tlsFiles {
		if b, ok := contents[f.file]; ok {
			*tlsFile(&want.TLSConfig, f.file) = ""
			*inlineField(&want.TLSConfig, f.inline) = string(b)
		}
	}
	if !reflect.DeepEqual(got, want) {
		return nil, errors.New("cannot inline the TLS files: the rewritten configuration reads differently")
	}
	return out.Bytes(), nil
}

func inlineField(t *web.TLSConfig, key string) *string {
	switch key {
	case "cert":
		return &t.TLSCert
	case "key":
		return (*string)(&t.TLSKey)
	}
	return &t.ClientCAsText
}

// mapValue returns the mapping under key at the document's top level, or nil.
func mapValue(doc *yamlv3.Node, key string) *yamlv3.Node {
	if doc.Kind != yamlv3.DocumentNode || len(doc.Content) == 0 {
		return nil
	}
	top := doc.Content[0]
	if top.Kind != yamlv3.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value == key && top.Content[i+1].Kind == yamlv3.MappingNode {
			return top.Content[i+1]
		}
	}
	return nil
}

func removeKey(m *yamlv3.Node, key string) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content = slices.Delete(m.Content, i, i+2)
			return
		}
	}
}

// compare refuses a change from old to new that weakens security, or that the toolkit
// would not apply while running. Each reason says that a restart takes it.
func compare(old, new *web.Config) error {
	ot, nt := &old.TLSConfig, &new.TLSConfig
	switch {
	case ot.IsEnabled() && !nt.IsEnabled():
		return errors.New("it removes TLS (tls_server_config); serving without TLS takes a restart")
	case !ot.IsEnabled() && nt.IsEnabled():
		return errors.New("it turns TLS on (tls_server_config); the listener was started without TLS, so that takes a restart")
	case len(old.Users) > 0 && len(new.Users) == 0:
		return errors.New("it removes basic authentication (basic_auth_users); serving without it takes a restart")
	case ot.ClientAuth == "RequireAndVerifyClientCert" && nt.ClientAuth != "RequireAndVerifyClientCert":
		return fmt.Errorf("it no longer requires verified client certificates (client_auth_type %q); that takes a restart", nt.ClientAuth)
	case len(ot.ClientAllowedSans) > 0 && len(nt.ClientAllowedSans) == 0:
		return errors.New("it removes client_allowed_sans, accepting any client certificate; that takes a restart")
	}
	return nil
}

// restartOnly lists the settings that differ between old and new but that the toolkit
// reads only when it starts listening.
func restartOnly(old, new *web.Config) []string {
	var out []string
	if old.RateLimiterConfig != new.RateLimiterConfig {
		out = append(out, "rate_limit")
	}
	if old.HTTPConfig.HTTP2 != new.HTTPConfig.HTTP2 {
		out = append(out, "http_server_config.http2")
	}
	return out
}
