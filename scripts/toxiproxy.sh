#!/usr/bin/env bash
# Installs the Toxiproxy server (Go, from the module proxy) if it is missing, and prints its path
# (scripts/go_tool.sh: idempotent, one build at a time under a lock).
# Usage: scripts/toxiproxy.sh            prints e.g. /repo/.services/toxiproxy-v2.12.0/bin/server
# The chaos harness (python -m loadtests.chaos) runs this when --toxiproxy-bin is not given.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=v2.12.0
dir=${CORNUS_SERVICES_DIR:-$repo/.services}/toxiproxy-$version
# A cold module and build cache takes about a minute on 2 cores; this bounds a stuck proxy or
# network well beyond that.
install_timeout_s=${CORNUS_TOXIPROXY_INSTALL_TIMEOUT_S:-600}
exec "$repo/scripts/go_tool.sh" toxiproxy "github.com/Shopify/toxiproxy/v2/cmd/server@$version" "$dir" server \
  "$install_timeout_s"
