#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs the project and its test tools, installs and
# starts the real services (scripts/services.sh), checks lint, runs pytest. Extra arguments go to
# pytest. Services this script started are stopped again at the end; ones already running stay.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

# The chaos test's Toxiproxy (Go) builds while pip and the services get ready: a cold build takes
# about a minute of CPU that the tests would otherwise wait for. The test waits on the same lock
# (scripts/toxiproxy.sh), so a build still running by then is awaited, and a failed one is retried
# there with its error shown.
scripts/toxiproxy.sh >/dev/null 2>&1 &
# Likewise the helm CLI (Go, about 2 minutes cold) and checkov (its own virtual environment) for
# the deployment checks (tests/deploy), which wait on the same locks (scripts/helm.sh,
# scripts/checkov.sh) and show the error of a failed install.
scripts/helm.sh >/dev/null 2>&1 &
scripts/checkov.sh >/dev/null 2>&1 &

# This checkout, and its test tools where any is missing. Where every dependency is installed
# already (scripts/deps_satisfied.py), only the checkout is: pip's resolver costs about 10 s of
# CPU even with nothing to do. A fast install that fails falls back to the whole one.
if python3 scripts/deps_satisfied.py test 2>/dev/null; then
  python3 -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e . \
    || python3 -m pip install -q --disable-pip-version-check -e '.[test]'
else
  python3 -m pip install -q --disable-pip-version-check -e '.[test]'
fi

# pytest rewrites every test module's asserts on import, and with PYTHONDONTWRITEBYTECODE set
# keeps none of it: each of the xdist workers below would rewrite all of them again (about 4 s of
# CPU each, half its collection). One collection here, allowed to write, leaves the rewritten
# modules in __pycache__, where the workers read them whatever that variable says. In the
# background, beside the services' start; awaited before pytest runs.
PYTHONDONTWRITEBYTECODE= python3 -m pytest --collect-only -q -p no:cacheprovider >/dev/null 2>&1 &
collected_pid=$!

if ! scripts/services.sh status >/dev/null 2>&1; then
  trap 'scripts/services.sh down' EXIT
fi
scripts/services.sh up

ruff check .

# The suite starts some 300 node and CLI processes. Where PYTHONDONTWRITEBYTECODE is set (it is on
# these machines) none of them would save the bytecode it compiles, so each would compile the
# project again (~0.15 s of CPU a process, on a CPU-bound run). Compiled once here, they all read it.
python3 -m compileall -q -j 0 cornus services storage_adapters loadtests tests >/dev/null

# pytest-xdist worker processes (from the `test` extra). The suite mostly waits on node processes
# starting and recovering, storage deadlines and timeouts, so more workers than CI's 2 cores keep
# both busy; each worker gets its own ports and Redis database (tests/worker.py). Arguments given
# to this script come after, so `-n 0` runs serially and `-n 8` overrides the count. Six, not four:
# the suite keeps only about 1.2 of 2 cores busy at four (2026-11-26: 8:22-8:40 of wall time on a
# fresh clone, over the 8-minute budget; 7:16 at six). Eight, not six, once the suite had grown
# back to the budget at six (2026-11-28, same tree, same machine: pytest 432 s at six, 402 s at
# eight, CPU spent 648 s and 589 s: fewer idle gaps while workers wait on nodes and deadlines).
test_worker_count=${CORNUS_TEST_WORKERS:-8}

wait "$collected_pid" || true  # its failure is pytest's own below, said there
set +e
python3 -m pytest -n "$test_worker_count" --dist loadgroup "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then
  # pytest's "no tests collected": for the full suite that means something is broken, never a pass.
  echo "test.sh: pytest selected no test (exit 5); check the arguments: $*" >&2
  exit 1
fi
exit $rc
