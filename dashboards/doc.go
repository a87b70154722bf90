// Package dashboards ships the Grafana dashboards for pg_liveness_exporter.
//
// overview.json, leases.json and advisory-locks.json are plain Grafana dashboard JSON, to
// import or provision as they are. Each picks its Prometheus data source, job and
// exporter instance through template variables. Each panel's title is the question it
// answers; each dashboard links to the other two and to docs/runbooks.md, and a panel that
// shows an alert's number links to that alert's runbook. The tools module's tests
// (tools/dashboards) check those conventions, parse every query with Prometheus' own
// PromQL parser and compare every threshold with the alert rules; tools/alerts runs every
// query against a real Prometheus; the deploy module's tests decode each one strictly into Grafana's own
// schema types (the Grafana Foundation SDK). Both stay out of this module's dependencies.
package dashboards

import "embed"

// Files holds the dashboard JSON files.
//
//go:embed *.json
var Files embed.FS
