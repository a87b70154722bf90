package deploy

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	"helm.sh/helm/v3/pkg/chart/loader"

	"github.com/pg-liveness/pg_liveness_exporter/deploy/internal/image"
	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/proctest"
)

// workflowsDir holds the repository's GitHub Actions workflows.
const workflowsDir = "../.github/workflows"

// actionlintModule is the actionlint the tests run: its command, built from the Go
// module proxy by go install, outside this module's go.mod (its go.yaml.in/yaml/v4 is an
// older release candidate than Prometheus', and the two do not build together).
const actionlintModule = "github.com/rhysd/actionlint/cmd/actionlint@v1.7.12"

// lintError is one finding of actionlint, as its -format '{{json .}}' writes it.
type lintError struct {
	Message  string `json:"message"`
	Filepath string `json:"filepath"`
	Line     int    `json:"line"`
	Column   int    `json:"column"`
	Kind     string `json:"kind"`
}

func (e lintError) String() string {
	return fmt.Sprintf("%s:%d:%d: %s [%s]", e.Filepath, e.Line, e.Column, e.Message, e.Kind)
}

// lintWorkflows runs actionlint, with shellcheck on every run: script, on the workflow
// files and returns what it finds.
func lintWorkflows(t *testing.T, files ...string) []lintError {
	t.Helper()
	shellcheck := proctest.NeedTool(t, "shellcheck", "shellcheck")
	bin := t.TempDir()
	install := exec.Command("go", "install", actionlintModule)
	install.Env = append(os.Environ(), "GOBIN="+bin, "GOFLAGS=")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install %s: %v\n%s", actionlintModule, err, out)
	}
	cmd := exec.Command(filepath.Join(bin, "actionlint"), append([]string{"-shellcheck=" + shellcheck, "-format={{json .}}"}, files...)...)
	out, err := cmd.Output()
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) { // 1: it found something
		t.Fatalf("actionlint: %v\n%s", err, out)
	}
	var errs []lintError
	if err := json.Unmarshal(out, &errs); err != nil {
		t.Fatalf("actionlint's output: %v\n%s", err, out)
	}
	return errs
}

// Every workflow passes actionlint: the syntax, the expressions and their types, the
// actions' inputs, the runners, and shellcheck on the scripts.
func TestWorkflowsPassActionlint(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(workflowsDir, "*.yml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no workflow in %s: %v", workflowsDir, err)
	}
	for _, e := range lintWorkflows(t, files...) {
		t.Errorf("actionlint: %s", e)
	}
}

// actionlint, as the test above runs it, finds a mistake of each kind it is there for:
// an unknown runner, an expression on a context that does not exist, and an unquoted
// variable that shellcheck warns of.
func TestActionlintCatchesMistakes(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(workflowsDir, "release.yml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, old, new, want string }{
		{"unknown runner", "runs-on: ubuntu-latest", "runs-on: ubuntu-latset", "ubuntu-latset"},
		{"unknown context", "${{ secrets.GITHUB_TOKEN }}", "${{ secret.GITHUB_TOKEN }}", "secret"},
		{"shellcheck", `make image IMAGE_TAG="$GITHUB_REF_NAME"`, `make image IMAGE_TAG=$GITHUB_REF_NAME`, "shellcheck"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(string(b), c.old) {
				t.Fatalf("release.yml has no %q to break", c.old)
			}
			broken := filepath.Join(t.TempDir(), "release.yml")
			if err := os.WriteFile(broken, []byte(strings.Replace(string(b), c.old, c.new, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			errs := lintWorkflows(t, broken)
			found := false
			for _, e := range errs {
				found = found || strings.Contains(e.String(), c.want)
			}
			if !found {
				t.Errorf("actionlint did not report %q: %v", c.want, errs)
			}
		})
	}
}

// The release workflow publishes the image the chart runs by default: on a tag v*, after
// checking that the tag is the chart's appVersion, it runs make image (whose repository is
// the chart's, TestChartDefaultsToTheReleasedImage) tagged with the release, and pushes
// the layout to the Makefile's repository under that tag, with the job's token and the
// permission to write packages.
func TestReleaseWorkflowPushesTheChartsImage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(workflowsDir, "release.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var wf struct {
		On struct {
			Push struct {
				Tags []string `yaml:"tags"`
			} `yaml:"push"`
		} `yaml:"on"`
		Jobs map[string]struct {
			Permissions map[string]string `yaml:"permissions"`
			Steps       []struct {
				Run string `yaml:"run"`
			} `yaml:"steps"`
		} `yaml:"jobs"`
	}
	if err := yaml.Unmarshal(b, &wf); err != nil {
		t.Fatal(err)
	}
	if len(wf.On.Push.Tags) != 1 || wf.On.Push.Tags[0] != "v*" {
		t.Errorf("release.yml runs on tags %v, want v*", wf.On.Push.Tags)
	}
	job, ok := wf.Jobs["image"]
	if !ok {
		t.Fatal("release.yml has no job image")
	}
	if job.Permissions["packages"] != "write" {
		t.Errorf("the image job's permissions %v: it needs packages: write to push", job.Permissions)
	}
	var runs []string
	for _, s := range job.Steps {
		runs = append(runs, s.Run)
	}
	script := strings.Join(runs, "\n")
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"deploy/helm/pg-liveness-exporter/Chart.yaml", // the tag checked against appVersion
		`make image IMAGE_TAG="$GITHUB_REF_NAME"`,
		`sed -n 's/^IMAGE_REPOSITORY *?= *//p' Makefile`,
		`push image/oci "$repository:$GITHUB_REF_NAME"`,
	} {
		if !strings.Contains(script, want) {
			t.Errorf("release.yml's image job does not run %q", want)
		}
	}
	if !strings.HasPrefix(ch.Metadata.AppVersion, "v") {
		t.Errorf("the chart's appVersion %q is no v* tag the workflow runs on", ch.Metadata.AppVersion)
	}
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mk), "IMAGE_REPOSITORY ?= "+image.DefaultRepository+"\n") {
		t.Errorf("the Makefile's IMAGE_REPOSITORY, which the workflow pushes to, is not %s", image.DefaultRepository)
	}
}
