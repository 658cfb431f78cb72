#!/usr/bin/env bash
# Builds a Go command with `go install` into DIR/bin if it is missing, and prints its path: the
# shared body of scripts/helm.sh and scripts/toxiproxy.sh.
# Usage: scripts/go_tool.sh NAME PACKAGE@VERSION DIR BINARY TIMEOUT_S
# Idempotent: a binary already in place is printed at once. Concurrent callers (pytest-xdist
# workers, scripts/test.sh's background builds) serialize on DIR/install.lock, so only one of them
# builds it and the others find it built. TIMEOUT_S bounds both the wait for the lock and the build,
# so a stuck module proxy fails a test run instead of hanging it.
set -euo pipefail
name=$1 package=$2 dir=$3 binary=$4 install_timeout_s=$5
bin=$dir/bin/$binary

log() { printf '%s: %s\n' "$name" "$*" >&2; }

if [ -x "$bin" ]; then echo "$bin"; exit 0; fi

command -v go >/dev/null || { log "go is not installed (https://go.dev/dl/); it builds $package"; exit 1; }
command -v flock >/dev/null || { log "flock (util-linux) is missing"; exit 1; }

mkdir -p "$dir"
exec 9>"$dir/install.lock"
flock -w "$install_timeout_s" 9 || { log "another install held $dir/install.lock for ${install_timeout_s} s"; exit 1; }
if [ ! -x "$bin" ]; then
  log "installing $package into $dir/bin (go install)"
  started=$(date +%s)
  # Built into a scratch directory and moved in one rename: a caller never sees half a binary.
  scratch=$(mktemp -d "$dir/build.XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
  # CGO off: a static binary that needs no C toolchain, and builds the same on any machine.
  CGO_ENABLED=0 GOBIN=$scratch GOFLAGS=-buildvcs=false timeout "$install_timeout_s" go install "$package" >&2
  mkdir -p "$dir/bin"
  mv "$scratch/$binary" "$bin"
  log "installed in $(( $(date +%s) - started )) s"
fi
echo "$bin"
