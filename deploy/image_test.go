package deploy

import (
	"archive/tar"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"helm.sh/helm/v3/pkg/chart/loader"

	"github.com/pg-liveness/pg_liveness_exporter/deploy/internal/image"
)

// testVersion stamps the test's binaries.
var testVersion = image.Version{Version: "v9.8.7-test", Revision: "0123456789abcdef", Branch: "test", BuildUser: "make-image", BuildDate: "20260101-00:00:00"}

// The image is built offline from the repository for every platform, twice from two
// builds of the binaries, with the same index digest. Read back from its OCI layout, the
// index holds one image per platform (linux/amd64, linux/arm64) and each image's SBOM
// attestation. Each image has one layer of exactly the expected files (root's, fixed
// modes and times), runs the binary as user 65532 with it as the entrypoint, carries the
// OCI labels, and its binary is static, stripped and built for its platform; this
// machine's answers --version with the stamped version. Each SBOM is an in-toto statement
// about its image's digest whose SPDX document lists the binary's Go modules. The
// docker-load tarball holds this machine's image.
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
	const licenses = "NOASSERTION"
	spec := func(n string, p v1.Platform) image.Spec {
		return image.Spec{Binary: filepath.Join(dir, "bin-"+n+"-"+p.Architecture), Platform: p, CACerts: image.DefaultCACerts, Created: created,
			Version: testVersion.Version, Revision: testVersion.Revision, Licenses: licenses}
	}
	build := func(n string) (map[string]v1.Image, v1.Hash) {
		t.Helper()
		var built []image.Built
		imgs := map[string]v1.Image{}
		for _, p := range image.Platforms {
			s := spec(n, p)
			if err := image.BuildBinary(ctx, "..", s.Binary, p.Architecture, testVersion); err != nil {
				t.Fatal(err)
			}
			img, err := image.Build(s)
			if err != nil {
				t.Fatal(err)
			}
			sbom, err := image.SBOM(s)
			if err != nil {
				t.Fatal(err)
			}
			built = append(built, image.Built{Platform: p, Image: img, SBOM: sbom})
			imgs[p.Architecture] = img
		}
		idx, err := image.Index(built, ref)
		if err != nil {
			t.Fatal(err)
		}
		digest, err := image.WriteLayout(filepath.Join(dir, "oci-"+n), idx, ref)
		if err != nil {
			t.Fatal(err)
		}
		return imgs, digest
	}
	imgs, first := build("a")
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
	m, err := back.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIImageIndex || len(m.Manifests) != 2*len(image.Platforms) {
		t.Fatalf("the index is %s with %d manifests, want an OCI image index of %d (an image and its SBOM per platform)", m.MediaType, len(m.Manifests), 2*len(image.Platforms))
	}
	images := map[v1.Hash]v1.Platform{}
	var sboms []v1.Descriptor
	for _, d := range m.Manifests {
		switch {
		case d.Platform == nil:
			t.Errorf("manifest %s has no platform", d.Digest)
		case d.Platform.OS == "unknown":
			sboms = append(sboms, d)
		default:
			images[d.Digest] = *d.Platform
		}
	}
	var platforms []string
	for digest, p := range images {
		platforms = append(platforms, p.OS+"/"+p.Architecture)
		t.Run(p.Architecture, func(t *testing.T) {
			img, err := back.Image(digest)
			if err != nil {
				t.Fatal(err)
			}
			checkPlatformImage(t, ctx, dir, img, p, created)
		})
	}
	slices.Sort(platforms)
	if want := []string{"linux/amd64", "linux/arm64"}; !slices.Equal(platforms, want) {
		t.Errorf("the index's platforms %v, want %v", platforms, want)
	}
	if len(sboms) != len(images) {
		t.Fatalf("%d SBOM attestations for %d images", len(sboms), len(images))
	}
	for _, d := range sboms {
		checkSBOM(t, back, d, images)
	}

	tarPath := filepath.Join(dir, "image.tar")
	local := imgs[runtime.GOARCH]
	if err := image.WriteTarball(tarPath, local, ref); err != nil {
		t.Fatal(err)
	}
	loaded, err := tarball.ImageFromPath(tarPath, &ref)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := configDigest(t, loaded), configDigest(t, local); a != b {
		t.Errorf("the docker-load tarball holds config %s, the layout %s", a, b)
	}

	// Another time is another image: the digest is a function of the inputs.
	s := spec("a", image.Platforms[0])
	s.Created = created.Add(time.Second)
	other, err := image.Build(s)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := other.Digest(); d == mustDigest(t, imgs[image.Platforms[0].Architecture]) {
		t.Error("another creation time gives the same digest: the digest ignores an input")
	}
}

func mustDigest(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// elfMachines are the ELF machines of the platforms' binaries.
var elfMachines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// checkPlatformImage checks one platform's image: its config, labels and layer, and its
// binary (static, stripped, of the platform's machine; run when it is this machine's).
func checkPlatformImage(t *testing.T, ctx context.Context, dir string, img v1.Image, p v1.Platform, created time.Time) {
	t.Helper()
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Config.User != "65532:65532" || !slices.Equal(cfg.Config.Entrypoint, []string{"/pg_liveness_exporter"}) || len(cfg.Config.Cmd) != 0 ||
		cfg.OS != p.OS || cfg.Architecture != p.Architecture || cfg.Variant != p.Variant || !cfg.Created.Equal(created) {
		t.Errorf("config: user %q, entrypoint %q, cmd %q, platform %s/%s/%s, created %s", cfg.Config.User, cfg.Config.Entrypoint, cfg.Config.Cmd,
			cfg.OS, cfg.Architecture, cfg.Variant, cfg.Created)
	}
	if _, ok := cfg.Config.ExposedPorts["9816/tcp"]; !ok {
		t.Errorf("config: ports %v", cfg.Config.ExposedPorts)
	}
	for label, want := range map[string]string{
		"org.opencontainers.image.title":       "pg_liveness_exporter",
		"org.opencontainers.image.description": image.Description,
		"org.opencontainers.image.licenses":    "NOASSERTION",
		"org.opencontainers.image.source":      image.Source,
		"org.opencontainers.image.version":     testVersion.Version,
		"org.opencontainers.image.revision":    testVersion.Revision,
		"org.opencontainers.image.created":     created.Format(time.RFC3339),
	} {
		if got := cfg.Config.Labels[label]; got != want {
			t.Errorf("label %s = %q, want %q", label, got, want)
		}
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var names []string
	binary := filepath.Join(dir, "extracted-"+p.Architecture)
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
	defer e.Close()
	if e.Machine != elfMachines[p.Architecture] {
		t.Errorf("the binary is for %s, want %s", e.Machine, elfMachines[p.Architecture])
	}
	for _, prog := range e.Progs {
		if prog.Type == elf.PT_INTERP {
			t.Error("the binary has an ELF interpreter: it is not static (CGO_ENABLED=0)")
		}
	}
	for _, sec := range e.Sections {
		if sec.Name == ".symtab" || strings.HasPrefix(sec.Name, ".debug_") || strings.HasPrefix(sec.Name, ".zdebug_") {
			t.Errorf("the binary has a %s section: it is not stripped (-ldflags \"-s -w\")", sec.Name)
		}
	}
	if p.Architecture != runtime.GOARCH {
		return
	}
	out, err := exec.CommandContext(ctx, binary, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "version "+testVersion.Version) || !strings.Contains(string(out), testVersion.Revision) {
		t.Errorf("the image's binary --version: %v\n%s", err, out)
	}
}

// checkSBOM checks an SBOM attestation of the index: BuildKit's annotations naming an
// image of the index, one in-toto layer whose statement names that image's digest, and an
// SPDX 2.3 document that describes the exporter and lists its modules (pgx, at the
// version the root module requires) and Go.
func checkSBOM(t *testing.T, idx v1.ImageIndex, d v1.Descriptor, images map[v1.Hash]v1.Platform) {
	t.Helper()
	if d.Annotations[image.AttestationReferenceType] != image.AttestationManifest {
		t.Errorf("attestation %s: annotations %v", d.Digest, d.Annotations)
	}
	subject, err := v1.NewHash(d.Annotations[image.AttestationReferenceDigest])
	if _, ok := images[subject]; err != nil || !ok {
		t.Fatalf("attestation %s names %q, no image of the index", d.Digest, d.Annotations[image.AttestationReferenceDigest])
	}
	att, err := idx.Image(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := att.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("attestation %s: %d layers (%v), want 1", d.Digest, len(layers), err)
	}
	if mt, _ := layers[0].MediaType(); mt != image.InTotoMediaType {
		t.Errorf("attestation %s: layer of media type %s, want %s", d.Digest, mt, image.InTotoMediaType)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var stmt struct {
		PredicateType string `json:"predicateType"`
		Subject       []struct {
			Digest map[string]string `json:"digest"`
		} `json:"subject"`
		Predicate struct {
			SPDXVersion string `json:"spdxVersion"`
			Packages    []struct {
				Name    string `json:"name"`
				Version string `json:"versionInfo"`
				License string `json:"licenseDeclared"`
			} `json:"packages"`
		} `json:"predicate"`
	}
	if err := json.NewDecoder(rc).Decode(&stmt); err != nil {
		t.Fatal(err)
	}
	if stmt.PredicateType != image.SPDXPredicateType || len(stmt.Subject) != 1 || stmt.Subject[0].Digest["sha256"] != subject.Hex ||
		stmt.Predicate.SPDXVersion != "SPDX-2.3" {
		t.Errorf("attestation %s: predicate %s about %v, %s", d.Digest, stmt.PredicateType, stmt.Subject, stmt.Predicate.SPDXVersion)
	}
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	pgx := regexp.MustCompile(`(?m)^\s+github\.com/jackc/pgx/v5 (v\S+)`).FindSubmatch(gomod)
	found := map[string]string{}
	for _, p := range stmt.Predicate.Packages {
		found[p.Name] = p.Version
	}
	if pgx == nil || found["github.com/jackc/pgx/v5"] != string(pgx[1]) || found["github.com/pg-liveness/pg_liveness_exporter"] != testVersion.Version ||
		!strings.HasPrefix(found["stdlib"], "go1.") {
		t.Errorf("attestation %s: the SBOM lists %d packages, without the exporter at %s, pgx at the go.mod's version or Go: %v",
			d.Digest, len(found), testVersion.Version, found)
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
