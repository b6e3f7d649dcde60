#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The end-to-end demo, as the README runs it on a fresh Debian bookworm machine:
#   1. install Debian packages (scripts/install-deps.sh; skipped when all are present)
#   2. Release build into build/ (incremental: quick when it is up to date)
#   3. scripts/demo.py: nats-server + two sidecars + a producer and a consumer worker, READ and
#      WRITE of 256 MiB each way, SHA-256 compared, everything stopped again
# Arguments go to scripts/demo.py (e.g. --size 1GiB, --keep; see --help).
# Environment: BUILD_DIR (default build), JOBS (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}

bash scripts/install-deps.sh

echo "== Release build in $build/"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$jobs" --target rdma-sidecar python_stubs

echo "== demo"
exec /usr/bin/python3 scripts/demo.py --build-dir "$build" "$@"
