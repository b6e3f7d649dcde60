#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install the Node tools of tests/node/package.json (pinned by package-lock.json) into DIR/node_modules:
#   tests/node/install.sh DIR
# Skips the install when DIR already holds this exact lock file's packages. Exit 0 when ready; 2 when
# node/npm are missing; 3 when npm could not install (no registry?). The tests turn 2/3 into a skip.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:?usage: install.sh DIR}
command -v node >/dev/null && command -v npm >/dev/null || { echo "node/npm not installed (Debian: nodejs npm)"; exit 2; }
mkdir -p "$dir"
if [[ -d "$dir/node_modules" ]] && cmp -s "$here/package-lock.json" "$dir/package-lock.json"; then
  exit 0
fi
cp "$here/package.json" "$here/package-lock.json" "$dir/"
cd "$dir"
if ! timeout 300 npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >npm-install.log 2>&1; then
  rm -f "$dir/package-lock.json"
  tail -5 npm-install.log
  echo "npm ci failed (is the npm registry reachable?): see $dir/npm-install.log"
  exit 3
fi
