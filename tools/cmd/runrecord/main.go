// Command runrecord runs Go benchmarks and keeps what they printed as a run record,
// docs/runs/<name>.txt, headed by the command, the revision, the date, the machine and the
// PostgreSQL that ran them; then it writes every figure the docs quote from that record
// (<!-- bench:<name> ... -->) as the record says it. A figure of a benchmark in the docs
// is written this way and no other: make test compares each quote with its record
// (tools/docquote).
//
//	cd tools && go run ./cmd/runrecord -name leases -- \
//	    go test ./liveness -run '^$' -bench 'BenchmarkSelect1|BenchmarkLeaseAcquireRelease' -count=3
//
// The command runs in the repository's root. Nothing is written when it fails.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
	"github.com/pg-liveness/pg_liveness_exporter/tools/benchcompare"
	"github.com/pg-liveness/pg_liveness_exporter/tools/docquote"
)

var recordName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

func main() {
	name := flag.String("name", "", "the record's name: docs/runs/<name>.txt (lower case, digits and dashes)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: runrecord -name <record> -- <command that runs Go benchmarks>")
		flag.PrintDefaults()
	}
	flag.Parse()
	if err := run(*name, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "runrecord:", err)
		os.Exit(1)
	}
}

func run(name string, command []string) error {
	if !recordName.MatchString(name) {
		return fmt.Errorf("-name %q: want lower case letters, digits and dashes", name)
	}
	if len(command) == 0 {
		return fmt.Errorf("no command after --")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Hour)
	defer cancel()
	root, err := output(ctx, "git", "rev-parse", "--show-toplevel")
	if err != nil {
		return err
	}
	header := recordHeader(ctx, name, root, command)

	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, command[0], command[1:]...)
	cmd.Dir = root
	cmd.Stdout = io.MultiWriter(os.Stdout, &out)
	cmd.Stderr = os.Stderr
	started := time.Now()
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w; no record written", strings.Join(command, " "), err)
	}
	header += fmt.Sprintf("# Took %s; load average at its end: %s\n", time.Since(started).Round(time.Second), loadavg())

	path := filepath.Join(root, docquote.RunsDir, name+".txt")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(header+relative(out.String(), root)), 0o644); err != nil {
		return err
	}
	recs, err := docquote.Records(root)
	if err != nil {
		return err
	}
	failed, err := docquote.UpdateBench(root, name, recs)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "runrecord: wrote %s and the docs' quotes of it\n", path)
	for _, m := range failed {
		fmt.Fprintf(os.Stderr, "runrecord: %s quotes %q, which the record does not have; left as it was\n", m.File, m.Key)
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d quotes of %s could not be written", len(failed), name)
	}
	return nil
}

// recordHeader says what ran, on which code, when and where.
func recordHeader(ctx context.Context, name, root string, command []string) string {
	rev, err := output(ctx, "git", "-C", root, "rev-parse", "--short", "HEAD")
	if err != nil {
		rev = "unknown (" + err.Error() + ")"
	}
	// The docs' own edits change nothing a benchmark measures.
	if st, err := output(ctx, "git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs", ":!README.md"); err == nil && st != "" {
		rev += " with uncommitted changes"
	}
	pg := "unknown"
	if dir, err := pgtest.FindBinDir(); err == nil {
		if v, err := output(ctx, filepath.Join(dir, "postgres"), "--version"); err == nil {
			pg = v
		}
	}
	quoted := make([]string, len(command))
	for i, a := range command {
		quoted[i] = a
		if strings.ContainsAny(a, " |*^$()'\"") {
			quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return fmt.Sprintf("# Run record %s: written by tools/cmd/runrecord; do not edit by hand. The docs quote it and make test compares the quotes.\n"+
		"# Command: %s\n# Revision: %s\n# Date: %s\n# Machine: %s; load average at the start: %s\n# PostgreSQL: %s\n",
		name, strings.Join(quoted, " "), rev, time.Now().UTC().Format("2006-01-02 15:04 UTC"), benchcompare.Machine(), loadavg(), pg)
}

// relative writes the checkout's own paths in what the run printed (a make target echoes
// $(CURDIR)) relative to its root: a record says nothing of the machine's folders.
func relative(out, root string) string {
	return strings.ReplaceAll(strings.ReplaceAll(out, root+"/", ""), root, ".")
}

func output(ctx context.Context, name string, args ...string) (string, error) {
	b, err := exec.CommandContext(ctx, name, args...).Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(b)), nil
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
