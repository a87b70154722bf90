// Package testutil holds what the tests of several packages share: polling waits,
// contexts with a deadline, a Run method run until the test's end, free loopback ports,
// a TCP connection's keepalive settings and the metric names the exporter exposes. Only
// tests import it, so none of it reaches the exporter binary. PromQL parsing, which needs
// the Prometheus module, is in the tools module (tools/promql).
package testutil
