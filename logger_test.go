package main

import (
	"bytes"
	"io"
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logtest"
)

// The binary's logger removes passwords from every line, in both formats.
func TestLoggerRemovesPasswords(t *testing.T) {
	for _, format := range []string{"logfmt", "json"} {
		t.Run(format, func(t *testing.T) {
			f, err := parseFlags([]string{"--log.format=" + format}, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			logtest.LogPasswords(newLogger(f, &buf))
			if leak, problem := logtest.Leak(buf.String()); leak != "" || problem != "" {
				t.Fatalf("leaked %q (%s):\n%s", leak, problem, buf.String())
			}
		})
	}
}
