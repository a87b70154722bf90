// Package logbuf collects, in tests, what a logger or a process writes from goroutines
// of its own, so that the test can read it at any time. Only tests import it.
package logbuf

import (
	"bytes"
	"log/slog"
	"sync"
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
