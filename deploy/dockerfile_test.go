package deploy

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

type instruction struct {
	cmd   string   // lower case: from, run, copy, …
	args  []string // the words after the command
	flags []string // --from=…, --chown=…
	json  bool     // exec form: ENTRYPOINT ["…"]
	line  int
}

type stage struct {
	base, name string
	body       []instruction
}

// dockerStages parses the repository's Dockerfile with BuildKit's own parser.
func dockerStages(t *testing.T) []stage {
	t.Helper()
	f, err := os.Open("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	var stages []stage
	for _, n := range res.AST.Children {
		in := instruction{cmd: strings.ToLower(n.Value), flags: n.Flags, json: n.Attributes["json"], line: n.StartLine}
		for a := n.Next; a != nil; a = a.Next {
			in.args = append(in.args, a.Value)
		}
		if in.cmd == "from" {
			s := stage{base: in.args[0]}
			if len(in.args) == 3 && strings.EqualFold(in.args[1], "as") {
				s.name = in.args[2]
			}
			stages = append(stages, s)
			continue
		}
		if len(stages) == 0 {
			if in.cmd != "arg" {
				t.Fatalf("Dockerfile line %d: %s before the first FROM", in.line, in.cmd)
			}
			continue
		}
		stages[len(stages)-1].body = append(stages[len(stages)-1].body, in)
	}
	return stages
}

func (s stage) all(cmd string) []instruction {
	var out []instruction
	for _, in := range s.body {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

// makefileVersionVars reads the -X flags of the Makefile's LDFLAGS: the variable of
// github.com/prometheus/common/version each sets, and the make variable it comes from.
func makefileVersionVars(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^VERSION_PKG\s*:?=\s*github\.com/prometheus/common/version\s*$`).Match(b) {
		t.Fatal("Makefile: VERSION_PKG is not github.com/prometheus/common/version")
	}
	vars := map[string]string{}
	for _, m := range regexp.MustCompile(`-X \$\(VERSION_PKG\)\.(\w+)=\$\((\w+)\)`).FindAllStringSubmatch(string(b), -1) {
		vars[m[1]] = m[2]
	}
	for _, v := range []string{"Version", "Revision", "Branch", "BuildUser", "BuildDate"} {
		if vars[v] == "" {
			t.Errorf("Makefile: LDFLAGS does not set version.%s", v)
		}
	}
	if !regexp.MustCompile(`(?m)^build:\n\t\$\(GO\) build -ldflags '\$\(LDFLAGS\)'`).Match(b) {
		t.Error("Makefile: the build target does not pass $(LDFLAGS)")
	}
	return vars
}

func TestDockerfile(t *testing.T) {
	stages := dockerStages(t)
	if len(stages) != 2 {
		t.Fatalf("want two stages (build, runtime), got %d", len(stages))
	}
	build, final := stages[0], stages[1]

	// Both bases are pinned by digest, after the tag that says what they are.
	pinned := regexp.MustCompile(`^[a-z0-9./-]+:[A-Za-z0-9._-]+@sha256:[0-9a-f]{64}$`)
	for _, s := range stages {
		if !pinned.MatchString(s.base) {
			t.Errorf("FROM %s: pin the base by digest, NAME:TAG@sha256:…", s.base)
		}
	}

	// The build stage: the Go of go.mod, static, and `make build` with every version
	// variable the Makefile's ldflags use, each from a build argument.
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if goVersion == nil || !strings.HasPrefix(build.base, "golang:"+string(goVersion[1])+"-") || build.name == "" {
		t.Errorf("build stage FROM %s AS %q: want golang:%s-… with a name", build.base, build.name, goVersion[1])
	}
	var static bool
	for _, env := range build.all("env") {
		for i := 0; i+1 < len(env.args); i += 2 {
			static = static || env.args[i] == "CGO_ENABLED" && env.args[i+1] == "0"
		}
	}
	if !static {
		t.Error("build stage: no ENV CGO_ENABLED=0, so the binary may link libc")
	}
	var args []string
	for _, a := range build.all("arg") {
		args = append(args, strings.SplitN(a.args[0], "=", 2)[0])
	}
	var makeRun string
	for _, r := range build.all("run") {
		if strings.Contains(strings.Join(r.args, " "), "make build") {
			makeRun = strings.Join(r.args, " ")
		}
	}
	if makeRun == "" {
		t.Fatal("build stage: no RUN make build; the version flags must come from the Makefile")
	}
	for field, v := range makefileVersionVars(t) {
		if !slices.Contains(args, v) {
			t.Errorf("build stage: no ARG %s for version.%s", v, field)
		}
		if !strings.Contains(makeRun, v+`="${`+v+`}"`) {
			t.Errorf("build stage: make build does not pass %s=\"${%s}\" (version.%s): %s", v, v, field, makeRun)
		}
	}
	out := regexp.MustCompile(`BINARY=(\S+)`).FindStringSubmatch(makeRun)
	if out == nil {
		t.Fatalf("build stage: make build without BINARY=: %s", makeRun)
	}

	// The runtime stage: a shell-less base, the binary copied from the build stage, a
	// numeric non-root user, the binary as the exec-form entrypoint.
	if !strings.HasPrefix(final.base, "gcr.io/distroless/static-") && final.base != "scratch" {
		t.Errorf("runtime stage FROM %s: want a distroless static image or scratch (no shell)", final.base)
	}
	if runs := final.all("run"); len(runs) > 0 {
		t.Errorf("runtime stage line %d: RUN needs a shell, which the image must not have", runs[0].line)
	}
	copies := final.all("copy")
	if len(copies) != 1 || !slices.Contains(copies[0].flags, "--from="+build.name) || copies[0].args[0] != out[1] {
		t.Fatalf("runtime stage: want one COPY --from=%s %s …, got %+v", build.name, out[1], copies)
	}
	binary := copies[0].args[1]
	users := final.all("user")
	if len(users) != 1 {
		t.Fatalf("runtime stage: want one USER, got %d", len(users))
	}
	for _, id := range strings.Split(users[0].args[0], ":") {
		if n, err := strconv.Atoi(id); err != nil || n == 0 {
			t.Errorf("runtime stage: USER %s: want numeric non-zero ids (Kubernetes' runAsNonRoot checks them)", users[0].args[0])
		}
	}
	eps := final.all("entrypoint")
	if len(eps) != 1 || !eps[0].json || !slices.Equal(eps[0].args, []string{binary}) {
		t.Errorf("runtime stage: want ENTRYPOINT [%q] in exec form, got %+v", binary, eps)
	}
	if ex := final.all("expose"); len(ex) != 1 || ex[0].args[0] != "9816" {
		t.Errorf("runtime stage: want EXPOSE 9816, got %+v", ex)
	}
}
