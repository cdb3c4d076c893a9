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
# Knobs: AGENTS, BIG_AGENTS (0 skips the big run), SUSTAIN (10s), CHECK_RUNS (3),
# BUNDLE, KEEP=1 keeps the work directory (logs, databases).
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
AGENTS=${AGENTS:-1000}
BIG_AGENTS=${BIG_AGENTS:-10000}
SUSTAIN=${SUSTAIN:-10s}
CHECK_RUNS=${CHECK_RUNS:-3}
BUNDLE=${BUNDLE:-examples/bundles/h100-healthy}

work=$(mktemp -d "${TMPDIR:-/tmp}/bench-fleet.XXXXXX")
coord_pid=""
cleanup() {
	if [[ -n $coord_pid ]] && kill -0 "$coord_pid" 2>/dev/null; then
		kill "$coord_pid" 2>/dev/null || true
		wait "$coord_pid" 2>/dev/null || true
	fi
	if [[ ${KEEP:-0} == 1 ]]; then
		echo "work directory kept: $work" >&2
	else
		rm -rf "$work"
	fi
}
trap cleanup EXIT

echo "building fleetcheck and fleetcheck-loadgen..." >&2
$GO build -o "$work/fleetcheck" ./cmd/fleetcheck
$GO build -o "$work/fleetcheck-loadgen" ./cmd/fleetcheck-loadgen
lg="$work/fleetcheck-loadgen"

# start_coordinator NAME: a fresh coordinator (own data dir, loopback
# ports) in the background; sets coord_pid and coord_addr.
start_coordinator() {
	local name=$1 grpc_port http_port
	grpc_port=$("$lg" -print-free-port)
	http_port=$("$lg" -print-free-port)
	while [[ $http_port == "$grpc_port" ]]; do http_port=$("$lg" -print-free-port); done
	mkdir -p "$work/$name"
	cat >"$work/$name/coordinator.yaml" <<EOF
listen: 127.0.0.1:$grpc_port
http_listen: 127.0.0.1:$http_port
data_dir: $work/$name/data
insecure: true
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

echo "== $AGENTS agents" >&2
start_coordinator small
"$lg" -coordinator "$coord_addr" -coordinator-pid "$coord_pid" -bundle "$BUNDLE" \
	-agents "$AGENTS" -check-runs "$CHECK_RUNS" -sustain "$SUSTAIN" -cli "$work/fleetcheck" \
	-target-check 2s -target-rate 20000 -target-kib-per-agent 100 \
	-label "$(printf "%'d" "$AGENTS") agents" >>"$rows"
stop_coordinator

if [[ $BIG_AGENTS -gt 0 ]]; then
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
