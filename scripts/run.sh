#!/usr/bin/env bash
# Local demo (make run): a PostgreSQL in a git-ignored folder, the exporter as an agent,
# a simulated fleet that shows every instance state, and Prometheus with the alert rules
# when it is installed. Ctrl-C stops everything this script started.
#
# Environment (all optional):
#   PG_LIVENESS_RUN_DIR         state folder (data, logs, binaries)    default <repo>/.run
#   PG_LIVENESS_PG_PORT         PostgreSQL port on 127.0.0.1            default 55432
#   PG_LIVENESS_LISTEN          exporter listen address                 default 127.0.0.1:9816
#   PG_LIVENESS_PROMETHEUS      "off" to not start Prometheus           default on if installed
#   PG_LIVENESS_PROM_LISTEN     Prometheus listen address               default 127.0.0.1:9090
#   PG_LIVENESS_FLEETSIM_ARGS   extra flags for fleetsim                (e.g. "--instances=10")
#   PG_LIVENESS_EXPORTER_ARGS   extra flags for the exporter            (e.g. "--log.level=debug")
#   GO                          the go command                          default go
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
run_dir=${PG_LIVENESS_RUN_DIR:-$root/.run}
pg_port=${PG_LIVENESS_PG_PORT:-55432}
listen=${PG_LIVENESS_LISTEN:-127.0.0.1:9816}
prom_mode=${PG_LIVENESS_PROMETHEUS:-auto}
prom_listen=${PG_LIVENESS_PROM_LISTEN:-127.0.0.1:9090}
go_cmd=${GO:-go}
db=pg_liveness_demo

# Demo timings: states change within a minute. The fleet gets the same thresholds as
# the exporter, so that both tell the same story.
stale=20s
dead=45s
exporter_timing=(--agent.heartbeat-interval=5s --agent.heartbeat-slow-interval=10s
	--agent.stale-threshold=$stale --agent.definitive-dead-cutoff=$dead
	--agent.reaper-interval=60s --agent.reaper-lease-ttl=20s)
fleet_timing=(--heartbeat-interval=5s --heartbeat-slow-interval=10s
	--stale-threshold=$stale --definitive-dead-cutoff=$dead)

log() { printf 'make run: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# --- clean-up: stop what we started, newest first ----------------------------------------
pids=()        # process group leaders we started (each child runs in its own session)
pg_started=""  # set once we started PostgreSQL
cleaned=""
stop_group() { # name pid: TERM the group, wait up to 10s, then KILL it
	local name=$1 pid=$2 i
	kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM -- "-$pid" 2>/dev/null
	for ((i = 0; i < 100; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		log "$name did not stop within 10s; killing it"
		kill -KILL -- "-$pid" 2>/dev/null
	fi
	wait "$pid" 2>/dev/null
	return 0
}
cleanup() {
	[[ -n $cleaned ]] && return
	cleaned=1
	trap '' INT TERM # a second Ctrl-C must not interrupt the clean-up
	local i
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		stop_group "${names[i]}" "${pids[i]}"
	done
	if [[ -n $pg_started ]]; then
		log "stopping PostgreSQL"
		as_pg "$bindir/pg_ctl" stop -D "$pgdata" -m fast -w -t 30 >/dev/null ||
			log "pg_ctl stop failed; see $run_dir/postgres.log"
	fi
	log "stopped"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

names=()
start_child() { # name logfile cmd...: start cmd in its own session, remember its group
	local name=$1 logfile=$2
	shift 2
	setsid "$@" >>"$logfile" 2>&1 </dev/null &
	pids+=("$!")
	names+=("$name")
}

wait_port() { # host:port seconds pid
	local host=${1%:*} port=${1##*:} i
	for ((i = 0; i < $2 * 10; i++)); do
		kill -0 "$3" 2>/dev/null || return 1
		(exec 3<>"/dev/tcp/$host/$port") 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}

http_status() { # host:port path: the status code of a GET, without curl
	(
		exec 3<>"/dev/tcp/${1%:*}/${1##*:}" || exit
		printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$2" "$1" >&3
		read -r -t 5 _ status _ <&3 && echo "$status"
	) 2>/dev/null
}

# --- PostgreSQL server binaries ----------------------------------------------------------
find_bindir() {
	local d
	if d=$(pg_config --bindir 2>/dev/null) && [[ -x $d/initdb && -x $d/postgres ]]; then
		echo "$d"
		return
	fi
	for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5 -rn); do
		if [[ -x $d/initdb && -x $d/postgres ]]; then
			echo "$d"
			return
		fi
	done
	return 1
}
"$root/scripts/install-deps.sh" run || die "install the packages above, then run make run again"
bindir=$(find_bindir) || die "PostgreSQL is installed, but initdb and postgres are not found"
command -v "$go_cmd" >/dev/null || die "Go not found: install it from https://go.dev/dl/ (or set GO=/path/to/go)"

# initdb refuses to run as root: as root, the cluster belongs to the postgres user.
pg_user=""
if [[ $(id -u) -eq 0 ]]; then
	pg_user=postgres
	id "$pg_user" >/dev/null 2>&1 || die "running as root and there is no postgres user to run PostgreSQL as (apt-get install postgresql creates it)"
fi
as_pg() {
	if [[ -n $pg_user ]]; then
		runuser -u "$pg_user" -- "$@"
	else
		"$@"
	fi
}

mkdir -p "$run_dir/bin" || die "cannot create $run_dir"
pgdata=$run_dir/pgdata
sockdir=$run_dir/pgsocket
mkdir -p "$pgdata" "$sockdir"
chmod 700 "$pgdata"
if [[ -n $pg_user ]]; then
	chown "$pg_user:" "$pgdata" "$sockdir" || die "cannot chown $pgdata to $pg_user"
	as_pg test -x "$run_dir" || die "the $pg_user user cannot reach $run_dir; set PG_LIVENESS_RUN_DIR to a folder it can reach"
fi

# --- build -------------------------------------------------------------------------------
log "building pg_liveness_exporter and fleetsim (tools/cmd/fleetsim, in the tools module)"
(cd "$root" && "$go_cmd" build -o "$run_dir/bin/pg_liveness_exporter" . &&
	cd tools && "$go_cmd" build -o "$run_dir/bin/fleetsim" ./cmd/fleetsim) || die "go build failed"

# --- start (or reuse) PostgreSQL ---------------------------------------------------------
pwfile=$run_dir/pg_password
if [[ ! -f $pgdata/PG_VERSION ]]; then
	log "initdb $pgdata"
	find "$pgdata" -mindepth 1 -delete # a half-done initdb from an interrupted first run
	(umask 077 && head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$pwfile")
	tmp_pw=$sockdir/.pwfile
	install -m 600 ${pg_user:+-o "$pg_user"} "$pwfile" "$tmp_pw"
	as_pg env LC_ALL=C "$bindir/initdb" -D "$pgdata" -U postgres --pwfile="$tmp_pw" \
		--auth-local=trust --auth-host=scram-sha-256 -E UTF8 --no-locale >"$run_dir/initdb.log" 2>&1
	rc=$?
	rm -f "$tmp_pw"
	[[ $rc -eq 0 ]] || die "initdb failed; see $run_dir/initdb.log"
fi
[[ -s $pwfile ]] || die "$pwfile is missing; remove $pgdata to start afresh"
password=$(cat "$pwfile")

if as_pg "$bindir/pg_ctl" status -D "$pgdata" >/dev/null 2>&1; then
	log "reusing the PostgreSQL already running on $pgdata (it keeps running after Ctrl-C)"
else
	log "starting PostgreSQL on 127.0.0.1:$pg_port (log: $run_dir/postgres.log)"
	# pg_ctl removes a postmaster.pid left behind by a server that is no longer running.
	touch "$run_dir/postgres.log"
	if [[ -n $pg_user ]]; then chown "$pg_user:" "$run_dir/postgres.log"; fi
	pg_started=1
	as_pg "$bindir/pg_ctl" start -D "$pgdata" -l "$run_dir/postgres.log" -w -t 60 -o \
		"-p $pg_port -k $sockdir -c listen_addresses=127.0.0.1 -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all" \
		>/dev/null || { pg_started=""; tail -n 5 "$run_dir/postgres.log" >&2; die "PostgreSQL did not start (port $pg_port taken? set PG_LIVENESS_PG_PORT)"; }
fi
export PGOPTIONS="-c client_min_messages=warning"
psql=("$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h "$sockdir" -p "$pg_port" -U postgres)
if [[ -z $(as_pg "${psql[@]}" -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$db'") ]]; then
	as_pg "${psql[@]}" -d postgres -c "CREATE DATABASE $db" || die "cannot create database $db"
fi
as_pg "${psql[@]}" -d "$db" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" ||
	die "cannot create extension pg_stat_statements (apt-get install postgresql-contrib)"

unset PGOPTIONS
# The DSN goes through the environment, never the command line.
export DATA_SOURCE_NAME="host=127.0.0.1 port=$pg_port dbname=$db user=postgres password=$password sslmode=disable"

# --- exporter, fleet, Prometheus -----------------------------------------------------------
log "starting pg_liveness_exporter on $listen (log: $run_dir/exporter.log)"
# shellcheck disable=SC2086 # the extra args are meant to split
start_child exporter "$run_dir/exporter.log" "$run_dir/bin/pg_liveness_exporter" \
	--web.listen-address="$listen" --agent.service-name=pg_liveness_exporter "${exporter_timing[@]}" \
	${PG_LIVENESS_EXPORTER_ARGS:-}
wait_port "$listen" 30 "${pids[-1]}" || { tail -n 5 "$run_dir/exporter.log" >&2; die "the exporter did not listen on $listen (address taken? set PG_LIVENESS_LISTEN)"; }

log "starting the simulated fleet (log: $run_dir/fleetsim.log)"
# shellcheck disable=SC2086
start_child fleetsim "$run_dir/fleetsim.log" "$run_dir/bin/fleetsim" "${fleet_timing[@]}" \
	--services=checkout,billing --instances=6 --heartbeat-only=2 --hang-after=15s --kill-after=25s --kill-leader-after=40s \
	--leases=cleanup,alerts,mail-checks,uptime-runner ${PG_LIVENESS_FLEETSIM_ARGS:-}

prom_url=""
if [[ $prom_mode != off ]] && command -v prometheus >/dev/null; then
	mkdir -p "$run_dir/prometheus"
	cat >"$run_dir/prometheus.yml" <<EOF
# Generated by scripts/run.sh for the local demo.
global:
  scrape_interval: 5s
  evaluation_interval: 5s
rule_files:
  - $root/alerts/pg_liveness.rules.yml
scrape_configs:
  - job_name: pg_liveness
    static_configs:
      - targets: ['$listen']
EOF
	log "starting Prometheus on $prom_listen (log: $run_dir/prometheus.log)"
	start_child prometheus "$run_dir/prometheus.log" prometheus --config.file="$run_dir/prometheus.yml" \
		--storage.tsdb.path="$run_dir/prometheus" --web.listen-address="$prom_listen"
	if wait_port "$prom_listen" 30 "${pids[-1]}"; then
		prom_url=http://$prom_listen
		# Debian's package has only the classic web UI, under /classic.
		if [[ $(http_status "$prom_listen" /alerts) == 404 ]]; then
			prom_url=$prom_url/classic
		fi
	else
		tail -n 5 "$run_dir/prometheus.log" >&2
		log "Prometheus did not start (address taken? set PG_LIVENESS_PROM_LISTEN); going on without it"
	fi
elif [[ $prom_mode != off ]]; then
	log "prometheus is not installed (apt-get install prometheus): no alerts page"
fi

# --- the tour --------------------------------------------------------------------------------
cat <<EOF

  pg_liveness demo is running. Ctrl-C stops everything.

  Landing page  http://$listen/
  Status page   http://$listen/status
  Metrics       http://$listen/metrics
EOF
if [[ -n $prom_url ]]; then
	cat <<EOF
  Prometheus    $prom_url/graph?g0.expr=sum+by+(state)+(pg_liveness_instances)&g0.tab=0&g0.range_input=5m
  Alerts        $prom_url/alerts
EOF
fi
cat <<EOF
  PostgreSQL    psql -h 127.0.0.1 -p $pg_port -U postgres $db   (password in $pwfile)
  Logs          $run_dir/{exporter,fleetsim,postgres,prometheus}.log

  The fleet: 6 instances of checkout and billing, plus the exporter's own agent.
    instances 0-1  heartbeat-table-only, no alive lock   -> state "heartbeat_only"
  Each instance is a liveness.Agent with its own pool; faults are done to its connections.
    instances 2-5  hold their alive lock                 -> state "alive"
  Stale threshold $stale, definitive-dead cutoff $dead, reaper every 60s.

  What changes in the next minute (watch pg_liveness_instances{state=...}):
    ~15s  instance 4 hangs (its connections freeze): lock held, heartbeats stop. About 20s after its last
          heartbeat it is "lock_only"; after 45s "zombie" (PgLivenessZombieInstances goes
          pending on the alerts page); the reaper deletes its row within 60s.
    ~25s  instance 5 dies (its connections are cut): its lock goes at once ("lock_lost"),
          about a second later it is "stale", and the reaper deletes it within 60s
          (pg_liveness_agent_instances_reaped_total goes up).
    ~40s  the first instance then leading a job is killed: about 1.3s later another holds its
          lease. The status page's History section draws the gap on that lease's timeline,
          pg_liveness_lease_leaderless_seconds{after="holder_dead"} and
          pg_liveness_lease_takeover_seconds count it, and the leases dashboard's Failover
          history row plots it; SELECT * FROM liveness.history ORDER BY id DESC LIMIT 20 lists it.
  Throughout: the leases cleanup, alerts, mail-checks and uptime-runner change hands:
    pg_liveness_lease_epoch{lease=...} rises on every acquisition, pg_liveness_lease_held,
    pg_liveness_lease_expires_in_seconds. The hung instance cannot release its leases:
    they expire (expires_in_seconds < 0) and another instance takes them over. The dead
    one's are taken over as soon as it is dead, before they expire.
  Also: pg_liveness_advisory_locks{kind="alive_lock"}, pg_liveness_backends,
    pg_liveness_statement_calls_total{statement="heartbeat"} (from pg_stat_statements),
    and every 10s fleetsim.log prints each instance's state as the database sees it.
  The heartbeat write-rate alerts stay quiet: they expect the cadence the exporter's
    agent reports (pg_liveness_agent_heartbeat_configured_interval_seconds, 5s and 10s).

EOF

# Run until Ctrl-C, or until a child dies.
while :; do
	for i in "${!pids[@]}"; do
		if ! kill -0 "${pids[i]}" 2>/dev/null; then
			wait "${pids[i]}"
			rc=$?
			log "${names[i]} exited (status $rc); see $run_dir/${names[i]}.log"
			exit 1
		fi
	done
	sleep 1 &
	wait $!
done
