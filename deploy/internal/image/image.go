// Package image builds the exporter's OCI image without a container engine: the static
// binary (CGO_ENABLED=0, -trimpath), a passwd and group naming the non-root user, and the
// CA certificates for sslmode=verify-full, in one layer, with the binary as the
// entrypoint and user 65532 (distroless' nonroot, the user the manifests and the chart
// run as). It is reproducible: the same binary, certificates and time give the same
// digest (fixed file order, owners, modes and times; the commit's time, not the clock's),
// and the binary is built with fixed flags from the commit, so the same commit gives the
// same binary with the same Go.
//
// The image is written as an OCI image layout (a folder that crane, skopeo and oras push
// as it is) and as a tarball that docker load and podman load read.
package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// DefaultRepository is where a release's image is pushed; the chart's image.repository.
const DefaultRepository = "ghcr.io/pg-liveness/pg_liveness_exporter"

// The image's fixed contents.
const (
	Binary     = "/pg_liveness_exporter"
	User       = "65532:65532" // distroless' nonroot
	Port       = "9816/tcp"
	CACertPath = "/etc/ssl/certs/ca-certificates.crt"
	// DefaultCACerts is Debian's bundle (the ca-certificates package).
	DefaultCACerts = "/etc/ssl/certs/ca-certificates.crt"
)

// Version is what the binary is stamped with (github.com/prometheus/common/version), as
// the Makefile's LDFLAGS stamp it.
type Version struct {
	Version, Revision, Branch, BuildUser, BuildDate string
}

// BuildBinary builds the exporter in the module at root into out: static (CGO_ENABLED=0),
// with -trimpath and without VCS stamping, for linux on this machine's architecture, with
// v in its version package. The same source, Go and v give the same bytes.
func BuildBinary(ctx context.Context, root, out string, v Version) error {
	const pkg = "github.com/prometheus/common/version"
	ldflags := fmt.Sprintf("-X %[1]s.Version=%[2]s -X %[1]s.Revision=%[3]s -X %[1]s.Branch=%[4]s -X %[1]s.BuildUser=%[5]s -X %[1]s.BuildDate=%[6]s",
		pkg, v.Version, v.Revision, v.Branch, v.BuildUser, v.BuildDate)
	for _, f := range []string{v.Version, v.Revision, v.Branch, v.BuildUser, v.BuildDate} {
		if f == "" || strings.ContainsAny(f, " \t\n'\"") {
			return fmt.Errorf("version fields must be non-empty single words, got %q", f)
		}
	}
	cmd := exec.CommandContext(ctx, goCommand(), "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", out, ".")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH, "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, b)
	}
	return nil
}

// goCommand is the go command on PATH, else Debian's and the tarball's usual place.
func goCommand() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

// Spec is what an image is built from.
type Spec struct {
	Binary  string    // the static binary to run
	CACerts string    // a PEM bundle for CACertPath; "" for none
	Created time.Time // the image's and its files' time: the commit's, for reproducibility
	// Labels' values (org.opencontainers.image.version, .revision, .source).
	Version, Revision string
}

// file is one entry of the layer.
type file struct {
	name string
	mode int64
	body []byte // nil for a folder
}

// Build returns the image. Everything in it is a function of the spec.
func Build(s Spec) (v1.Image, error) {
	bin, err := os.ReadFile(s.Binary)
	if err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(bin, []byte("\x7fELF")) {
		return nil, fmt.Errorf("%s is not an ELF binary", s.Binary)
	}
	files := []file{
		{name: "etc/", mode: 0o755},
		{name: "etc/group", mode: 0o644, body: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{name: "etc/passwd", mode: 0o644, body: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
	}
	if s.CACerts != "" {
		pem, err := os.ReadFile(s.CACerts)
		if err != nil {
			return nil, fmt.Errorf("the CA certificates: %w (install Debian's ca-certificates, or pass none)", err)
		}
		if !bytes.Contains(pem, []byte("-----BEGIN CERTIFICATE-----")) {
			return nil, fmt.Errorf("%s holds no PEM certificate", s.CACerts)
		}
		files = append(files, file{name: "etc/ssl/", mode: 0o755}, file{name: "etc/ssl/certs/", mode: 0o755},
			file{name: strings.TrimPrefix(CACertPath, "/"), mode: 0o644, body: pem})
	}
	files = append(files, file{name: "home/", mode: 0o755}, file{name: "home/nonroot/", mode: 0o700},
		file{name: strings.TrimPrefix(Binary, "/"), mode: 0o755, body: bin})
	created := s.Created.UTC().Truncate(time.Second)
	var tarBuf bytes.Buffer
	tw := tar.NewWriter(&tarBuf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, ModTime: created, Format: tar.FormatPAX, Typeflag: tar.TypeReg, Size: int64(len(f.body))}
		if f.body == nil {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if f.name == "home/nonroot/" {
			h.Uid, h.Gid = 65532, 65532
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	tarBytes := tarBuf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(tarBytes)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: created}, CreatedBy: "pg_liveness_exporter image builder (deploy/internal/image)",
	}})
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS, cfg.Created = runtime.GOARCH, "linux", v1.Time{Time: created}
	cfg.Config = v1.Config{
		User:         User,
		Entrypoint:   []string{Binary},
		ExposedPorts: map[string]struct{}{Port: {}},
		Env:          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Labels: map[string]string{
			"org.opencontainers.image.title":    "pg_liveness_exporter",
			"org.opencontainers.image.source":   "https://github.com/pg-liveness/pg_liveness_exporter",
			"org.opencontainers.image.version":  s.Version,
			"org.opencontainers.image.revision": s.Revision,
			"org.opencontainers.image.created":  created.Format(time.RFC3339),
		},
	}
	return mutate.ConfigFile(img, cfg)
}

// WriteLayout writes img into a new OCI image layout at dir (which must not exist yet, or
// be empty), tagged ref (its org.opencontainers.image.ref.name is ref's tag), and returns
// its digest: the manifest's, the digest it has in any registry it is pushed to from the
// layout.
func WriteLayout(dir string, img v1.Image, ref name.Tag) (v1.Hash, error) {
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return v1.Hash{}, fmt.Errorf("%s is not empty; remove it first", dir)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return v1.Hash{}, err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": ref.TagStr(),
		"io.containerd.image.name":          ref.Name(),
	})); err != nil {
		return v1.Hash{}, err
	}
	return img.Digest()
}

// WriteTarball writes img as a tarball that docker load and podman load read, tagged ref.
func WriteTarball(path string, img v1.Image, ref name.Tag) error {
	return tarball.WriteToFile(path, ref, img)
}

// ReadLayout returns the one image of the OCI image layout at dir, and its ref name.
func ReadLayout(dir string) (v1.Image, string, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, "", err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, "", err
	}
	if len(m.Manifests) != 1 {
		return nil, "", fmt.Errorf("%s holds %d manifests, want 1", dir, len(m.Manifests))
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	return img, m.Manifests[0].Annotations["org.opencontainers.image.ref.name"], err
}
