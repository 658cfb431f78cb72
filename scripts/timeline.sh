#!/usr/bin/env bash
# Where a one-shot transaction's latency goes, step by step across the processes: records the
# nodes' socket traffic (scripts/timeline/sitecustomize.py) during a `cornus bench --clients 1`
# run and prints the median critical path (scripts/timeline_report.py). A profile says where CPU
# goes; this says what the caller waits for.
#
#   bash scripts/timeline.sh [SECONDS] [cornus bench flags...]
#   e.g. bash scripts/timeline.sh 3 --workload uniform --partitions 6 --backend redis --redis-url redis://127.0.0.1:16379/0 --protocol cornus
set -euo pipefail
seconds="${1:-3}"
shift || true
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${CORNUS_TIMELINE_DIR:-/tmp/cornus-timeline}"
mkdir -p "$out"
rm -f "$out"/*.txt
# The bench's cluster start and load phase come first; 15 s covers them on this machine.
warmup_s=15
CORNUS_TIMELINE_DIR="$out" PYTHONPATH="$here/scripts/timeline${PYTHONPATH:+:$PYTHONPATH}" \
  cornus bench --clients 1 --no-plots --seconds "$((seconds + warmup_s + 5))" "$@" >"$out/bench.log" 2>&1 &
bench=$!
trap 'kill $bench 2>/dev/null || true' EXIT
sleep "$warmup_s"
# This bench's own nodes only: another bench on a shared machine would die of an unexpected SIGUSR1.
pids=$(pgrep -P "$bench" -f "services.cli serve" || true)
[ -n "$pids" ] || { echo "no node processes found; bench output:"; cat "$out/bench.log"; exit 1; }
kill -USR1 $pids
sleep "$seconds"
kill -USR2 $pids
sleep 1
python3 "$here/scripts/timeline_report.py" "$out"
wait "$bench" || true
trap - EXIT
grep -A1 '^protocol' "$out/bench.log" || cat "$out/bench.log"
