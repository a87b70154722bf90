package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A run's output becomes its record, headed by what ran where, and the docs' quotes of it
// are rewritten; a command that fails leaves no record.
func TestARunBecomesARecordAndItsQuotes(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "docs"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(root, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("README.md", "# A\n")
	write("docs/guide.md", "It takes <!-- bench:tiny BenchmarkTiny ns/op -->9.9 ms<!-- /bench -->.\n")
	for _, args := range [][]string{{"init", "-q"}, {"add", "."}, {"-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", "a"}} {
		if out, err := exec.Command("git", append([]string{"-C", root}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	t.Chdir(root)
	if err := run("tiny", []string{"sh", "-c", `printf 'goos: linux\nplot=%s/docs/plot.svg\nBenchmarkTiny-2 \t 10\t 5012345 ns/op\nPASS\n' "$PWD"`}); err != nil {
		t.Fatal(err)
	}
	rec, err := os.ReadFile(filepath.Join(root, "docs", "runs", "tiny.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(rec), root) {
		t.Errorf("the record names the checkout's folder %s:\n%s", root, rec)
	}
	for _, want := range []string{"# Run record tiny", "# Command: sh -c ", "# Revision: ", "# Date: ", "# Machine: ", "BenchmarkTiny-2", "plot=docs/plot.svg"} {
		if !strings.Contains(string(rec), want) {
			t.Errorf("the record lacks %q:\n%s", want, rec)
		}
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "guide.md"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "It takes <!-- bench:tiny BenchmarkTiny ns/op -->5.0 ms<!-- /bench -->.\n"; string(doc) != want {
		t.Errorf("the guide reads %q, want %q", doc, want)
	}
	if err := run("broken", []string{"false"}); err == nil {
		t.Error("a failing command made no error")
	}
	if _, err := os.Stat(filepath.Join(root, "docs", "runs", "broken.txt")); !os.IsNotExist(err) {
		t.Errorf("a failing command left a record: %v", err)
	}
}
