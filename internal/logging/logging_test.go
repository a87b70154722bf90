package logging

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/logtest"
)

func TestRedactingHandlerRemovesPasswords(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			var buf bytes.Buffer
			var h slog.Handler = slog.NewTextHandler(&buf, nil)
			if format == "json" {
				h = slog.NewJSONHandler(&buf, nil)
			}
			logtest.LogPasswords(Wrap(slog.New(h)))
			out := buf.String()
			if leak, problem := logtest.Leak(out); leak != "" || problem != "" {
				t.Fatalf("leaked %q (%s):\n%s", leak, problem, out)
			}
			for _, want := range []string{"xxxxx", "host=db", "cannot parse DSN"} {
				if !strings.Contains(out, want) {
					t.Errorf("no %q in the lines:\n%s", want, out)
				}
			}
		})
	}
}

// Values without a password are left to the handler to format as it would.
func TestRedactingHandlerKeepsOtherValues(t *testing.T) {
	var buf bytes.Buffer
	l := Wrap(slog.New(slog.NewJSONHandler(&buf, nil)))
	l.Info("m", "d", 1500*time.Millisecond, "n", 3, "ids", []string{"a", "b"}, "err", errors.New("plain"))
	want := `"msg":"m","d":1500000000,"n":3,"ids":["a","b"],"err":"plain"}`
	if !strings.HasSuffix(strings.TrimSpace(buf.String()), want) {
		t.Errorf("got %s, want it to end with %s", buf.String(), want)
	}
}

func TestWrapOnce(t *testing.T) {
	l := Wrap(slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	if w := l.With("a", 1); Wrap(l) != l || Wrap(w) != w {
		t.Error("a redacting logger was wrapped again")
	}
	if _, ok := Wrap(nil).Handler().(redactor); ok || Wrap(nil).Enabled(t.Context(), slog.LevelError) {
		t.Error("Wrap(nil) does not discard")
	}
}

// recorder keeps each record's level, message and source file.
type recorder struct{ lines []string }

func (r *recorder) Enabled(_ context.Context, l slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler           { return r }
func (r *recorder) WithGroup(string) slog.Handler                { return r }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.lines = append(r.lines, fmt.Sprintf("%s %s %s", rec.Level, rec.Message, filepath.Base(rec.Source().File)))
	return nil
}

func TestRepeats(t *testing.T) {
	rec := &recorder{}
	l := slog.New(rec)
	var r Repeats
	if r.Clear(l, "recovered") {
		t.Error("Clear without a condition reported one")
	}
	for _, cond := range []string{"down", "down", "down", "refused", "refused"} {
		r.Log(l, slog.LevelWarn, cond, "failed: "+cond)
	}
	if !r.Clear(l, "recovered") || r.Clear(l, "recovered") {
		t.Error("Clear did not report the condition exactly once")
	}
	r.Log(l, slog.LevelError, "down", "failed: down")
	want := []string{
		"WARN failed: down logging_test.go", "DEBUG failed: down logging_test.go", "DEBUG failed: down logging_test.go",
		"WARN failed: refused logging_test.go", "DEBUG failed: refused logging_test.go",
		"INFO recovered logging_test.go", "ERROR failed: down logging_test.go",
	}
	if strings.Join(rec.lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("lines:\n%s\nwant:\n%s", strings.Join(rec.lines, "\n"), strings.Join(want, "\n"))
	}
}
