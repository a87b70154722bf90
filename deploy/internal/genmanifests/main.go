// Command genmanifests writes the generated Kubernetes manifests (see package manifests).
// Run it from the deploy module: go generate ./...
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/pg-liveness/pg_liveness_exporter/deploy/internal/manifests"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "genmanifests:", err)
		os.Exit(1)
	}
}

func run() error {
	// go generate runs in the deploy module's root, one level below the repository's.
	root, err := filepath.Abs("..")
	if err != nil {
		return err
	}
	files, err := manifests.Generate(root)
	if err != nil {
		return err
	}
	// Remove generated files whose source is gone.
	for _, dir := range manifests.GeneratedDirs {
		old, err := filepath.Glob(filepath.Join(root, dir, "*"))
		if err != nil {
			return err
		}
		for _, p := range old {
			rel, _ := filepath.Rel(root, p)
			if fi, err := os.Stat(p); err != nil || fi.IsDir() {
				continue
			}
			if _, ok := files[rel]; !ok {
				if err := os.Remove(p); err != nil {
					return err
				}
			}
		}
	}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(root, p), files[p], 0o644); err != nil {
			return err
		}
		fmt.Println("wrote", p)
	}
	return nil
}
