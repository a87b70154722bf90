package docquote

import (
	"path/filepath"
	"testing"
	"time"
)

// A declaration is read as the code writes it, through the names it uses, and one it
// cannot read is an error.
func TestSourceValueReadsDeclarations(t *testing.T) {
	root := filepath.Join("..", "..")
	for _, c := range []struct {
		dir, name string
		want      any
	}{
		{"internal/defaults", "StaleThreshold", 90 * time.Second},
		{"internal/defaults", "NodeAgentMaxMessageBytes", 16 << 10},
		{"internal/defaults", "KeepaliveCount", 3},
		{"internal/status", "DefaultHistoryWindow", 24 * time.Hour},
	} {
		got, err := SourceValue(root, c.dir, c.name)
		if err != nil || got != c.want {
			t.Errorf("SourceValue(%s, %s) = %v, %v; want %v", c.dir, c.name, got, err, c.want)
		}
	}
	for _, name := range []string{"Schema", "NoSuchName"} {
		if v, err := SourceValue(root, "internal/defaults", name); err == nil {
			t.Errorf("SourceValue(defaults, %s) = %v; want an error", name, v)
		}
	}
}
