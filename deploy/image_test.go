package deploy

import (
	"archive/tar"
	"context"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"helm.sh/helm/v3/pkg/chart/loader"

	"github.com/pg-liveness/pg_liveness_exporter/deploy/internal/image"
)

// testVersion stamps the test's binaries.
var testVersion = image.Version{Version: "v9.8.7-test", Revision: "0123456789abcdef", Branch: "test", BuildUser: "make-image", BuildDate: "20260101-00:00:00"}

// The image is built offline from the repository, twice from two builds of the binary,
// with the same digest; read back from its OCI layout it has one layer of exactly the
// expected files (root's, fixed modes and times), runs the binary as user 65532 with it as
// the entrypoint, and that binary is static and answers --version with the stamped
// version. The docker-load tarball holds the same image.
func TestImageIsReproducibleAndRuns(t *testing.T) {
	if _, err := os.Stat(image.DefaultCACerts); err != nil {
		t.Fatalf("%v: install Debian's ca-certificates (scripts/install-deps.sh test)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dir := t.TempDir()
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ref, err := name.NewTag(image.DefaultRepository + ":" + testVersion.Version)
	if err != nil {
		t.Fatal(err)
	}
	build := func(n string) (v1.Image, v1.Hash) {
		t.Helper()
		bin := filepath.Join(dir, "bin-"+n)
		if err := image.BuildBinary(ctx, "..", bin, testVersion); err != nil {
			t.Fatal(err)
		}
		img, err := image.Build(image.Spec{Binary: bin, CACerts: image.DefaultCACerts, Created: created, Version: testVersion.Version, Revision: testVersion.Revision})
		if err != nil {
			t.Fatal(err)
		}
		digest, err := image.WriteLayout(filepath.Join(dir, "oci-"+n), img, ref)
		if err != nil {
			t.Fatal(err)
		}
		return img, digest
	}
	img, first := build("a")
	_, second := build("b")
	if first != second {
		t.Fatalf("two builds of the same inputs: %s and %s; the image is not reproducible", first, second)
	}

	back, refName, err := image.ReadLayout(filepath.Join(dir, "oci-a"))
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := back.Digest(); d != first || refName != testVersion.Version {
		t.Errorf("the layout holds %s tagged %q, want %s tagged %q", d, refName, first, testVersion.Version)
	}
	cfg, err := back.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Config.User != "65532:65532" || !slices.Equal(cfg.Config.Entrypoint, []string{"/pg_liveness_exporter"}) || len(cfg.Config.Cmd) != 0 ||
		cfg.OS != "linux" || !cfg.Created.Equal(created) {
		t.Errorf("config: user %q, entrypoint %q, cmd %q, os %s, created %s", cfg.Config.User, cfg.Config.Entrypoint, cfg.Config.Cmd, cfg.OS, cfg.Created)
	}
	if _, ok := cfg.Config.ExposedPorts["9816/tcp"]; !ok || cfg.Config.Labels["org.opencontainers.image.version"] != testVersion.Version {
		t.Errorf("config: ports %v, labels %v", cfg.Config.ExposedPorts, cfg.Config.Labels)
	}
	layers, err := back.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var names []string
	binary := filepath.Join(dir, "extracted")
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if !h.ModTime.Equal(created) {
			t.Errorf("%s: mtime %s, want the commit's %s", h.Name, h.ModTime, created)
		}
		if owner := h.Uid; owner != 0 && h.Name != "home/nonroot/" {
			t.Errorf("%s: owner %d, want root: the user must not be able to change the image's files", h.Name, owner)
		}
		if h.Name == "pg_liveness_exporter" {
			if h.Mode != 0o755 {
				t.Errorf("the binary's mode %#o, want 0755", h.Mode)
			}
			f, err := os.OpenFile(binary, os.O_CREATE|os.O_WRONLY, 0o755)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
	}
	want := []string{"etc/", "etc/group", "etc/passwd", "etc/ssl/", "etc/ssl/certs/", "etc/ssl/certs/ca-certificates.crt", "home/", "home/nonroot/", "pg_liveness_exporter"}
	if !slices.Equal(names, want) {
		t.Errorf("the layer holds %q, want %q", names, want)
	}
	e, err := elf.Open(binary)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range e.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary has an ELF interpreter: it is not static (CGO_ENABLED=0)")
		}
	}
	e.Close()
	out, err := exec.CommandContext(ctx, binary, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "version "+testVersion.Version) || !strings.Contains(string(out), testVersion.Revision) {
		t.Errorf("the image's binary --version: %v\n%s", err, out)
	}

	tarPath := filepath.Join(dir, "image.tar")
	if err := image.WriteTarball(tarPath, img, ref); err != nil {
		t.Fatal(err)
	}
	loaded, err := tarball.ImageFromPath(tarPath, &ref)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := configDigest(t, loaded), configDigest(t, back); a != b {
		t.Errorf("the docker-load tarball holds config %s, the layout %s", a, b)
	}

	// Another time is another image: the digest is a function of the inputs.
	other, err := image.Build(image.Spec{Binary: filepath.Join(dir, "bin-a"), CACerts: image.DefaultCACerts, Created: created.Add(time.Second), Version: testVersion.Version})
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := other.Digest(); d == first {
		t.Error("another creation time gives the same digest: the digest ignores an input")
	}
}

func configDigest(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	h, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// The chart's default image is the one a release builds and pushes: make image's
// repository, tagged with the chart's appVersion (a release tag, v-prefixed, as git
// describe names it).
func TestChartDefaultsToTheReleasedImage(t *testing.T) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	app := ch.Metadata.AppVersion
	if !strings.HasPrefix(app, "v") || strings.Count(app, ".") != 2 {
		t.Errorf("appVersion %q: want the release tag, vMAJOR.MINOR.PATCH", app)
	}
	repo, _ := lookup(ch.Values, "image.repository")
	tag, _ := lookup(ch.Values, "image.tag")
	if repo != image.DefaultRepository || tag != app {
		t.Errorf("image.repository %v, image.tag %q: want %s and the appVersion %s", repo, tag, image.DefaultRepository, app)
	}
	r, err := helmTemplate(chartDir, "pg-liveness-exporter", "pg-liveness", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.deployments[0].Spec.Template.Spec.Containers[0].Image; got != image.DefaultRepository+":"+app {
		t.Errorf("the chart runs %s, want %s:%s", got, image.DefaultRepository, app)
	}
	b, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "IMAGE_REPOSITORY ?= "+image.DefaultRepository+"\n") {
		t.Errorf("make image does not push to %s", image.DefaultRepository)
	}
}
