package main

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

// `make build` stamps the version from git into pg_liveness_exporter_build_info; a plain
// `go build` leaves version and branch empty.
func TestMakeBuildStampsVersion(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make is not installed: apt-get install make")
	}
	bin := filepath.Join(t.TempDir(), "pg_liveness_exporter")
	if out, err := exec.Command("make", "--no-print-directory", "build", "BINARY="+bin).CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	revision, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD (the test needs the git checkout): %v", err)
	}

	db := pgtest.NewDB(t)
	p := startBinary(t, bin, []string{"DATA_SOURCE_NAME=" + db.DSN}, "--no-agent")
	line := regexp.MustCompile(`(?m)^pg_liveness_exporter_build_info\{.*\} 1$`).FindString(
		p.waitFor(t, `(?m)^pg_liveness_exporter_build_info\{`, 30*time.Second))
	labels := map[string]string{}
	for _, m := range regexp.MustCompile(`(\w+)="([^"]*)"`).FindAllStringSubmatch(line, -1) {
		labels[m[1]] = m[2]
	}
	for _, name := range []string{"version", "revision", "branch", "goversion"} {
		if labels[name] == "" || labels[name] == "unknown" {
			t.Errorf("build_info label %s is %q; want it stamped: %s", name, labels[name], line)
		}
	}
	if want := strings.TrimSpace(string(revision)); labels["revision"] != want {
		t.Errorf("build_info revision %q, want git's HEAD %s", labels["revision"], want)
	}
	if strings.Contains(labels["version"], " ") {
		t.Errorf("build_info version %q has a space", labels["version"])
	}
}
