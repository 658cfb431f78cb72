#!/usr/bin/env bash
# Installs checkov (PyPI) into a virtual environment of its own if it is missing, and prints the
# path of its `checkov` command. Idempotent; concurrent callers serialize on a lock, like
# scripts/helm.sh and scripts/toxiproxy.sh, and the first one installs while the others wait.
#
# Why not the `test` extra of pyproject.toml: checkov pins boto3/botocore far below the botocore
# that aiobotocore (the DynamoDB adapter's client) requires, and pins packaging and networkx lower
# too; installed beside the project, pip would downgrade them and break the DynamoDB backend. In
# its own environment it breaks nothing.
# Usage: scripts/checkov.sh         prints e.g. /root/.cache/cornus/checkov-3.3.30/venv/bin/checkov
set -euo pipefail

version=3.3.30
dir=${CORNUS_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cornus}/checkov-$version
bin=$dir/venv/bin/checkov
# A cold install downloads some 60 wheels (about 40 s here); this bounds a stuck index.
install_timeout_s=${CORNUS_CHECKOV_INSTALL_TIMEOUT_S:-900}
python=${PYTHON:-python3}

log() { printf 'checkov: %s\n' "$*" >&2; }

# The environment counts as installed only once its marker exists: an install that was cut off
# leaves no marker, and the next caller starts it again.
marker=$dir/installed
if [ -f "$marker" ]; then echo "$bin"; exit 0; fi

command -v flock >/dev/null || { log "flock (util-linux) is missing"; exit 1; }

mkdir -p "$dir"
exec 9>"$dir/install.lock"
flock -w "$install_timeout_s" 9 || { log "another install held $dir/install.lock for ${install_timeout_s} s"; exit 1; }
if [ ! -f "$marker" ]; then
  log "installing checkov==$version into $dir/venv"
  started=$(date +%s)
  # A virtual environment records its own path in its scripts, so it is built in place (not in
  # a scratch directory renamed later); the marker, written last, is what callers trust.
  rm -rf "$dir/venv"
  "$python" -m venv "$dir/venv"
  timeout "$install_timeout_s" "$dir/venv/bin/python" -m pip install -q --disable-pip-version-check \
    "checkov==$version" >&2
  "$bin" --version >/dev/null
  touch "$marker"
  log "installed in $(( $(date +%s) - started )) s"
fi
echo "$bin"
