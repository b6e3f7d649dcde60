#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Soft-RoCE benchmark (not run by CI): boots one QEMU VM with rxe0 (tests/vm/run-in-vm.sh) and
# runs bench/guest-bench.sh in it: perftest's ib_read_bw / ib_write_bw and the sidecar's ibverbs
# READ / WRITE at the same sizes, same boot, then prints the table with the sidecar/perftest ratios.
# See bench/README.md.
#
# Usage: bench/run-vm-bench.sh [ib_bench.py ARGS...]   e.g. --sizes 1M:64,64M:5 --depth 4
#        bench/run-vm-bench.sh kv [kv_bench.py ARGS...]   e.g. kv --shapes 1k,70b --reps 3
#        bench/run-vm-bench.sh first [first_transfer_bench.py ARGS...]   e.g. first --rounds 10
#        bench/run-vm-bench.sh rails [rails_bench.py ARGS...]   1 rail vs 2 (guest-rails-bench.sh)
# Environment: SC_BUILD_DIR (default build/), SC_BINARY, SC_PYTHON_STUBS;
#   RDMA_SIDECAR_BENCH_OUT  results directory (default: a new /tmp/rdma-sidecar-bench.XXXXXX, kept)
#   RDMA_SIDECAR_VM_TIMEOUT whole VM run in seconds (default 1200)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
src="$(cd "$here/.." && pwd -P)"
export SC_BUILD_DIR="${SC_BUILD_DIR:-$src/build}"
export SC_BINARY="${SC_BINARY:-$SC_BUILD_DIR/rdma-sidecar}"
export SC_PYTHON_STUBS="${SC_PYTHON_STUBS:-$SC_BUILD_DIR/python}"
export RDMA_SIDECAR_VM_TIMEOUT="${RDMA_SIDECAR_VM_TIMEOUT:-1200}"
export RDMA_SIDECAR_VM_PASSENV="${RDMA_SIDECAR_VM_PASSENV:-} SC_BINARY SC_PYTHON_STUBS SC_BUILD_DIR"
[[ -x "$SC_BINARY" ]] || { echo "run-vm-bench: no sidecar binary at $SC_BINARY (build first)" >&2; exit 1; }

out="${RDMA_SIDECAR_BENCH_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/rdma-sidecar-bench.XXXXXX")}"
mkdir -p "$out"
export RDMA_SIDECAR_VM_OUT="$out"

rc=0
guest="$here/guest-bench.sh"
if [[ "${1:-}" == rails ]]; then # one ibverbs rail against two (bench/rails_bench.py)
    shift
    guest="$here/guest-rails-bench.sh"
fi
(cd "$src" && bash tests/vm/run-in-vm.sh "$guest" "$@") || rc=$?
echo
if [[ -s "$out/bench.txt" ]]; then
    echo "==== benchmark ($(git -C "$src" describe --always --dirty 2>/dev/null || echo '?'), $(nproc) host CPUs)"
    grep -v '^ib_bench:' "$out/bench.txt"
fi
echo "run-vm-bench: exit $rc; results in $out (bench.txt, bench.json, guest.log)"
exit "$rc"
