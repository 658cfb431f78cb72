#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs the project and its test tools, installs and
# starts the real services (scripts/services.sh), checks lint, runs pytest. Extra arguments go to
# pytest. Services this script started are stopped again at the end; ones already running stay.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

python3 -m pip install -q --disable-pip-version-check -e '.[test]'

if ! scripts/services.sh status >/dev/null 2>&1; then
  trap 'scripts/services.sh down' EXIT
fi
scripts/services.sh up

ruff check .

set +e
python3 -m pytest "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then
  # pytest's "no tests collected": for the full suite that means something is broken, never a pass.
  echo "test.sh: pytest selected no test (exit 5); check the arguments: $*" >&2
  exit 1
fi
exit $rc
