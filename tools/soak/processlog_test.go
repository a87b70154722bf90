package soak

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHistoryKeepsTheProcessesLogLines: the lines the fleet's processes print are kept
// beside the history, each with its process's name, so that a violation found by the
// checker can be read against what the process said at the time.
func TestHistoryKeepsTheProcessesLogLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.jsonl")
	h, err := NewHistory(path)
	if err != nil {
		t.Fatal(err)
	}
	h.Log("ex-0", `level=WARN msg="alive lock connection lost; reconnecting"`)
	h.Log("fa-1-0", `{"level":"INFO","msg":"lease lost"}`)
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(ProcessLogPath(path))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], ` ex-0 level=WARN msg="alive lock connection lost`) ||
		!strings.Contains(lines[1], ` fa-1-0 {"level":"INFO"`) {
		t.Fatalf("the processes' log:\n%s", b)
	}
	if ProcessLogPath(path) == path {
		t.Fatal("the processes' log would overwrite the history")
	}
}
