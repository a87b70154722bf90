// Package logbuf collects, in tests, what a logger or a process writes from goroutines
// of its own, so that the test can read it at any time: as text (Buffer), or as records
// (Recorder). Only tests import it.
package logbuf

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/testutil"
)

// Buffer is a bytes.Buffer that may be written to while it is read. The zero value is
// empty and ready.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what has been written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Logger returns a logger that writes every level, debug included, as text lines to a
// new Buffer.
func Logger() (*slog.Logger, *Buffer) {
	b := &Buffer{}
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}

// Recorder is a slog handler that keeps every record, debug included, so that a test can
// count the lines of a condition and the level they came at. The zero value is ready.
type Recorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *Recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *Recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *Recorder) WithGroup(string) slog.Handler            { return r }
func (r *Recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}

// Count returns how many records contain substr in their message, at any level and at
// level or above.
func (r *Recorder) Count(substr string, level slog.Level) (any, atOrAbove int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.recs {
		if strings.Contains(rec.Message, substr) {
			any++
			if rec.Level >= level {
				atOrAbove++
			}
		}
	}
	return any, atOrAbove
}

// ToldOnce waits, within the given time, until msg has been logged repeats times or
// more, and fails the test unless exactly one of those lines is at level or above: a
// condition that lasts is told once, loudly, then at debug level (logging.Repeats).
func (r *Recorder) ToldOnce(t testing.TB, msg string, level slog.Level, repeats int, within time.Duration) {
	t.Helper()
	if !testutil.Poll(within, func() bool { n, _ := r.Count(msg, slog.LevelDebug); return n >= repeats }) {
		n, _ := r.Count(msg, slog.LevelDebug)
		t.Fatalf("%q logged %d times within %s, want %d or more:%s", msg, n, within, repeats, r)
	}
	if _, loud := r.Count(msg, level); loud != 1 {
		t.Fatalf("%d lines %q at %s or above, want exactly 1 (once per condition):%s", loud, msg, level, r)
	}
}

func (r *Recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, rec := range r.recs {
		fmt.Fprintf(&b, "\n  %s %s", rec.Level, rec.Message)
		rec.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s", a); return true })
	}
	return b.String()
}
