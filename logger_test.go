package main

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
)

// The binary's logger removes passwords from every line, in both formats: a message, a
// string and an error that quote a DSN, through the logger and through a part's logger.
func TestLoggerRemovesPasswords(t *testing.T) {
	const pw = "hunter2secret"
	kv := "host=db user=app password=" + pw + " dbname=app"
	url := "postgres://app:" + pw + "@db/app"
	for _, format := range []string{"logfmt", "json"} {
		t.Run(format, func(t *testing.T) {
			f, err := parseFlags([]string{"--log.level=debug", "--log.format=" + format}, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			logger := newLogger(f, &buf)
			logger.Info("connecting to "+kv, "dsn", url)
			logger.With("component", "agent", "dsn", kv).Debug("failed", "err", fmt.Errorf("dial %s: refused", url))
			out := buf.String()
			if strings.Count(out, "\n") != 2 {
				t.Fatalf("want 2 lines, got:\n%s", out)
			}
			if strings.Contains(out, pw) {
				t.Errorf("a password was logged:\n%s", out)
			}
			if n := strings.Count(out, "xxxxx"); n != 4 {
				t.Errorf("%d redacted passwords, want 4:\n%s", n, out)
			}
		})
	}
}
