// Package markdown reads the headings of a Markdown file and the anchors GitHub gives
// them, for the tests that check links into the runbooks (tools/alerts,
// tools/dashboards). It reads ATX headings ("## Title") outside fenced code blocks only;
// it never renders Markdown and never follows a link.
package markdown

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// Heading is one ATX heading: its text without the leading #s, and its level (1 to 6).
type Heading struct {
	Text  string
	Level int
}

// Headings returns the headings of the Markdown file at path, in order.
func Headings(path string) ([]Heading, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var headings []Heading
	sc := bufio.NewScanner(f)
	inFence := false
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		level := len(line) - len(strings.TrimLeft(line, "#"))
		if level >= 1 && level <= 6 && strings.HasPrefix(line[level:], " ") {
			headings = append(headings, Heading{Text: strings.TrimSpace(line[level:]), Level: level})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return headings, nil
}

// Anchors returns the anchors GitHub gives the headings of the Markdown file at path.
func Anchors(path string) (map[string]bool, error) {
	headings, err := Headings(path)
	if err != nil {
		return nil, err
	}
	anchors := map[string]bool{}
	for _, h := range headings {
		anchors[GitHubAnchor(h.Text)] = true
	}
	return anchors, nil
}

// GitHubAnchor is the fragment GitHub gives a Markdown heading.
func GitHubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}
