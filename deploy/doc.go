// Package deploy holds the deployment artefacts of pg_liveness_exporter and the tests that
// keep them correct: Kubernetes manifests (kubernetes/, a kustomize base and overlays),
// systemd units (systemd/) and the repository's Dockerfile.
//
// It is a module of its own so that the Kubernetes, Prometheus Operator and BuildKit
// libraries its tests use never reach the exporter's dependencies.
//
// The PrometheusRule and the dashboard ConfigMaps under kubernetes/base/monitoring are
// generated from alerts/pg_liveness.rules.yml and dashboards/; regenerate them with
//
//	cd deploy && go generate ./...
package deploy

//go:generate go run ./internal/genmanifests
