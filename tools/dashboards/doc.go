// Package dashboards tests the Grafana dashboards the exporter ships (dashboards/*.json in
// the root module, read from there by relative path): their uids, data source and
// template variables, and every query, parsed with Prometheus' own parser, selecting only
// metrics the exporter exposes, filtered by job and instance. It holds no code of its own;
// it lives in the tools module because the Prometheus parser must not reach the
// exporter's dependencies.
package dashboards
