#!/usr/bin/env bash
# Installs the Debian packages that `make run` and `make test` need, when they are missing.
# As root it installs them; otherwise it prints the one command to run and exits 1.
#
#   scripts/install-deps.sh run    what `make run` needs
#   scripts/install-deps.sh test   what `make test` needs (the default)
#   scripts/install-deps.sh bench  what `make bench-compare` needs
#
# Used by `make run` (scripts/run.sh), `make test`, `make bench-compare` and .ci/run.
set -euo pipefail

profile=${1:-test}
case $profile in
run | test | bench) ;;
*)
	echo "usage: $0 [run|test|bench]" >&2
	exit 2
	;;
esac

have_cmd() { command -v "$1" >/dev/null 2>&1; }
have_glob() { compgen -G "$1" >/dev/null; }

missing=()
# want PACKAGE PROFILES CHECK...: PACKAGE is missing when CHECK fails; PROFILES lists the
# targets that need it, comma-separated. One package a line.
want() {
	local pkg=$1 profiles=$2
	shift 2
	[[ ,$profiles, == *,$profile,* ]] || return 0
	"$@" || missing+=("$pkg")
}
want postgresql run,test,bench have_glob '/usr/lib/postgresql/*/bin/initdb'
want postgresql-contrib run,test,bench have_glob '/usr/share/postgresql/*/extension/pg_stat_statements.control'
want pgbouncer test have_glob /usr/sbin/pgbouncer
want prometheus test have_cmd promtool
want prometheus-alertmanager test have_cmd prometheus-alertmanager
want systemd test have_cmd systemd-analyze
want make test have_cmd make
want iproute2 test have_cmd ip
want chromium test have_cmd chromium
want prometheus-postgres-exporter bench have_cmd prometheus-postgres-exporter

[[ ${#missing[@]} -eq 0 ]] && exit 0

if [[ $(id -u) -ne 0 ]]; then
	echo "missing Debian packages; install them as root:" >&2
	echo "  apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" >&2
	exit 1
fi

echo "installing: ${missing[*]}" >&2
# Packages must not start their services here: the tests and the demo run their own.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e $policy ]]; then
	printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created_policy=1
fi
remove_policy() { if [[ $created_policy == 1 ]]; then rm -f "$policy"; fi; }
trap remove_policy EXIT
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
# Debian's postgresql package may create and start a default cluster; it is not used.
if have_cmd pg_lsclusters; then
	pg_lsclusters -h 2>/dev/null | while read -r ver name _; do
		pg_ctlcluster "$ver" "$name" stop >/dev/null 2>&1 || true
	done
fi
