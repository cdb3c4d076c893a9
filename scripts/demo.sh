#!/usr/bin/env bash
# The demo: analyze the example bundles (a healthy 8x H100 node and two
# broken ones) and print their reports. Exit status 1 from analyze means
# "checks failed", which is what the broken bundles are for.
set -uo pipefail
cd "$(dirname "$0")/.."
for b in examples/bundles/h100-healthy examples/bundles/h100-xid79-ecc examples/bundles/h100-ibdown-pcie; do
  echo "=== fleetcheck analyze $b"
  ./bin/fleetcheck analyze --config examples/node-config.yaml "$b"
  rc=$?
  [ "$rc" -le 1 ] || { echo "analyze failed with exit $rc" >&2; exit "$rc"; }
  echo
done
