#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Guest script of the Soft-RoCE benchmark (bench/run-vm-bench.sh boots the VM and runs it; see
# bench/README.md). In one boot: checks the device, then bench/ib_bench.py runs, interleaved per
# size and direction, perftest's ib_read_bw / ib_write_bw on $RXE_DEV (-x $RXE_GID_INDEX, through
# bench/vm-perftest.sh) and two sidecars on $RXE_DEV doing the same READs and WRITEs over gRPC, and
# prints the table. Arguments go to ib_bench.py (default: --sizes 1M:64,64M:5); a first argument
# `kv` runs bench/kv_bench.py over ibverbs instead, with the rest of the arguments, and `first`
# bench/first_transfer_bench.py (the first transfer to a new peer, cold and after ConnectPeer). Results:
# $VM_OUT/bench.txt (the table), $VM_OUT/bench.json (every figure), $VM_OUT/logs (sidecar logs).
set -uo pipefail

: "${RXE_DEV:?} ${RXE_IP:?} ${RXE_GID_INDEX:?} ${VM_OUT:?} ${VM_SCRIPT_DIR:?}"
src="$(cd "$VM_SCRIPT_DIR/.." && pwd)"
build="${SC_BUILD_DIR:-$src/build}"
export SC_SOURCE_DIR="$src"
export SC_BINARY="${SC_BINARY:-$build/rdma-sidecar}"
export SC_PYTHON_STUBS="${SC_PYTHON_STUBS:-$build/python}"
export SC_TEST_SLOW="${SC_TEST_SLOW:-2}"
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
unset SC_WRAPPER

[[ -x "$SC_BINARY" ]] || { echo "guest-bench: no sidecar binary at $SC_BINARY" >&2; exit 1; }
timeout 30 ibv_devices | grep -qw "$RXE_DEV" || { echo "guest-bench: ibv_devices does not list $RXE_DEV" >&2; exit 1; }
echo "guest-bench: $SC_BINARY on $RXE_DEV ($RXE_IP, GID index $RXE_GID_INDEX), $(nproc) vCPUs"

cd /tmp || exit 1
budget=$((${VM_TIMEOUT:-1200} - 15))
if [[ "${1:-}" == kv ]]; then # KV-cache shaped transfers over ibverbs (bench/kv_bench.py)
    shift
    timeout -k 10 "$budget" /usr/bin/python3 "$src/bench/kv_bench.py" --build "$build" \
        --ib-dev "$RXE_DEV" --ib-gid "$RXE_GID_INDEX" --ip "$RXE_IP" "$@" | tee "$VM_OUT/bench.txt"
elif [[ "${1:-}" == first ]]; then # the first transfer to a new peer, cold and warmed up
    shift
    timeout -k 10 "$budget" /usr/bin/python3 "$src/bench/first_transfer_bench.py" --build "$build" \
        --ib "$RXE_DEV:$RXE_GID_INDEX:$RXE_IP" "$@" | tee "$VM_OUT/bench.txt"
else
    timeout -k 10 "$budget" /usr/bin/python3 "$src/bench/ib_bench.py" \
        --dev "$RXE_DEV" --gid "$RXE_GID_INDEX" --ip "$RXE_IP" --json "$VM_OUT/bench.json" --log-dir "$VM_OUT/logs" "$@" |
        tee "$VM_OUT/bench.txt"
fi
rc=${PIPESTATUS[0]}
((rc != 124 && rc != 137)) || echo "guest-bench: timed out after ${budget}s" >&2
exit "$rc"
