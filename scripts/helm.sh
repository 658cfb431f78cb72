#!/usr/bin/env bash
# Installs the helm CLI (Go, from the module proxy) if it is missing, and prints its path
# (scripts/go_tool.sh: idempotent, one build at a time under a lock). The tests of the chart
# (tests/deploy) run this; scripts/test.sh starts it in the background.
# Usage: scripts/helm.sh            prints e.g. /root/.cache/cornus/helm-v3.22.0/bin/helm
# The binary lives outside the work tree (CORNUS_TOOLS_DIR, default ~/.cache/cornus), so every
# checkout and worktree on a machine shares one build.
set -euo pipefail
version=v3.22.0
dir=${CORNUS_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cornus}/helm-$version
# A cold module and build cache takes about 90 s on 2 cores; this bounds a stuck proxy or network
# well beyond that.
install_timeout_s=${CORNUS_HELM_INSTALL_TIMEOUT_S:-900}
exec "$(dirname "${BASH_SOURCE[0]}")/go_tool.sh" helm "helm.sh/helm/v3/cmd/helm@$version" "$dir" helm \
  "$install_timeout_s"
