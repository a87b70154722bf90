package logging

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"time"
)

// Wrap returns l with every record redacted (see Redacting). A nil l gives a logger that
// discards; a logger that already redacts, or discards, is returned as it is.
func Wrap(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	if _, ok := l.Handler().(redactor); ok || l.Handler() == slog.DiscardHandler {
		return l
	}
	return slog.New(redactor{next: l.Handler()})
}

// Redacting returns a handler that removes every password from a record before next
// sees it: from the message, from string values, from errors (a pgx error quoting a
// DSN that does not parse becomes a fixed description of what is wrong) and from any
// other value whose printed form holds one, in groups too, and from the attributes
// added with With.
func Redacting(next slog.Handler) slog.Handler {
	if r, ok := next.(redactor); ok {
		return r
	}
	return redactor{next: next}
}

type redactor struct{ next slog.Handler }

func (h redactor) Enabled(ctx context.Context, level slog.Level) bool {
	return h.next.Enabled(ctx, level)
}

func (h redactor) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, Redact(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(redact(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h redactor) WithAttrs(attrs []slog.Attr) slog.Handler {
	return redactor{next: h.next.WithAttrs(redactAll(attrs))}
}

func (h redactor) WithGroup(name string) slog.Handler {
	return redactor{next: h.next.WithGroup(name)}
}

func redactAll(attrs []slog.Attr) []slog.Attr {
	out := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		out[i] = redact(a)
	}
	return out
}

// redact returns a with no password in its value. Values that hold none keep their kind,
// so that handlers format them as before.
func redact(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, Redact(v.String()))
	case slog.KindGroup:
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(redactAll(v.Group())...)}
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.String(a.Key, RedactError(x).Error())
		case []byte:
			if s := string(x); Redact(s) != s {
				return slog.String(a.Key, Redact(s))
			}
		default:
			if s := fmt.Sprintf("%+v", x); Redact(s) != s {
				return slog.String(a.Key, Redact(s))
			}
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}

// Repeats logs a condition that a loop meets again and again once when it begins or
// changes, at debug level while it repeats, and once when it ends: a database that
// stays down writes one warning, not one per scrape, and one line when it is back. The
// zero value has no condition; it is safe for concurrent use.
type Repeats struct {
	mu   sync.Mutex
	last string // the current condition, "" when there is none
}

// Log logs msg at level when condition is not the current one, and at debug level when
// it is; condition becomes the current one. condition is compared, never logged: an
// error's text, a state's name. It must not be empty.
func (r *Repeats) Log(l *slog.Logger, level slog.Level, condition, msg string, args ...any) {
	r.mu.Lock()
	if condition == r.last {
		level = slog.LevelDebug
	}
	r.last = condition
	r.mu.Unlock()
	emit(l, level, msg, args)
}

// Clear ends the current condition: it logs msg at info level when there was one (a
// recovery), and nothing when there was none. It reports whether there was.
func (r *Repeats) Clear(l *slog.Logger, msg string, args ...any) bool {
	r.mu.Lock()
	had := r.last != ""
	r.last = ""
	r.mu.Unlock()
	if had {
		emit(l, slog.LevelInfo, msg, args)
	}
	return had
}

// emit logs with the source of Log's or Clear's caller, not this file's.
func emit(l *slog.Logger, level slog.Level, msg string, args []any) {
	ctx := context.Background()
	if !l.Enabled(ctx, level) {
		return
	}
	var pcs [1]uintptr
	runtime.Callers(3, pcs[:]) // runtime.Callers, emit, Log or Clear
	r := slog.NewRecord(time.Now(), level, msg, pcs[0])
	r.Add(args...)
	_ = l.Handler().Handle(ctx, r)
}
