#!/usr/bin/env bash
# Profile the nodes of a `cornus bench` run under load with py-spy, and print the top entries.
#
#   bash scripts/profile_nodes.sh [SECONDS] [cornus bench flags...]
#   e.g. bash scripts/profile_nodes.sh 10 --backend redis --redis-url redis://127.0.0.1:16379/0 --protocol cornus
#
# It starts `cornus bench` (one protocol: pass --protocol) with a run long enough to cover the
# recording, waits for the load phase to end (the nodes' CPU clocks start moving together), records
# every node process for SECONDS with `py-spy record -f raw --nonblocking` (no pauses: the profile
# does not slow the run it measures), merges the nodes' stacks and summarizes them with
# scripts/profile_top.py. Raw profiles stay in $CORNUS_PROFILE_DIR (default /tmp/cornus-profile)
# for flamegraph.pl or speedscope. One code path in-process: `pyinstrument -m services.cli ...`.
set -euo pipefail
seconds="${1:-10}"
shift || true
out="${CORNUS_PROFILE_DIR:-/tmp/cornus-profile}"
mkdir -p "$out"
rm -f "$out"/node-*.raw
command -v py-spy >/dev/null || python3 -m pip install -q py-spy
here="$(cd "$(dirname "$0")/.." && pwd)"
# The bench's own load phase and cluster start come first; 15 s covers them on this machine.
warmup_s=15
cornus bench --seconds "$((seconds + warmup_s + 5))" "$@" >"$out/bench.txt" 2>&1 &
bench=$!
trap 'kill $bench 2>/dev/null || true' EXIT
sleep "$warmup_s"
# Nodes run under the launcher (services/node_launcher.py) or as `cornus serve`.
pids=$(pgrep -f "services.node_launcher|services.cli serve" || true)
[ -n "$pids" ] || { echo "no node processes found; bench output:"; cat "$out/bench.txt"; exit 1; }
for pid in $pids; do
  py-spy record -p "$pid" -d "$seconds" -f raw --nonblocking -o "$out/node-$pid.raw" >/dev/null 2>&1 &
done
wait $(jobs -p | grep -v "^$bench$") 2>/dev/null || true
cat "$out"/node-*.raw >"$out/nodes.raw"
python3 "$here/scripts/profile_top.py" "$out/nodes.raw" --top "${CORNUS_PROFILE_TOP:-30}"
wait "$bench" || true
trap - EXIT
cat "$out/bench.txt"
