// Package testutil holds what the tests of several packages share: polling waits, free
// loopback ports, the metric names the exporter exposes and PromQL parsing with
// Prometheus' own parser. Only tests import it, so none of it (nor the Prometheus
// module) reaches the exporter binary.
package testutil
