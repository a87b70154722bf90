// Package scripts holds the repository's shell scripts: run.sh, the local demo behind
// make run, and install-deps.sh, which installs the Debian packages the tests and the
// benchmarks need, and the other PostgreSQL majors the tests run on (npm's server builds,
// into a cache outside the work tree). Its test runs run.sh as a user would. There is no Go code to import.
package scripts
