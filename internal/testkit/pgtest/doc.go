// Package pgtest starts throwaway PostgreSQL servers for the tests: initdb into a
// temporary folder, listening on 127.0.0.1 and a socket in that folder only, with
// pg_stat_statements loaded; one shared server per test binary, or one of a test's own.
//
// It runs the major that PG_LIVENESS_TEST_PG_MAJOR names (Debian's build when installed,
// else the npm build that scripts/install-deps.sh cached), or Debian's newest. It
// guarantees that a server it started is stopped and its folder removed when the test
// binary ends, however it ends (a watchdog process sees to it). A missing server fails
// the test with a one-line hint; it never skips. It must never listen beyond loopback
// unless a test asks for it, nor touch a server it did not start (PG_LIVENESS_TEST_DSN
// gets fresh databases only).
package pgtest
