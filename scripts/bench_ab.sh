#!/usr/bin/env bash
# A/B of `cornus bench` between a base revision and the work tree, runs alternated, because this
# machine's speed drifts by up to 25% within an hour and back-to-back blocks would measure that.
#
#   bash scripts/bench_ab.sh BASE_REV [ROUNDS] [cornus bench flags...]
#   e.g. bash scripts/bench_ab.sh 02184d8 3 --backend redis --redis-url redis://127.0.0.1:16379/5 --protocol cornus
#
# The base runs from a temporary git worktree with PYTHONPATH pointing at it, which the node
# processes the bench starts inherit (no `pip install -e` of a second checkout, which would
# repoint the `cornus` script). A Redis URL among the flags is flushed before every run, so no run
# recovers and collects another's leftovers. Prints each run's throughput and per-transaction rows.
# Both sides get the same flags, so both must know them: a base from before the paper's workloads
# (issue 11) knows only the old default shape, which is `--workload uniform --partitions 6` now; for
# such a base compare a work tree on its last commit before them, or pass flags both know.
set -euo pipefail
base="${1:?usage: bench_ab.sh BASE_REV [ROUNDS] [bench flags...]}"
rounds="${2:-3}"
shift $(( $# >= 2 ? 2 : 1 ))
here="$(cd "$(dirname "$0")/.." && pwd)"
worktree="$(mktemp -d)"
git -C "$here" worktree add -q --detach "$worktree" "$base"
trap 'git -C "$here" worktree remove --force "$worktree"' EXIT
redis_url=""
for ((i = 1; i <= $#; i++)); do
  if [ "${!i}" = "--redis-url" ]; then next=$((i + 1)); redis_url="${!next}"; fi
done
run() { # label tree
  if [ -n "$redis_url" ]; then redis-cli -u "$redis_url" flushdb >/dev/null; fi
  local out
  local label=$1 tree=$2; shift 2
  out=$(cd "$tree" && PYTHONPATH="$tree" timeout 600 python3 -m services.cli bench "$@" 2>&1) || true
  echo "$label: $(echo "$out" | grep -E '^(cornus|2pc|coordinator-log) +[0-9]' | tr -s ' ' | paste -sd '|')"
  # The p50s (client, node total, prepare) are on each protocol's detail line, not the table's.
  echo "$out" | grep -oE 'p50 ms of distributed transactions: .*' | sed "s/^/  $label /" || true
}
for ((round = 1; round <= rounds; round++)); do
  run "base $base" "$worktree" "$@"
  run "work tree" "$here" "$@"
done
