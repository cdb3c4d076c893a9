#!/usr/bin/env bash
# make bench-fleet: the coordinator in its own process, a simulated fleet in
# another (fleetcheck-loadgen), everything on 127.0.0.1. Measures, for
# AGENTS (default 1,000) agents: time from a fleet-wide check request until
# every result is stored, sustained check results stored per second, and
# coordinator memory per idle agent; then, for BIG_AGENTS (default 10,000),
# connect, a fleet-wide check, coordinator memory and CPU. docs/scale.md
# explains the figures. Not part of `make test`: it takes a few minutes and
# wants the machine to itself.
#
# Knobs: AGENTS, BIG_AGENTS (0 skips the big run), SUSTAIN (10s), WARMUP (10s
# of the same load before SUSTAIN, shown apart: a fresh database writes its
# first WAL files and touches its memory the first time then), CHECK_RUNS (3),
# COORD_YAML (more lines for the coordinator's config, e.g. "batch: {writers: 8}"),
# BUNDLE, FLEETCHECK (a fleetcheck binary to measure instead of building
# this tree's, for before/after pairs), KEEP=1 keeps the work directory (logs, databases), PG_OPTS (more
# server options, e.g. "-c shared_preload_libraries=pg_stat_statements"), STORE: sqlite
# (default), postgres, or both (the AGENTS run once on each, side by side;
# PostgreSQL is a local server this script starts from Debian's
# postgresql package, fsync off like SQLite's synchronous=NORMAL keeps no
# fsync per commit; BIG_AGENTS runs only when SQLite is measured).
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
AGENTS=${AGENTS:-1000}
BIG_AGENTS=${BIG_AGENTS:-10000}
SUSTAIN=${SUSTAIN:-10s}
WARMUP=${WARMUP:-10s}
CHECK_RUNS=${CHECK_RUNS:-3}
BUNDLE=${BUNDLE:-examples/bundles/h100-healthy}
STORE=${STORE:-sqlite}
case $STORE in
sqlite) stores=(sqlite) ;;
postgres) stores=(postgres) ;;
both) stores=(sqlite postgres) ;;
*)
	echo "STORE must be sqlite, postgres or both, not $STORE" >&2
	exit 2
	;;
esac

work=$(mktemp -d "${TMPDIR:-/tmp}/bench-fleet.XXXXXX")
coord_pid=""
pg_bin=""
cleanup() {
	if [[ -n $coord_pid ]] && kill -0 "$coord_pid" 2>/dev/null; then
		kill "$coord_pid" 2>/dev/null || true
		wait "$coord_pid" 2>/dev/null || true
	fi
	if [[ -n $pg_bin ]]; then
		as_pg "$pg_bin/pg_ctl" -D "$work/pg/data" -m fast stop >/dev/null 2>&1 || true
	fi
	if [[ ${KEEP:-0} == 1 ]]; then
		echo "work directory kept: $work" >&2
	else
		rm -rf "$work"
	fi
}
trap cleanup EXIT

echo "building fleetcheck and fleetcheck-loadgen..." >&2
if [[ -n ${FLEETCHECK:-} ]]; then
	cp "$FLEETCHECK" "$work/fleetcheck" # a build to compare (A/B runs)
else
	$GO build -o "$work/fleetcheck" ./cmd/fleetcheck
fi
$GO build -o "$work/fleetcheck-loadgen" ./cmd/fleetcheck-loadgen
lg="$work/fleetcheck-loadgen"

# as_pg runs a PostgreSQL binary as the postgres user when this is root
# (initdb and postgres refuse root).
as_pg() {
	if [[ $(id -u) == 0 ]]; then
		setpriv --reuid=postgres --regid=postgres --init-groups "$@"
	else
		"$@"
	fi
}

# start_postgres: one local server for the run, on a unix socket in the
# work directory and 127.0.0.1; sets pg_port.
start_postgres() {
	pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
	if [[ -z $pg_bin || ! -x $pg_bin/initdb ]]; then
		echo "STORE=$STORE needs PostgreSQL's server binaries (apt-get install postgresql)" >&2
		exit 1
	fi
	pg_port=$("$lg" -print-free-port)
	chmod 755 "$work"
	mkdir -p "$work/pg"
	[[ $(id -u) == 0 ]] && chown postgres "$work/pg"
	as_pg "$pg_bin/initdb" -D "$work/pg/data" -U postgres -A trust --no-sync --encoding=UTF8 --locale=C >"$work/pg/initdb.log"
	as_pg "$pg_bin/pg_ctl" -D "$work/pg/data" -l "$work/pg/server.log" -w -o \
		"-p $pg_port -k $work/pg -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300 -c shared_buffers=256MB ${PG_OPTS:-}" \
		start >/dev/null
}

# pg_cpu_ticks: CPU clock ticks the PostgreSQL server's processes used so
# far (the postmaster and its children: the coordinator's backends). The
# coordinator's CPU figures leave the server out; this row adds it.
pg_cpu_ticks() {
	local pm total=0 pid f
	pm=$(head -1 "$work/pg/data/postmaster.pid")
	for pid in $pm $(pgrep -P "$pm"); do
		f=$(cut -d' ' -f14,15 "/proc/$pid/stat" 2>/dev/null) || continue
		total=$((total + ${f% *} + ${f#* }))
	done
	echo "$total"
}

# store_url NAME: a fresh database for one coordinator.
store_url() {
	as_pg "$pg_bin/createdb" -h "$work/pg" -p "$pg_port" -U postgres "$1"
	echo "postgres://postgres@127.0.0.1:$pg_port/$1?sslmode=disable"
}

# start_coordinator NAME [STORE_URL]: a fresh coordinator (own data dir,
# loopback ports) in the background; sets coord_pid and coord_addr.
start_coordinator() {
	local name=$1 url=${2:-} grpc_port http_port
	grpc_port=$("$lg" -print-free-port)
	http_port=$("$lg" -print-free-port)
	while [[ $http_port == "$grpc_port" ]]; do http_port=$("$lg" -print-free-port); done
	mkdir -p "$work/$name"
	cat >"$work/$name/coordinator.yaml" <<EOF
listen: 127.0.0.1:$grpc_port
http_listen: 127.0.0.1:$http_port
data_dir: $work/$name/data
store_url: "$url"
insecure: true
${COORD_YAML:-}
EOF
	"$work/fleetcheck" coordinator --config "$work/$name/coordinator.yaml" --log-format json \
		>"$work/$name/coordinator.log" 2>&1 &
	coord_pid=$!
	coord_addr=127.0.0.1:$grpc_port
	for _ in $(seq 1 200); do
		if curl -fsS "http://127.0.0.1:$http_port/healthz" >/dev/null 2>&1; then
			return 0
		fi
		if ! kill -0 "$coord_pid" 2>/dev/null; then
			echo "coordinator exited; its log:" >&2
			tail -20 "$work/$name/coordinator.log" >&2
			exit 1
		fi
		sleep 0.05
	done
	echo "coordinator not healthy after 10s" >&2
	exit 1
}

stop_coordinator() {
	kill "$coord_pid"
	wait "$coord_pid" 2>/dev/null || true
	coord_pid=""
}

rows="$work/rows.md"
: >"$rows"
# The figures depend on what else the machine runs: the load average
# before and after goes next to them (each CPU row also says how many cores
# other processes took).
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

for st in "${stores[@]}"; do
	echo "== $AGENTS agents, $st" >&2
	# What the run before left unwritten (SQLite's file, the server's) is
	# written now, not by the kernel during the next store's run.
	sync
	url=""
	label="$(printf "%'d" "$AGENTS") agents"
	if [[ $st == postgres ]]; then
		[[ -z $pg_bin ]] && start_postgres
		url=$(store_url small_pg)
		label="$label, PostgreSQL"
	elif [[ ${#stores[@]} -gt 1 ]]; then
		label="$label, SQLite"
	fi
	start_coordinator "small-$st" "$url"
	[[ $st == postgres ]] && ticks0=$(pg_cpu_ticks)
	"$lg" -coordinator "$coord_addr" -coordinator-pid "$coord_pid" -bundle "$BUNDLE" \
		-agents "$AGENTS" -check-runs "$CHECK_RUNS" -warmup "$WARMUP" -sustain "$SUSTAIN" -cli "$work/fleetcheck" \
		-target-check 2s -target-rate 20000 -target-kib-per-agent 100 \
		-label "$label" >>"$rows" 2> >(tee "$work/small-$st/loadgen.log" >&2)
	if [[ $st == postgres ]]; then
		ticks=$(($(pg_cpu_ticks) - ticks0))
		stored=$(grep -o 'check_results=[^ ]*[0-9]*' "$work/small-$st/loadgen.log" | tail -1 | grep -o '[0-9]*$' || echo 0)
		hz=$(getconf CLK_TCK)
		if [[ $stored -gt 0 ]]; then
			echo "| $label | PostgreSQL server CPU per check result stored (whole run, $stored check results) | $((ticks * 1000000 / hz / stored)) µs ($(awk "BEGIN{printf \"%.1f\", $ticks/$hz}") s of server CPU) |  |  |" >>"$rows"
		fi
	fi
	stop_coordinator
done

# sustained_rate STORE: the sustained check results/s of that store's run.
sustained_rate() {
	grep -o 'check_results_per_s=[^ ]*' "$work/small-$1/loadgen.log" 2>/dev/null | tail -1 | grep -o '[0-9.]*$' || true
}
if [[ ${#stores[@]} -gt 1 ]]; then
	sq=$(sustained_rate sqlite)
	pg=$(sustained_rate postgres)
	if [[ -n $sq && -n $pg ]]; then
		echo "| $(printf "%'d" "$AGENTS") agents | sustained check results/s, PostgreSQL / SQLite (this run, one after the other) | $(awk "BEGIN{printf \"%.2f (%.0f / %.0f)\", $pg/$sq, $pg, $sq}") | ≥ 1 | $(awk "BEGIN{print ($pg >= $sq) ? \"ok\" : \"MISSED\"}") |" >>"$rows"
	fi
fi

if [[ $BIG_AGENTS -gt 0 && ${stores[0]} == sqlite ]]; then
	echo "== $BIG_AGENTS agents" >&2
	start_coordinator big
	"$lg" -coordinator "$coord_addr" -coordinator-pid "$coord_pid" -bundle "$BUNDLE" \
		-agents "$BIG_AGENTS" -check-runs 2 -settle 10s -connect-concurrency 512 -check-timeout 5m \
		-label "$(printf "%'d" "$BIG_AGENTS") agents" >>"$rows"
	grep -h '"open file limit' "$work/big/coordinator.log" | head -1 >&2 || true
	stop_coordinator
fi

cpus=$(nproc)
echo
echo "fleetcheck bench-fleet, $(date -u +%Y-%m-%dT%H:%MZ), $cpus CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), load average (1, 5, 15 min) before: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "A load average above $cpus means processes waited for a CPU: compare figures only from quiet runs; CPU per check result depends least on it."
echo
echo "| scale | figure | value | target | |"
echo "| --- | --- | --- | --- | --- |"
cat "$rows"
