#!/usr/bin/env bash
# Whole-process peak RSS and wall time of `fleetcheck analyze` on bundles
# at and past the limits (docs/bundles.md, figures in docs/scale.md):
#   normal       examples/bundles/h100-healthy, directory and .tar.gz
#   gzip bomb    ~600 KB .tar.gz that unpacks to 576 MiB of zeros (refused)
#   dmesg-256m   ~1 MB .tar.gz holding a 256 MiB dmesg.txt of Xid lines
#   largest      the largest accepted bundle: a 256 MiB dmesg.txt, 28 files
#                of 8 MiB, the 8-GPU node's files; directory and .tar.gz
#   parsers      every file a parser reads whole at its 8 MiB limit (an
#                nvidia-smi.xml of 861 GPUs, NVLink and all_reduce_perf
#                text), with the 256 MiB dmesg.txt
# Needs GNU time (/usr/bin/time -v), ~1.5 GB of space in TMPDIR.
# FLEETCHECK=/path/to/binary measures that binary instead of building one.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ -n "${FLEETCHECK:-}" ]; then
	cp "$FLEETCHECK" "$work/fleetcheck"
else
	echo "building fleetcheck..." >&2
	$GO build -o "$work/build" ./cmd/fleetcheck
	# A copy, like FLEETCHECK's: a freshly linked binary maps more of
	# itself and reads some 20 MB higher, which would hide the bundle's part.
	cp "$work/build" "$work/fleetcheck" && rm "$work/build"
fi

mib=$((1 << 20))
xid='[ 2397166.923949] NVRM: Xid (PCI:0000:9b:00): 13, pid=40312, name=python3, Graphics SM Warp Exception on (GPC 1, TPC 0, SM 1): Out Of Range Address'

# dmesg FILE BYTES: Xid lines up to BYTES (whole lines).
# (yes ends on SIGPIPE: no pipefail there.)
dmesg() { (set +o pipefail; yes "$xid" | head -c "$2" | sed '$d' >"$1"); }
manifest() { printf '{"format":1,"hostname":"%s","collected_at":"2026-11-28T02:00:00Z"}\n' "$2" >"$1/manifest.json"; }

echo "making bundles in $work..." >&2
cp -r examples/bundles/h100-healthy "$work/normal"
tar czf "$work/normal.tar.gz" -C "$work" normal

mkdir -p "$work/bomb/fs/junk"
manifest "$work/bomb" bomb
head -c $((256 * mib)) /dev/zero >"$work/bomb/dmesg.txt"
for i in $(seq 1 40); do head -c $((8 * mib)) /dev/zero >"$work/bomb/fs/junk/$i"; done
tar cf - -C "$work" bomb | gzip -9 >"$work/bomb.tar.gz"
rm -rf "$work/bomb"

mkdir -p "$work/dmesg256"
manifest "$work/dmesg256" dmesg256
dmesg "$work/dmesg256/dmesg.txt" $((256 * mib))
tar czf "$work/dmesg256.tar.gz" -C "$work" dmesg256
rm -rf "$work/dmesg256"

cp -r examples/bundles/h100-healthy "$work/largest"
dmesg "$work/largest/dmesg.txt" $((256 * mib))
mkdir -p "$work/largest/fs/junk"
for i in $(seq 1 28); do dmesg "$work/largest/fs/junk/$i" $((8 * mib)); done
tar czf "$work/largest.tar.gz" -C "$work" largest

# repeat FILE BYTES: FILE repeated up to BYTES (whole lines).
repeat() { (set +o pipefail; while cat "$1"; do :; done | head -c "$2" | sed '$d' >"$1.big"); mv "$1.big" "$1"; }
cp -r examples/bundles/h100-healthy "$work/parsers"
cp "$work/largest/dmesg.txt" "$work/parsers/dmesg.txt"
xml=$work/parsers/nvidia-smi.xml
sed -n '1,/<gpu id=/p' "$xml" | sed '$d' >"$work/head.xml"
sed -n '/<gpu id=/,/<\/gpu>/p' "$xml" | sed -n '1,/<\/gpu>/p' >"$work/gpu.xml"
cp "$work/head.xml" "$xml"
while [ $(($(stat -c %s "$xml") + $(stat -c %s "$work/gpu.xml") + 32)) -le $((8 * mib)) ]; do cat "$work/gpu.xml" >>"$xml"; done
echo '</nvidia_smi_log>' >>"$xml"
repeat "$work/parsers/nvidia-smi-nvlink.txt" $((8 * mib))
repeat "$work/parsers/all_reduce_perf.txt" $((8 * mib))

# run NAME PATH: one analyze under GNU time; exit 0/1 judged, 2 refused.
run() {
	local name=$1 path=$2 size
	size=$(du -sh --apparent-size "$path" | cut -f1)
	set +e
	/usr/bin/time -v "$work/fleetcheck" analyze -o json "$path" >/dev/null 2>"$work/time.txt"
	local rc=$?
	set -e
	local rss wall reason
	rss=$(awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2/1024}' "$work/time.txt")
	wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$work/time.txt")
	reason=$(grep -v '^\s' "$work/time.txt" | grep -v '^Command' | head -1 | cut -c1-90 || true)
	printf '%-22s %8s  exit %d  peak RSS %5s MB  wall %8s  %s\n' "$name" "$size" "$rc" "$rss" "$wall" "$reason"
}

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GB", $2/1048576}' /proc/meminfo), load $(cut -d' ' -f1-3 /proc/loadavg)"
run "normal (dir)" "$work/normal"
run "normal (.tar.gz)" "$work/normal.tar.gz"
run "gzip bomb (.tar.gz)" "$work/bomb.tar.gz"
run "256 MiB dmesg (.tar.gz)" "$work/dmesg256.tar.gz"
run "largest (dir)" "$work/largest"
run "largest (.tar.gz)" "$work/largest.tar.gz"
run "parsers at the limit (dir)" "$work/parsers"
