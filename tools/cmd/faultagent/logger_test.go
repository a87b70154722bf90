package main

import (
	"bytes"
	"testing"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logtest"
)

// The fault agent's logger removes passwords from every line.
func TestLoggerRemovesPasswords(t *testing.T) {
	var buf bytes.Buffer
	logtest.LogPasswords(newLogger(&buf))
	if leak, problem := logtest.Leak(buf.String()); leak != "" || problem != "" {
		t.Fatalf("leaked %q (%s):\n%s", leak, problem, buf.String())
	}
}
