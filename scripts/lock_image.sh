#!/usr/bin/env bash
# Regenerate docker/requirements.lock: every runtime dependency of the image (pyproject.toml's
# [project] dependencies and theirs), pinned, with the sha256 of every file PyPI has for that
# version, so a rebuild of the image installs exactly what was locked or fails.
#
#   bash scripts/lock_image.sh
#
# Versions are held to those installed in this environment where it has them (the ones the test
# suite ran against), so the image ships what was tested. Run it after changing the dependencies
# in pyproject.toml, with the suite's environment installed (`pip install -e '.[test]'`).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
tools="${CORNUS_LOCK_VENV:-$HOME/.cache/cornus/pip-tools}"
[ -x "$tools/bin/pip-compile" ] || { python3 -m venv "$tools" && "$tools/bin/pip" install -q pip-tools; }
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
# The environment's own pins, less editable installs (the project itself).
python3 -m pip freeze --exclude-editable >"$constraints"
# setuptools is a runtime dependency (grpcio-tools imports pkg_resources), hence --allow-unsafe.
PIP_FIND_LINKS='' "$tools/bin/pip-compile" -q --generate-hashes --allow-unsafe --strip-extras \
  --no-emit-index-url --no-emit-find-links --constraint "$constraints" \
  --output-file docker/requirements.lock pyproject.toml
# The temporary file's name would change the lock on every run without changing what it pins.
sed -i -e "s|--constraint=$constraints|--constraint=<pip freeze of the test environment>|" \
  -e "s|-c $constraints|-c <pip freeze of the test environment>|" docker/requirements.lock
echo "docker/requirements.lock: $(grep -c '^[a-z].*==' docker/requirements.lock) packages pinned"
