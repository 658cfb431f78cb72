#!/usr/bin/env bash
# Installs the helm CLI (Go, from the module proxy) if it is missing, and prints its path.
# Idempotent: a binary already in place is printed at once. Concurrent callers (pytest-xdist
# workers, scripts/test.sh's background build) serialize on a lock, so only one of them builds it
# and the others find it built. The tests of the chart (tests/deploy) run this.
# Usage: scripts/helm.sh            prints e.g. /root/.cache/cornus/helm-v3.22.0/bin/helm
# The binary lives outside the work tree (CORNUS_TOOLS_DIR, default ~/.cache/cornus), so every
# checkout and worktree on a machine shares one build.
set -euo pipefail

version=v3.22.0
dir=${CORNUS_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cornus}/helm-$version
bin=$dir/bin/helm
# A cold module and build cache takes about 90 s on 2 cores; this bounds a stuck proxy or network
# well beyond that, so a test run fails instead of hanging.
install_timeout_s=${CORNUS_HELM_INSTALL_TIMEOUT_S:-900}

log() { printf 'helm: %s\n' "$*" >&2; }

if [ -x "$bin" ]; then echo "$bin"; exit 0; fi

command -v go >/dev/null || { log "go is not installed (https://go.dev/dl/); it builds helm $version"; exit 1; }
command -v flock >/dev/null || { log "flock (util-linux) is missing"; exit 1; }

mkdir -p "$dir"
exec 9>"$dir/install.lock"
flock -w "$install_timeout_s" 9 || { log "another install held $dir/install.lock for ${install_timeout_s} s"; exit 1; }
if [ ! -x "$bin" ]; then
  log "installing helm.sh/helm/v3/cmd/helm@$version into $dir/bin (go install)"
  started=$(date +%s)
  # Built into a scratch directory and moved in one rename: a caller never sees half a binary.
  scratch=$(mktemp -d "$dir/build.XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
  # CGO off: a static binary that needs no C toolchain, and builds the same on any machine.
  CGO_ENABLED=0 GOBIN=$scratch GOFLAGS=-buildvcs=false timeout "$install_timeout_s" \
    go install "helm.sh/helm/v3/cmd/helm@$version" >&2
  mkdir -p "$dir/bin"
  mv "$scratch/helm" "$bin"
  log "installed in $(( $(date +%s) - started )) s"
fi
echo "$bin"
