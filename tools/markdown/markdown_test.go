package markdown

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestGitHubAnchor(t *testing.T) {
	for in, want := range map[string]string{
		"PgLivenessZombieInstances":   "pglivenesszombieinstances",
		"How to read this, at 3 a.m.": "how-to-read-this-at-3-am",
		"Check `pg_locks` (SQL)":      "check-pg_locks-sql",
	} {
		if got := GitHubAnchor(in); got != want {
			t.Errorf("GitHubAnchor(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestHeadings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "doc.md")
	doc := "# Title\n\ntext\n## Section one\n```\n## not a heading\n```\n#not a heading\n####### seven\n### Deep  \n"
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Headings(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []Heading{{"Title", 1}, {"Section one", 2}, {"Deep", 3}}
	if !slices.Equal(got, want) {
		t.Errorf("Headings = %v, want %v", got, want)
	}
	if _, err := Headings(filepath.Join(t.TempDir(), "missing.md")); err == nil {
		t.Error("Headings of a missing file: no error")
	}
}
