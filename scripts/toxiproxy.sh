#!/usr/bin/env bash
# Installs the Toxiproxy server (Go, from the module proxy) if it is missing, and prints its path.
# Idempotent: a binary already in place is printed at once. Concurrent callers (pytest-xdist
# workers) serialize on a lock, so only one of them builds it and the others find it built.
# Usage: scripts/toxiproxy.sh            prints e.g. /repo/.services/toxiproxy-v2.12.0/bin/server
# The chaos harness (python -m loadtests.chaos) runs this when --toxiproxy-bin is not given.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=v2.12.0
dir=${CORNUS_SERVICES_DIR:-$repo/.services}/toxiproxy-$version
bin=$dir/bin/server
# A cold module and build cache takes about a minute on 2 cores; this bounds a stuck proxy or
# network well beyond that, so a test run fails instead of hanging.
install_timeout_s=${CORNUS_TOXIPROXY_INSTALL_TIMEOUT_S:-600}

log() { printf 'toxiproxy: %s\n' "$*" >&2; }

if [ -x "$bin" ]; then echo "$bin"; exit 0; fi

command -v go >/dev/null || { log "go is not installed (https://go.dev/dl/); it builds toxiproxy $version"; exit 1; }
command -v flock >/dev/null || { log "flock (util-linux) is missing"; exit 1; }

mkdir -p "$dir"
exec 9>"$dir/install.lock"
flock -w "$install_timeout_s" 9 || { log "another install held $dir/install.lock for ${install_timeout_s} s"; exit 1; }
if [ ! -x "$bin" ]; then
  log "installing github.com/Shopify/toxiproxy/v2/cmd/server@$version into $dir/bin (go install)"
  started=$(date +%s)
  # Built into a scratch directory and moved in one rename: a caller never sees half a binary.
  scratch=$(mktemp -d "$dir/build.XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
  GOBIN=$scratch GOFLAGS=-buildvcs=false timeout "$install_timeout_s" \
    go install "github.com/Shopify/toxiproxy/v2/cmd/server@$version" >&2
  mkdir -p "$dir/bin"
  mv "$scratch/server" "$bin"
  log "installed in $(( $(date +%s) - started )) s"
fi
echo "$bin"
