#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# TCP data-plane benchmark against iperf3 and ucx_perftest in the same run (not run by CI).
#   bash bench/run-tcp-bench.sh [--quick] [--streams N]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target rdma-sidecar python_stubs
exec /usr/bin/python3 bench/tcp_bench.py --build build "$@"
