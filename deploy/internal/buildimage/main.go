// Command buildimage builds the exporter's multi-platform OCI image without a container
// engine (package image): it builds the static, stripped binary of each platform from the
// repository, writes the image index (each platform's image and its SBOM attestation) as
// an OCI image layout, each SBOM as a file, and this machine's platform's image as a
// tarball for docker load, and prints the reference and digest. make image runs it;
// README: Container image says how to push it, and the release workflow does.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/pg-liveness/pg_liveness_exporter/deploy/internal/image"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "buildimage:", err)
		os.Exit(1)
	}
}

func run() error {
	root := flag.String("root", "..", "the repository's root, whose module is built")
	out := flag.String("out", "image", "the folder to write (removed first): oci/ (an OCI image layout), sbom/ (each platform's SPDX JSON) and image.tar (this machine's platform, for docker load)")
	repository := flag.String("repository", image.DefaultRepository, "the image's repository")
	tag := flag.String("tag", "", "the image's tag: the version (git describe), as the chart's appVersion for a release")
	var v image.Version
	flag.StringVar(&v.Version, "version", "", "the version stamped into the binary")
	flag.StringVar(&v.Revision, "revision", "", "the commit")
	flag.StringVar(&v.Branch, "branch", "", "the branch")
	epoch := flag.String("source-date-epoch", "", "the commit's time in seconds (git log -1 --format=%ct): the image's and its files' time, and the binary's build date")
	caCerts := flag.String("ca-certificates", image.DefaultCACerts, "the PEM bundle put at "+image.CACertPath+" (\"\" for none)")
	var defaults []string
	for _, p := range image.Platforms {
		defaults = append(defaults, p.OS+"/"+p.Architecture)
	}
	platforms := flag.String("platforms", strings.Join(defaults, ","), "the platforms to build, comma-separated, of "+strings.Join(defaults, ", "))
	licenses := flag.String("licenses", "", "the org.opencontainers.image.licenses label and the SBOM's declared license: an SPDX license expression (\"\" is NOASSERTION)")
	flag.Parse()
	var chosen []v1.Platform
	for _, want := range strings.Split(*platforms, ",") {
		i := slices.IndexFunc(image.Platforms, func(p v1.Platform) bool { return p.OS+"/"+p.Architecture == strings.TrimSpace(want) })
		if i < 0 {
			return fmt.Errorf("-platforms: %q is not one of %s", want, strings.Join(defaults, ", "))
		}
		chosen = append(chosen, image.Platforms[i])
	}
	secs, err := strconv.ParseInt(*epoch, 10, 64)
	if err != nil {
		return fmt.Errorf("-source-date-epoch %q: not a number of seconds", *epoch)
	}
	created := time.Unix(secs, 0).UTC()
	v.BuildDate = created.Format("20060102-15:04:05")
	v.BuildUser = "make-image" // not the builder's user@host: the same commit builds the same image anywhere
	ref, err := name.NewTag(*repository + ":" + *tag)
	if err != nil {
		return fmt.Errorf("-repository and -tag: %w", err)
	}
	if err := os.RemoveAll(*out); err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if err := os.MkdirAll(filepath.Join(*out, "sbom"), 0o755); err != nil {
		return err
	}
	var built []image.Built
	var local v1.Image // this machine's platform's, for docker load
	for _, p := range chosen {
		binary := filepath.Join(*out, "bin", p.OS+"-"+p.Architecture, "pg_liveness_exporter")
		if err := image.BuildBinary(ctx, *root, binary, p.Architecture, v); err != nil {
			return err
		}
		spec := image.Spec{Binary: binary, Platform: p, CACerts: *caCerts, Created: created, Version: v.Version, Revision: v.Revision, Licenses: *licenses}
		img, err := image.Build(spec)
		if err != nil {
			return err
		}
		sbom, err := image.SBOM(spec)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(*out, "sbom", "pg_liveness_exporter-"+p.OS+"-"+p.Architecture+".spdx.json"), sbom, 0o644); err != nil {
			return err
		}
		built = append(built, image.Built{Platform: p, Image: img, SBOM: sbom})
		if p.Architecture == runtime.GOARCH {
			local = img
		}
	}
	idx, err := image.Index(built, ref)
	if err != nil {
		return err
	}
	digest, err := image.WriteLayout(filepath.Join(*out, "oci"), idx, ref)
	if err != nil {
		return err
	}
	if local != nil {
		if err := image.WriteTarball(filepath.Join(*out, "image.tar"), local, ref); err != nil {
			return err
		}
	}
	fmt.Printf("%s\n%s@%s\n", ref.Name(), ref.Context().Name(), digest)
	return nil
}
