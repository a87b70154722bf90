#!/usr/bin/env bash
# make test and make test-majors: the suite on Debian's PostgreSQL 15 and the
# database-facing packages on each major of PG_MAJORS, as jobs that run side by side, at
# most JOBS at a time. Most of the suite waits (on leases, heartbeats, timeouts, servers
# starting and stopping) rather than computes: a package of the library keeps a core
# busy a fifth of its time, the root package half of it; so jobs beside each other share
# the two cores instead of taking turns. A job is one `go test` of some packages of one
# module on one major; each starts its own PostgreSQL servers on free ports.
#
#   scripts/test.sh all      the whole suite on 15 (the root module, deploy/ and tools/),
#                            the soak, and the database-facing packages on PG_MAJORS
#   scripts/test.sh majors   only the database-facing packages on PG_MAJORS
#
# The soak (tools/soak) runs alone: nothing starts beside it, since what it checks are
# bounds on how soon a fault is seen. Each job's output is printed whole when it ends;
# then a table of each package's seconds on each major, the slowest first, and each
# job's. Every job runs even when one fails; the exit status is 1 if any failed.
#
# Environment (the Makefile passes its variables): GO, TEST_FLAGS, JOBS (default 4),
# PG_MAJORS, DB_PKGS and TOOLS_DB_PKGS (the database-facing packages of the root and the
# tools module), MAJOR_FAULTS (the fault scenarios run on PG_MAJORS) and MAJOR_SKIP (the
# tests no major but 15 runs).
set -uo pipefail
cd "$(dirname "$0")/.."

what=${1:-all}
GO=${GO:-go}
TEST_FLAGS=${TEST_FLAGS:--race -vet=off -count=1 -timeout 30m}
JOBS=${JOBS:-4}
: "${PG_MAJORS:?}" "${PG_MAJORS_LIBRARY?}" "${DB_PKGS:?}" "${TOOLS_DB_PKGS:?}" "${MAJOR_FAULTS:?}" "${MAJOR_SKIP:?}"

# Every name in MAJOR_SKIP is a test of ours: a renamed test would otherwise run on every
# major unnoticed.
names_skipped=${MAJOR_SKIP#^(}
IFS='|' read -ra skipped <<<"${names_skipped%)\$}"
for name in "${skipped[@]}"; do
	if ! grep -rqs --include='*_test.go' "^func $name(" . ; then
		echo "MAJOR_SKIP names $name, which no test file defines" >&2
		exit 1
	fi
done

# The tests' folders (their servers' data directories, Prometheus' and Chromium's) go in
# memory when /dev/shm can hold them: creating and dropping a database creates and removes
# some thousand files, which on ext4 cost a quarter of the library's tests' CPU. The
# folder's name is short: a test's unix socket in its t.TempDir() must fit in 107 bytes.
if [[ -z ${TMPDIR:-} && -d /dev/shm && -w /dev/shm ]] &&
	(($(df -Pk /dev/shm | awk 'NR == 2 { print $4 }') > 4 * 1024 * 1024)); then
	TMPDIR=$(mktemp -d /dev/shm/plXXXX)
	chmod 1777 "$TMPDIR"
	export TMPDIR
	shm=$TMPDIR
fi
logs=$(mktemp -d "${TMPDIR:-/tmp}/pg_liveness_test.XXXXXX")
trap 'rm -rf "$logs" ${shm:+"$shm"}' EXIT

# The jobs, in the order they start: the longest first, so that the short ones fill in at
# the end. Fields: name, module folder, major ("" is Debian's 15), flags, packages, and
# "alone" for a job that runs with nothing beside it but "beside" jobs (niced).
names=() dirs=() majors=() flags=() pkgs=() alone=()
job() { names+=("$1") dirs+=("$2") majors+=("$3") flags+=("$4") pkgs+=("$5") alone+=("${6:-}"); }

# flags_of DIR: TEST_FLAGS for the module in DIR. deploy/ runs without the race detector:
# its tests render manifests and build images, with no concurrency of ours to race, and
# its dependencies (Helm, the Kubernetes API server's validation) take minutes longer to
# build with it.
flags_of() {
	if [[ $1 == deploy ]]; then
		echo "${TEST_FLAGS//-race/}"
	else
		echo "$TEST_FLAGS"
	fi
}

# tested DIR EXCLUDE...: the packages with tests of the module in DIR, as ./paths, but
# those named.
tested() {
	local dir=$1 module p rel out=()
	shift
	module=$(cd "$dir" && $GO list -m)
	for p in $(cd "$dir" && $GO list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./...); do
		rel=.${p#"$module"}
		[[ " $* " == *" $rel "* ]] || out+=("$rel")
	done
	echo "${out[*]}"
}

root_db_rest=()
for p in $DB_PKGS; do
	[[ $p == . || $p == ./liveness ]] || root_db_rest+=("$p")
done
tools_db_rest=()
for p in $TOOLS_DB_PKGS; do
	[[ $p == ./faults ]] || tools_db_rest+=("$p")
done

if [[ $what == all ]]; then
	job soak tools "" "" ./soak/ alone
	# deploy/ renders manifests and builds images: nothing in it waits on a clock, so it
	# runs beside the soak, which mostly waits, at the lowest priority (nice 19), where it
	# takes only the CPU the soak leaves, and at the others' once the soak ends; it builds
	# its tests itself.
	job deploy deploy "" "" ./... beside
fi
# The binary's and the library's packages: on 15, and on PG_MAJORS_LIBRARY of the other
# majors (make test-majors: on each of PG_MAJORS). On 15 the fault suite and the root
# module's other packages, among the longest, start with them.
library() {
	local m=$1 mm=$1
	[[ $m == 15 ]] && mm=""
	job "root package" . "$mm" "$([[ -n $mm ]] && echo "-skip $MAJOR_SKIP")" .
	job liveness . "$mm" "$([[ -n $mm ]] && echo "-skip $MAJOR_SKIP")" ./liveness
}
library_majors=$PG_MAJORS_LIBRARY
[[ $what == majors ]] && library_majors=$PG_MAJORS
if [[ $what == all ]]; then
	job "tools: fault suite" tools "" "" ./faults/
	library 15
	job "root: other packages" . "" "" "$(tested . . ./liveness)"
fi
for m in $library_majors; do
	library "$m"
done
if [[ $what == all ]]; then
	job "tools: other packages" tools "" "" "$(tested tools ./soak ./faults)"
	# Every benchmark of the library and the collectors once, at a small scale (-short):
	# their numbers mean nothing here, but their checks run, so that a benchmark behind the
	# docs' numbers cannot break unseen (one did: BenchmarkWatcherTick).
	job "benchmarks, small, once" . "" "-short -run ^$ -bench . -benchtime=1x" "./liveness ./collector"
fi
# The majors' database-facing jobs, the longest first.
for m in $PG_MAJORS; do
	job "root: database-facing" . "$m" "-skip $MAJOR_SKIP" "${root_db_rest[*]}"
done
for m in $PG_MAJORS; do
	job "tools: faults (server-facing)" tools "$m" "-run $MAJOR_FAULTS" ./faults/
	job "tools: database-facing" tools "$m" "-skip $MAJOR_SKIP" "${tools_db_rest[*]}"
done

start_all=$(date +%s)
declare -A pid_job=()
running=0 alone_running=0 next=0 failed=()

elapsed() { echo "$(($(date +%s) - start_all))"; }
major_of() { echo "${majors[$1]:-15}"; }

# run_job I: the job's go test; its output and seconds go to the log folder.
run_job() {
	local i=$1 t0 rc
	t0=$(date +%s)
	# A job beside the alone one runs at nice 19, this shell and what it starts; renice_tree
	# gives them the others' priority when the alone job ends.
	[[ ${alone[$i]} == beside ]] && renice -n 19 -p "$BASHPID" >/dev/null
	# shellcheck disable=SC2086 # TEST_FLAGS, the flags and the packages are lists
	(cd "${dirs[$i]}" && if [[ ${dirs[$i]} == deploy ]]; then $GO build ./... || exit; fi &&
		PG_LIVENESS_TEST_PG_MAJOR=${majors[$i]} $GO test $(flags_of "${dirs[$i]}") ${flags[$i]} ${pkgs[$i]}) >"$logs/$i.log" 2>&1
	rc=$?
	echo "$(($(date +%s) - t0))" >"$logs/$i.secs"
	return $rc
}

launch() {
	local i=$1
	run_job "$i" &
	pid_job[$!]=$i
	running=$((running + 1))
	[[ ${alone[$i]} == alone ]] && alone_running=1
	echo "== $(elapsed) s: start ${names[$i]}, PostgreSQL $(major_of "$i")$([[ ${alone[$i]} == alone ]] && echo ", alone")$([[ ${alone[$i]} == beside ]] && echo ", nice 19")"
}

# renice_tree PID: PID and its descendants to nice 0, every thread of each (a nice value
# is a thread's: a Go program starts its children from any of its threads).
renice_tree() {
	local child task
	for task in /proc/"$1"/task/*; do
		renice -n 0 -p "${task##*/}" >/dev/null 2>&1 || continue # a thread that ended meanwhile; the others and the children still
	done
	for child in $(pgrep -P "$1"); do
		renice_tree "$child"
	done
}

reap() {
	local pid rc i
	wait -n -p pid
	rc=$?
	i=${pid_job[$pid]}
	unset "pid_job[$pid]"
	running=$((running - 1))
	if [[ ${alone[$i]} == alone ]]; then
		alone_running=0
		# The jobs beside it get their share from now on: their processes, and those they
		# start, at the priority of the others (as root; otherwise they stay at nice 19,
		# and take the CPU the others leave).
		for pid in "${!pid_job[@]}"; do
			[[ ${alone[${pid_job[$pid]}]} == beside ]] && renice_tree "$pid"
		done
	fi
	echo "== $(elapsed) s: end ${names[$i]}, PostgreSQL $(major_of "$i"): $(cat "$logs/$i.secs") s, $([[ $rc == 0 ]] && echo ok || echo FAILED)"
	sed 's/^/    /' "$logs/$i.log"
	[[ $rc == 0 ]] || failed+=("${names[$i]} on $(major_of "$i")")
}

# Compiled once before the jobs start, so that they do not compile the same packages side
# by side; -exec true runs no test. deploy/ shares no package with the others' race
# builds: its job builds it, beside the soak.
echo "== building the tests of the root and tools modules"
for d in . tools; do
	# shellcheck disable=SC2086
	if ! out=$(cd "$d" && $GO test $(flags_of "$d") -exec true ./... 2>&1 && $GO build ./...); then
		echo "$out"
		failed+=("the build of $d")
	fi
done
echo "== built in $(elapsed) s; ${#names[@]} jobs, $JOBS at a time"

while ((next < ${#names[@]} || running > 0)); do
	if ((next < ${#names[@]})); then
		if [[ ${alone[$next]} == alone ]]; then
			if ((running == 0)); then
				launch "$next"
				next=$((next + 1))
				continue
			fi
		elif ((running < JOBS && (alone_running == 0 || ${#alone[$next]} > 0))); then
			launch "$next"
			next=$((next + 1))
			continue
		fi
	fi
	reap
done

# The tables: each package's seconds (as go test reports them) on each major, the
# slowest first, and each job's (the go command's own work included).
echo
echo "== seconds by package and PostgreSQL major, the slowest first"
for i in "${!names[@]}"; do
	module=$(cd "${dirs[$i]}" && $GO list -m)
	sed -nE 's/^(ok|FAIL)[[:space:]]+([^[:space:]]+)[[:space:]]+([0-9.]+)s.*/\1 \2 \3/p' "$logs/$i.log" |
		while read -r status pkg secs; do
			rel=${pkg#"$module"}
			rel=${rel#/}
			[[ ${dirs[$i]} != . ]] && rel=${dirs[$i]}/$rel
			rel=${rel%/}
			[[ $status == FAIL ]] && secs="$secs!"
			echo "${rel:-.} $(major_of "$i") $secs"
		done
done | awk -v majors="$(printf '%s\n' 15 $PG_MAJORS | sort -nu | tr '\n' ' ')" '
	BEGIN { n = split(majors, m, " ") }
	{ t[$1, $2] = $3; s = $3 + 0; if (s > worst[$1]) worst[$1] = s; seen[$1] = 1 }
	END {
		printf "%-28s", "package"; for (j = 1; j <= n; j++) printf "%8s", m[j]; printf "\n"; fflush()
		cmd = "sort -t\"\t\" -k1,1nr"
		for (p in seen) {
			line = sprintf("%-28s", p)
			for (j = 1; j <= n; j++) line = line sprintf("%8s", ((p, m[j]) in t) ? t[p, m[j]] : "-")
			printf "%d\t%s\n", worst[p] * 1000, line | cmd
		}
		close(cmd)
	}' | cut -f2-
echo "(seconds as go test reports each package; - not run on that major; ! failed)"
echo
echo "== seconds by job, in the order they started"
for i in "${!names[@]}"; do
	printf '%6s  %-32s %s\n' "$(cat "$logs/$i.secs" 2>/dev/null || echo -)" "${names[$i]}" "$(major_of "$i")"
done
echo
echo "== $(elapsed) s in all, $JOBS jobs at a time"
if ((${#failed[@]} > 0)); then
	echo "== failed: $(printf '%s; ' "${failed[@]}")"
	exit 1
fi
