#!/usr/bin/env bash
# The slim node build (bin/fleetcheck-node, -tags node) beside the full
# build (bin/fleetcheck), figures in docs/scale.md ("The node binary"):
#   size        the binaries as built (make build, make build-node)
#   analyze     whole-process `analyze` of the 8-GPU example bundle:
#               CPU (user+sys) per run over RUNS runs, peak RSS (median),
#               package init (GODEBUG=inittrace=1), and the peak RSS of
#               `--version` (what mapping the binary alone costs)
#   idle agent  `fleetcheck-node agent` replaying the bundle (host mode
#               bundle, no coordinator reachable) with a short interval;
#               VmRSS sampled every SAMPLE_S seconds for AGENT_S seconds
# The 10-minute version of the agent figure, 60 s passes as in production:
#   AGENT_S=600 AGENT_INTERVAL=60s SAMPLE_S=30 ./scripts/bench-node-build.sh
# A before/after row in the same run: BASELINE=path/to/an-older-fleetcheck-node
# adds it to the analyze table as "baseline".
# Public tools only: GNU time (/usr/bin/time), ls; hyperfine when installed.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-50}
AGENT_S=${AGENT_S:-60}
AGENT_INTERVAL=${AGENT_INTERVAL:-1s}
SAMPLE_S=${SAMPLE_S:-5}
BUNDLE=${BUNDLE:-examples/bundles/h100-healthy}
[ -x /usr/bin/time ] || { echo "needs GNU time (/usr/bin/time; apt-get install time)" >&2; exit 2; }
for b in bin/fleetcheck bin/fleetcheck-node; do
	[ -x "$b" ] || { echo "$b missing: make build build-node (or make bench-node)" >&2; exit 2; }
done
work=$(mktemp -d)
agent_pid=
cleanup() {
	if [ -n "$agent_pid" ]; then kill "$agent_pid" 2>/dev/null || true; fi
	rm -rf "$work"
}
trap cleanup EXIT
# Copies, not the freshly linked files: a binary just written by the
# linker maps more of itself, which would hide the difference.
cp bin/fleetcheck "$work/fleetcheck"
cp bin/fleetcheck-node "$work/fleetcheck-node"
builds="fleetcheck fleetcheck-node"
if [ -n "${BASELINE:-}" ]; then
	[ -x "$BASELINE" ] || { echo "BASELINE=$BASELINE is not an executable" >&2; exit 2; }
	cp "$BASELINE" "$work/baseline"
	builds="baseline $builds"
fi

echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), kernel $(uname -r)"
echo "load:   $(uptime)"
echo "bundle: $BUNDLE"
echo

echo "== size"
ls -l bin/fleetcheck bin/fleetcheck-node | awk '{printf "%-22s %6.1f MB\n", $NF, $5/1e6}'
echo

# cpu_per_run BIN: mean user+sys ms of one analyze, over RUNS runs in one
# timed loop, less the loop's own cost (the same loop running true).
cpu_per_run() {
	local bin=$1 t base
	t=$(/usr/bin/time -f '%U %S' sh -c "for i in \$(seq $RUNS); do '$bin' analyze '$BUNDLE' >/dev/null || [ \$? = 1 ]; done" 2>&1 >/dev/null | tail -1)
	base=$(/usr/bin/time -f '%U %S' sh -c "for i in \$(seq $RUNS); do true; done" 2>&1 | tail -1)
	awk -v t="$t" -v b="$base" -v n="$RUNS" 'BEGIN { split(t, x, " "); split(b, y, " "); printf "%.1f", ((x[1] + x[2]) - (y[1] + y[2])) * 1000 / n }'
}

# median_rss BIN ARGS...: the median peak RSS (KB) of 9 runs.
median_rss() {
	for i in 1 2 3 4 5 6 7 8 9; do
		/usr/bin/time -f '%M' "$@" 2>&1 >/dev/null | tail -1
	done | sort -n | sed -n 5p
}

mb() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }

init_ms() {
	GODEBUG=inittrace=1 "$1" analyze "$BUNDLE" 2>&1 >/dev/null | awk '/^init /{c += $5; n++} END {printf "%.1f ms in %d packages", c, n}'
}

echo "== analyze $BUNDLE (whole process)"
printf '%-16s %14s %16s %18s  %s\n' build "CPU/run" "peak RSS" "--version RSS" "package init"
for b in $builds; do
	bin=$work/$b
	cpu=$(cpu_per_run "$bin")
	rss=$(median_rss "$bin" analyze "$BUNDLE")
	base=$(median_rss "$bin" --version)
	printf '%-16s %11s ms %13s MB %15s MB  %s\n' "$b" "$cpu" "$(mb "$rss")" "$(mb "$base")" "$(init_ms "$bin")"
done
if command -v hyperfine >/dev/null; then
	echo
	hyperfine -N -w 3 -r "$RUNS" "$work/fleetcheck analyze $BUNDLE" "$work/fleetcheck-node analyze $BUNDLE" -i
fi
echo

echo "== idle agent: fleetcheck-node agent, host mode bundle, interval $AGENT_INTERVAL, ${AGENT_S}s"
cat >"$work/agent.yaml" <<YAML
node: bench-node
coordinator: 127.0.0.1:1
insecure: true
state_dir: $work/state
metrics_listen: "off"
host: {mode: bundle, path: $PWD/$BUNDLE}
interval: $AGENT_INTERVAL
enabled_checks: [gpu.inventory, gpu.config, gpu.ecc, gpu.xid, gpu.thermal, gpu.pcie, gpu.nvlink, gpu.fabric, gpu.processes, gpu.peermem, ib.ports, ib.counters, fw.matrix]
YAML
"$work/fleetcheck-node" agent --config "$work/agent.yaml" --log-format json >"$work/agent.log" 2>&1 &
agent_pid=$!
samples=()
for ((s = 0; s < AGENT_S; s += SAMPLE_S)); do
	sleep "$SAMPLE_S"
	kill -0 "$agent_pid" 2>/dev/null || { echo "the agent exited:" >&2; tail -5 "$work/agent.log" >&2; exit 1; }
	samples+=("$(awk '/^VmRSS:/{print $2}' "/proc/$agent_pid/status")")
done
hwm=$(awk '/^VmHWM:/{print $2}' "/proc/$agent_pid/status")
cpu=$(awk '{print ($14 + $15) / 100}' "/proc/$agent_pid/stat")
kill "$agent_pid"
wait "$agent_pid" 2>/dev/null || true
agent_pid=
spooled=$(grep -a -o '"spooled":[0-9]*' "$work/agent.log" | tail -1 | cut -d: -f2)
printf 'VmRSS samples (MB):'
for v in "${samples[@]}"; do printf ' %s' "$(mb "$v")"; done
echo
printf 'first %s MB, last %s MB, peak (VmHWM) %s MB; %s s CPU in %s s; %s results spooled (no coordinator)\n' \
	"$(mb "${samples[0]}")" "$(mb "${samples[-1]}")" "$(mb "$hwm")" "$cpu" "$AGENT_S" "$spooled"
