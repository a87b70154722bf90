package docquote

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Every figure in the docs is a run's or the code's: a quote of the failover report, a
// default, a flag's default or an alert's `for` (each compared here with what the code or
// the rules file holds), an input a reader is told is given, or a figure in a generated
// block. A figure written by hand anywhere else fails, with its file and line.
func TestDocsFiguresAreRunsOrCode(t *testing.T) {
	root := filepath.Join("..", "..")
	files, err := docs(root)
	if err != nil {
		t.Fatal(err)
	}
	settings, flags := Settings(root), FlagDefaults()
	alerts, err := AlertRules(filepath.Join(root, "alerts", "pg_liveness.rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	recs, err := Records(root)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		for name := range recs {
			failed, err := UpdateBench(root, name, recs)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range failed {
				t.Errorf("%s: quotes %q, which the record does not have", m.File, m.Key)
			}
		}
	}
	kinds := map[string]int{}
	for _, f := range files {
		marks, unmarked, err := Scan(root, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range marks {
			kinds[m.Kind]++
			if msg := checkMark(root, m, settings, flags, alerts, recs); msg != "" {
				t.Errorf("%s:%d: %s", m.File, m.Line, msg)
			}
		}
		for _, u := range unmarked {
			t.Errorf("%s:%d: %q is a figure no run wrote and no test compares: quote it from the run that measured it, name the setting it is, mark it given, or take it out", u.File, u.Line, u.Text)
		}
	}
	// Each kind is used: a marker the scan stopped reading would pass everything above.
	for _, k := range []string{KindFailover, KindDefault, KindFlag, KindAlert, KindGiven, KindBench, KindYAML} {
		if kinds[k] == 0 {
			t.Errorf("the docs hold no %s marker; the scan reads none?", k)
		}
	}
}

// checkMark says what is wrong with a marked figure, or "" when the code, the flags or the
// rules file hold what it says. Quotes of the failover report are
// TestDocsQuoteTheFailoverReport's.
func checkMark(root string, m Mark, settings map[string]any, flags map[string]string, alerts map[string]Rule, recs map[string]Record) string {
	var want Quantity
	var what string
	switch m.Kind {
	case KindFailover:
		return ""
	case KindBench:
		q, err := Measure(m.Key, recs)
		if err != nil {
			return err.Error()
		}
		ok, err := Agrees(m.Text, q)
		switch {
		case err != nil:
			return err.Error()
		case !ok:
			r, _ := Rewritten(m.Text, q)
			name, _, _ := strings.Cut(m.Key, " ")
			return "quotes " + m.Key + " as " + m.Text + "; the record says " + r + " (make record-" + name + " runs it again and writes it; go test ./docquote -update writes what the records say)"
		}
		return ""
	case KindGiven:
		if !figure.MatchString(" " + m.Text + " ") {
			return "a given figure that is no figure: " + m.Text
		}
		return ""
	case KindDefault:
		v, ok := settings[m.Key]
		if !ok {
			return "quotes the setting " + m.Key + ", which Settings (tools/docquote) does not have"
		}
		q, err := Quantify(v)
		if err != nil {
			return err.Error()
		}
		want, what = q, "the code's "+m.Key
	case KindFlag:
		def, ok := flags[m.Key]
		if !ok {
			return "quotes the default of " + m.Key + ", which is no flag with one default"
		}
		q, err := FlagQuantity(def)
		if err != nil {
			return m.Key + "'s default: " + err.Error()
		}
		want, what = q, m.Key+"'s default ("+def+")"
	case KindAlert:
		name, part, _ := strings.Cut(m.Key, " ")
		r, ok := alerts[name]
		switch {
		case !ok:
			return "quotes alert " + name + ", which the rules do not have"
		case part == "expr":
			q, err := ParseQuantity(m.Text)
			if err != nil {
				return err.Error()
			}
			if !InExpr(r.Expr, q) {
				return "says alert " + name + "'s expression holds " + m.Text + "; it does not:\n" + r.Expr
			}
			return ""
		case part != "":
			return "quotes alert " + name + "'s " + part + ": a rule's for (no more in the key) or its expr"
		}
		want, what = Quantity{Value: float64(r.For), Dim: "duration"}, "alert "+name+"'s for ("+r.For.String()+")"
	case KindYAML:
		file, path, ok := strings.Cut(m.Key, " ")
		if !ok {
			return "a yaml quote's key is a file under the root and a dotted path: " + m.Key
		}
		q, err := YAMLValue(filepath.Join(root, file), path)
		if err != nil {
			return err.Error()
		}
		want, what = q, file+"'s "+path
	default:
		return "a marker of unknown kind " + m.Kind
	}
	got, err := ParseQuantity(m.Text)
	if err != nil {
		return err.Error()
	}
	if !got.Equal(want) {
		return "says " + m.Text + " for " + what + ", which is " + want.String()
	}
	return ""
}

// Scan reads figures where a reader sees them, and only there: not in code, fenced or
// spanned, nor in a generated block, nor between markers; and it refuses a marker closed
// by another kind.
func TestScanFindsTheFiguresWrittenByHand(t *testing.T) {
	root := t.TempDir()
	doc := "A takeover in 1.3 s, and 34-95 ms at the median.\n" +
		"Run `sleep 5s` and\n```sh\nsleep 10s\n```\n" +
		"<!-- bench:begin -->\n| a | 40 ms |\n<!-- bench:end -->\n" +
		"After <!-- default:LockGrace -->1 s<!-- /default --> and <!-- given -->20 s<!-- /given -->, 16 KiB.\n" +
		"0.08 millicores an agent, 8 statements a second, 50 a second.\n"
	path := filepath.Join(root, "doc.md")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	marks, unmarked, err := Scan(root, path)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, u := range unmarked {
		got = append(got, u.Text)
	}
	if want := []string{"1.3 s", "34-95 ms", "16 KiB", "0.08 millicores", "8 statements a second", "50 a second"}; !slices.Equal(got, want) {
		t.Errorf("unmarked figures %q, want %q", got, want)
	}
	if len(marks) != 2 || marks[0] != (Mark{File: "doc.md", Line: 9, Kind: KindDefault, Key: "LockGrace", Text: "1 s"}) || marks[1].Kind != KindGiven {
		t.Errorf("marks %+v, want LockGrace's default and a given on line 9", marks)
	}
	bad := filepath.Join(root, "bad.md")
	if err := os.WriteFile(bad, []byte("<!-- default:LockGrace -->1 s<!-- /given -->\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Scan(root, bad); err == nil {
		t.Error("a default marker closed by /given was read")
	}
}

// A marked figure is compared with the code's value, whatever unit the doc writes it in,
// and one that says another value fails.
func TestAMarkedFigureIsComparedWithTheCode(t *testing.T) {
	settings := map[string]any{"Grace": time.Second, "Max": bytes(16 << 10), "Count": 3, "Share": share(50),
		"Unreadable": fmt.Errorf("no such declaration")}
	flags := map[string]string{"--a.interval": "1m0s"}
	alerts := map[string]Rule{"Dead": {For: 5 * time.Minute, Expr: "changes(x[30m]) > 3 and y > 0.75 or z > 120"}}
	for _, c := range []struct {
		m  Mark
		ok bool
	}{
		{Mark{Kind: KindDefault, Key: "Grace", Text: "1 s"}, true},
		{Mark{Kind: KindDefault, Key: "Grace", Text: "1,000 ms"}, true},
		{Mark{Kind: KindDefault, Key: "Grace", Text: "0.75 s"}, false},
		{Mark{Kind: KindDefault, Key: "Grace", Text: "1 KiB"}, false},
		{Mark{Kind: KindDefault, Key: "Max", Text: "16 KiB"}, true},
		{Mark{Kind: KindDefault, Key: "Count", Text: "3"}, true},
		{Mark{Kind: KindDefault, Key: "Nothing", Text: "3"}, false},
		{Mark{Kind: KindFlag, Key: "--a.interval", Text: "60 s"}, true},
		{Mark{Kind: KindFlag, Key: "--a.interval", Text: "30 s"}, false},
		{Mark{Kind: KindAlert, Key: "Dead", Text: "5 minutes"}, true},
		{Mark{Kind: KindAlert, Key: "Dead", Text: "2 min"}, false},
		{Mark{Kind: KindAlert, Key: "Alive", Text: "5 min"}, false},
		{Mark{Kind: KindAlert, Key: "Dead expr", Text: "30 minutes"}, true},
		{Mark{Kind: KindAlert, Key: "Dead expr", Text: "75 %"}, true},
		{Mark{Kind: KindAlert, Key: "Dead expr", Text: "120 s"}, true},
		{Mark{Kind: KindAlert, Key: "Dead expr", Text: "60 minutes"}, false},
		{Mark{Kind: KindAlert, Key: "Dead expr", Text: "4 s"}, false},
		{Mark{Kind: KindAlert, Key: "Dead labels", Text: "30 minutes"}, false},
		{Mark{Kind: KindDefault, Key: "Share", Text: "50 %"}, true},
		{Mark{Kind: KindDefault, Key: "Share", Text: "50"}, false},
		{Mark{Kind: KindDefault, Key: "Unreadable", Text: "1 s"}, false},
		{Mark{Kind: KindGiven, Text: "1-3 s"}, true},
		{Mark{Kind: KindGiven, Text: "soon"}, false},
		{Mark{Kind: "guess", Key: "x", Text: "1 s"}, false},
	} {
		if msg := checkMark(".", c.m, settings, flags, alerts, nil); (msg == "") != c.ok {
			t.Errorf("checkMark(%+v) = %q; want it to pass: %v", c.m, msg, c.ok)
		}
	}
}
