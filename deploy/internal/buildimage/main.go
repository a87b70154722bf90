// Command buildimage builds the exporter's OCI image without a container engine (package
// image): it builds the static binary from the repository, writes the image as an OCI
// image layout and as a tarball for docker load, and prints the reference and digest.
// make image runs it; README: Container image says how to push it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

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
	out := flag.String("out", "image", "the folder to write (removed first): oci/ (an OCI image layout) and image.tar (for docker load)")
	repository := flag.String("repository", image.DefaultRepository, "the image's repository")
	tag := flag.String("tag", "", "the image's tag: the version (git describe), as the chart's appVersion for a release")
	var v image.Version
	flag.StringVar(&v.Version, "version", "", "the version stamped into the binary")
	flag.StringVar(&v.Revision, "revision", "", "the commit")
	flag.StringVar(&v.Branch, "branch", "", "the branch")
	epoch := flag.String("source-date-epoch", "", "the commit's time in seconds (git log -1 --format=%ct): the image's and its files' time, and the binary's build date")
	caCerts := flag.String("ca-certificates", image.DefaultCACerts, "the PEM bundle put at "+image.CACertPath+" (\"\" for none)")
	flag.Parse()
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
	binary := filepath.Join(*out, "pg_liveness_exporter")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if err := image.BuildBinary(ctx, *root, binary, v); err != nil {
		return err
	}
	img, err := image.Build(image.Spec{Binary: binary, CACerts: *caCerts, Created: created, Version: v.Version, Revision: v.Revision})
	if err != nil {
		return err
	}
	digest, err := image.WriteLayout(filepath.Join(*out, "oci"), img, ref)
	if err != nil {
		return err
	}
	if err := image.WriteTarball(filepath.Join(*out, "image.tar"), img, ref); err != nil {
		return err
	}
	fmt.Printf("%s\n%s@%s\n", ref.Name(), ref.Context().Name(), digest)
	return nil
}
