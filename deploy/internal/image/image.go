// Package image builds the exporter's OCI image without a container engine: for each
// platform (Platforms: linux/amd64 and linux/arm64), the static, stripped binary
// (CGO_ENABLED=0, -trimpath, -ldflags "-s -w"), a passwd and group naming the non-root
// user, and the CA certificates for sslmode=verify-full, in one layer, with the binary as
// the entrypoint and user 65532 (distroless' nonroot, the user the manifests and the
// chart run as), labelled with the OCI annotations (title, description, licenses, source,
// version, revision, created). The platforms' images are one image index, beside an SPDX
// SBOM of each binary (its Go modules, read from the binary's build information) as an
// in-toto attestation the way BuildKit attaches one (a manifest of platform
// unknown/unknown that names its image), which docker buildx imagetools and registries
// read as the image's SBOM.
//
// It is reproducible: the same binaries, certificates and time give the same digest
// (fixed file order, owners, modes and times; the commit's time, not the clock's), and
// the binaries are built with fixed flags from the commit, so the same commit gives the
// same binaries with the same Go.
//
// The index is written as an OCI image layout (a folder that crane, skopeo and oras push
// as it is), and the image of this machine's platform as a tarball that docker load and
// podman load read.
package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
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
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// DefaultRepository is where a release's image is pushed; the chart's image.repository.
const DefaultRepository = "ghcr.io/pg-liveness/pg_liveness_exporter"

// Platforms are the image's: the nodes' architectures it runs on.
var Platforms = []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64", Variant: "v8"}}

// Description is the image's org.opencontainers.image.description.
const Description = "Prometheus exporter and node agent for services that coordinate through PostgreSQL: liveness, leases and advisory locks."

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
// stripped of its symbol table and DWARF (-s -w: half the size; panics still print their
// stack traces), with -trimpath and without VCS stamping, for linux on arch (GOARCH),
// with v in its version package. The same source, Go and v give the same bytes.
func BuildBinary(ctx context.Context, root, out, arch string, v Version) error {
	const pkg = "github.com/prometheus/common/version"
	ldflags := fmt.Sprintf("-s -w -X %[1]s.Version=%[2]s -X %[1]s.Revision=%[3]s -X %[1]s.Branch=%[4]s -X %[1]s.BuildUser=%[5]s -X %[1]s.BuildDate=%[6]s",
		pkg, v.Version, v.Revision, v.Branch, v.BuildUser, v.BuildDate)
	if arch == "" || strings.ContainsAny(arch, " /") {
		return fmt.Errorf("arch %q: want a GOARCH such as amd64 or arm64", arch)
	}
	for _, f := range []string{v.Version, v.Revision, v.Branch, v.BuildUser, v.BuildDate} {
		if f == "" || strings.ContainsAny(f, " \t\n'\"") {
			return fmt.Errorf("version fields must be non-empty single words, got %q", f)
		}
	}
	cmd := exec.CommandContext(ctx, goCommand(), "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", out, ".")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOFLAGS=")
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
	Binary   string      // the static binary to run, built for Platform
	Platform v1.Platform // the binary's; the zero value is this machine's linux platform
	CACerts  string      // a PEM bundle for CACertPath; "" for none
	Created  time.Time   // the image's and its files' time: the commit's, for reproducibility
	// Labels' values (org.opencontainers.image.version, .revision, .licenses: an SPDX
	// license expression, NOASSERTION when none is declared).
	Version, Revision, Licenses string
}

// platform is the spec's platform, this machine's linux one when unset.
func (s Spec) platform() v1.Platform {
	if s.Platform.Architecture != "" {
		return s.Platform
	}
	for _, p := range Platforms {
		if p.Architecture == runtime.GOARCH {
			return p
		}
	}
	return v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
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
	p := s.platform()
	cfg.Architecture, cfg.OS, cfg.Variant, cfg.Created = p.Architecture, p.OS, p.Variant, v1.Time{Time: created}
	cfg.Config = v1.Config{
		User:         User,
		Entrypoint:   []string{Binary},
		ExposedPorts: map[string]struct{}{Port: {}},
		Env:          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "pg_liveness_exporter",
			"org.opencontainers.image.description": Description,
			"org.opencontainers.image.licenses":    licenses(s.Licenses),
			"org.opencontainers.image.source":      Source,
			"org.opencontainers.image.url":         Source,
			"org.opencontainers.image.version":     s.Version,
			"org.opencontainers.image.revision":    s.Revision,
			"org.opencontainers.image.created":     created.Format(time.RFC3339),
		},
	}
	return mutate.ConfigFile(img, cfg)
}

// Source is the project's repository, the images' org.opencontainers.image.source.
const Source = "https://github.com/pg-liveness/pg_liveness_exporter"

// licenses is the licenses label's value: the SPDX expression given, NOASSERTION (SPDX's
// word for "not declared") without one.
func licenses(l string) string {
	if strings.TrimSpace(l) == "" {
		return "NOASSERTION"
	}
	return l
}

// Built is one platform's image of an index, with its SBOM.
type Built struct {
	Platform v1.Platform
	Image    v1.Image
	SBOM     []byte // the SPDX document (JSON) of its binary
}

// SBOM returns the SPDX 2.3 document (JSON) of the spec's binary: the exporter's module
// and every module and Go toolchain it was built with, as the binary's build information
// (debug/buildinfo) records them, each with its purl. Everything in it is a function of
// the spec, its time the commit's.
func SBOM(s Spec) ([]byte, error) {
	bi, err := buildinfo.ReadFile(s.Binary)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Binary, err)
	}
	bin, err := os.ReadFile(s.Binary)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(bin)
	p := s.platform()
	type ref struct {
		Category string `json:"referenceCategory"`
		Type     string `json:"referenceType"`
		Locator  string `json:"referenceLocator"`
	}
	type checksum struct {
		Algorithm string `json:"algorithm"`
		Value     string `json:"checksumValue"`
	}
	type pkg struct {
		ID               string     `json:"SPDXID"`
		Name             string     `json:"name"`
		Version          string     `json:"versionInfo"`
		Supplier         string     `json:"supplier,omitempty"`
		Download         string     `json:"downloadLocation"`
		FilesAnalyzed    bool       `json:"filesAnalyzed"`
		LicenseConcluded string     `json:"licenseConcluded"`
		LicenseDeclared  string     `json:"licenseDeclared"`
		Copyright        string     `json:"copyrightText"`
		Checksums        []checksum `json:"checksums,omitempty"`
		Refs             []ref      `json:"externalRefs,omitempty"`
	}
	type rel struct {
		Element string `json:"spdxElementId"`
		Type    string `json:"relationshipType"`
		Related string `json:"relatedSpdxElement"`
	}
	purl := func(path, version string) ref {
		return ref{"PACKAGE-MANAGER", "purl", "pkg:golang/" + path + "@" + url.PathEscape(version)}
	}
	spdxID := func(i int) string { return fmt.Sprintf("SPDXRef-Package-%d", i) }
	main := pkg{ID: "SPDXRef-Package-0", Name: bi.Main.Path, Version: s.Version, Download: Source, LicenseConcluded: "NOASSERTION",
		LicenseDeclared: licenses(s.Licenses), Copyright: "NOASSERTION",
		Checksums: []checksum{{"SHA256", hex.EncodeToString(sum[:])}},
		Refs:      []ref{purl(bi.Main.Path, s.Version)}}
	pkgs := []pkg{main, {ID: spdxID(1), Name: "stdlib", Version: bi.GoVersion, Download: "https://go.dev/dl/", LicenseConcluded: "NOASSERTION",
		LicenseDeclared: "BSD-3-Clause", Copyright: "NOASSERTION", Refs: []ref{purl("stdlib", bi.GoVersion)}}}
	rels := []rel{{"SPDXRef-DOCUMENT", "DESCRIBES", main.ID}, {main.ID, "DEPENDS_ON", spdxID(1)}}
	for _, d := range bi.Deps {
		m := d
		if d.Replace != nil {
			m = d.Replace
		}
		if strings.HasPrefix(m.Path, ".") || m.Version == "(devel)" || m.Version == "" { // a local replace: the exporter itself
			continue
		}
		id := spdxID(len(pkgs))
		pkgs = append(pkgs, pkg{ID: id, Name: m.Path, Version: m.Version, Download: "https://proxy.golang.org/" + m.Path + "/@v/" + m.Version + ".zip",
			LicenseConcluded: "NOASSERTION", LicenseDeclared: "NOASSERTION", Copyright: "NOASSERTION", Refs: []ref{purl(m.Path, m.Version)}})
		rels = append(rels, rel{main.ID, "DEPENDS_ON", id})
	}
	doc := map[string]any{
		"spdxVersion":       "SPDX-2.3",
		"dataLicense":       "CC0-1.0",
		"SPDXID":            "SPDXRef-DOCUMENT",
		"name":              "pg_liveness_exporter " + s.Version + " " + p.OS + "/" + p.Architecture,
		"documentNamespace": Source + "/spdx/" + url.PathEscape(s.Version) + "/" + p.OS + "-" + p.Architecture + "/" + hex.EncodeToString(sum[:]),
		"creationInfo": map[string]any{
			"created":  s.Created.UTC().Truncate(time.Second).Format(time.RFC3339),
			"creators": []string{"Tool: pg_liveness_exporter-image-builder (deploy/internal/image)"},
		},
		"packages":      pkgs,
		"relationships": rels,
	}
	return json.MarshalIndent(doc, "", "  ")
}

// In-toto's and BuildKit's names for an SBOM attestation.
const (
	InTotoMediaType     = "application/vnd.in-toto+json"
	SPDXPredicateType   = "https://spdx.dev/Document"
	inTotoStatementType = "https://in-toto.io/Statement/v0.1"
	// The index annotations BuildKit gives an attestation manifest.
	AttestationReferenceType   = "vnd.docker.reference.type"
	AttestationReferenceDigest = "vnd.docker.reference.digest"
	AttestationManifest        = "attestation-manifest"
)

// attestation returns the SBOM of an image as BuildKit attaches one: an image manifest
// whose one layer is an in-toto statement about the image (by its digest) with the SPDX
// document as its predicate.
func attestation(img v1.Image, sbom []byte, ref name.Tag, p v1.Platform) (v1.Image, error) {
	digest, err := img.Digest()
	if err != nil {
		return nil, err
	}
	platform := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		platform += "/" + p.Variant
	}
	stmt, err := json.Marshal(map[string]any{
		"_type":         inTotoStatementType,
		"predicateType": SPDXPredicateType,
		"subject": []map[string]any{{
			"name":   "pkg:docker/" + ref.Context().Name() + "@" + ref.TagStr() + "?platform=" + url.QueryEscape(platform),
			"digest": map[string]string{digest.Algorithm: digest.Hex},
		}},
		"predicate": json.RawMessage(sbom),
	})
	if err != nil {
		return nil, err
	}
	att := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	att = mutate.ConfigMediaType(att, types.OCIConfigJSON)
	att, err = mutate.Append(att, mutate.Addendum{
		Layer:       static.NewLayer(stmt, InTotoMediaType),
		Annotations: map[string]string{"in-toto.io/predicate-type": SPDXPredicateType},
	})
	if err != nil {
		return nil, err
	}
	cfg, err := att.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS, cfg.History = "unknown", "unknown", nil
	return mutate.ConfigFile(att, cfg)
}

// Index returns the image index of the built platforms' images, each followed by its SBOM
// attestation (platform unknown/unknown, annotated with the image's digest), for ref.
func Index(built []Built, ref name.Tag) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var adds []mutate.IndexAddendum
	for _, b := range built {
		p := b.Platform
		digest, err := b.Image.Digest()
		if err != nil {
			return nil, err
		}
		att, err := attestation(b.Image, b.SBOM, ref, p)
		if err != nil {
			return nil, err
		}
		adds = append(adds,
			mutate.IndexAddendum{Add: b.Image, Descriptor: v1.Descriptor{MediaType: types.OCIManifestSchema1, Platform: &p}},
			mutate.IndexAddendum{Add: att, Descriptor: v1.Descriptor{MediaType: types.OCIManifestSchema1,
				Platform: &v1.Platform{OS: "unknown", Architecture: "unknown"},
				Annotations: map[string]string{
					AttestationReferenceDigest: digest.String(),
					AttestationReferenceType:   AttestationManifest,
				}}})
	}
	return mutate.AppendManifests(idx, adds...), nil
}

// WriteLayout writes the image index idx into a new OCI image layout at dir (which must
// not exist yet, or be empty), tagged ref (its org.opencontainers.image.ref.name is ref's
// tag), and returns its digest: the index's, the digest it has in any registry it is
// pushed to from the layout.
func WriteLayout(dir string, idx v1.ImageIndex, ref name.Tag) (v1.Hash, error) {
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return v1.Hash{}, fmt.Errorf("%s is not empty; remove it first", dir)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return v1.Hash{}, err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": ref.TagStr(),
		"io.containerd.image.name":          ref.Name(),
	})); err != nil {
		return v1.Hash{}, err
	}
	return idx.Digest()
}

// WriteTarball writes img as a tarball that docker load and podman load read, tagged ref.
func WriteTarball(path string, img v1.Image, ref name.Tag) error {
	return tarball.WriteToFile(path, ref, img)
}

// ReadLayout returns the one image index of the OCI image layout at dir, and its ref name.
func ReadLayout(dir string) (v1.ImageIndex, string, error) {
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
	inner, err := idx.ImageIndex(m.Manifests[0].Digest)
	return inner, m.Manifests[0].Annotations["org.opencontainers.image.ref.name"], err
}
