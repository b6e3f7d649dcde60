#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Guest script of the Soft-RoCE VM test (ctest vm.softroce via tests/vm/test-vm.sh; runs inside the
# VM that tests/vm/run-in-vm.sh boots, as root, in a read-only chroot of the host's root at the
# repository root). Steps, each bounded by `timeout`:
#   1. ibv_devices lists $RXE_DEV and its port is active;
#   2. $SC_BUILD_DIR/tests/test_ib_transfer (the backend's C test on real verbs, with the revoked
#      rkey check); its exit 77 (skip), or its absence when its source is in the tree, count as
#      failures here: this VM has a device;
#   3. tests/integration/test_truncated_regions.py IbverbsMatrix: truncated region files on real
#      verbs (not with RDMA_SIDECAR_VM_TESTS, which picks vm_ibverbs.py tests);
#   4. tests/integration/vm_ibverbs.py: two sidecars on $RXE_DEV, driven over gRPC by
#      /usr/bin/python3 with the generated stubs of the host build (skipped with
#      RDMA_SIDECAR_VM_TESTS=none: the steps before it only).
# Nothing is written under the repository (read-only here): sidecar work dirs go to /tmp, region
# files to /dev/shm (both tmpfs in the guest); logs are copied to $VM_OUT/logs (kept on failure).
#
# Environment: SC_BINARY, SC_PYTHON_STUBS, SC_BUILD_DIR (test-vm.sh passes them through),
# RDMA_SIDECAR_VM_TESTS (optional: unittest names or -k patterns for vm_ibverbs.py, space separated;
# "none": steps 1-3 only),
# RDMA_SIDECAR_VM_SKIP_C_TEST=1 (optional: do not run test_ib_transfer).
set -uo pipefail

: "${RXE_DEV:?} ${RXE_IP:?} ${RXE_GID_INDEX:?} ${VM_OUT:?}"
start=$SECONDS
results=()
failed=0

log() { printf 'guest-test: %s\n' "$*"; }
record() { # NAME RC SECONDS [NOTE]
    local verdict=PASS
    (($2 == 0)) || { verdict=FAIL; failed=1; }
    results+=("$(printf '%-4s %-28s %5ss  rc=%s %s' "$verdict" "$1" "$3" "$2" "${4:-}")")
}

src="$(cd "${VM_SCRIPT_DIR:?}/../.." && pwd)"
build="${SC_BUILD_DIR:-$src/build}"
export SC_BINARY="${SC_BINARY:-$build/rdma-sidecar}"
export SC_PYTHON_STUBS="${SC_PYTHON_STUBS:-$build/python}"
export SC_TEST_TMP=/tmp/sc-test        # the harness only mkdirs it; never under the read-only tree
export SC_TEST_SLOW="${SC_TEST_SLOW:-2}"  # sidecar start-up waits; emulated CPUs are slow
export SC_KEEP_TMP=1                   # keep work dirs (logs, sockets) so they can be copied out
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
unset SC_WRAPPER
mkdir -p "$VM_OUT/logs"

[[ -d "$build" ]] || {
    log "FAIL: build directory $build is not visible in the guest (paths under /tmp, /var/tmp and"
    log "/run are tmpfs here: list it in RDMA_SIDECAR_VM_SHOW; test-vm.sh does so for SC_BUILD_DIR)"
    exit 1
}
[[ -x "$SC_BINARY" ]] || { log "FAIL: no sidecar binary at $SC_BINARY (build first)"; exit 1; }
[[ -d "$SC_PYTHON_STUBS/rdma_sidecar" ]] || { log "FAIL: no Python stubs in $SC_PYTHON_STUBS"; exit 1; }
log "binary $SC_BINARY; stubs $SC_PYTHON_STUBS; $RXE_DEV on $RXE_IP, GID index $RXE_GID_INDEX"

# ---- 1. the device ------------------------------------------------------------------------------
t=$SECONDS
rc=0
devs="$(timeout 30 ibv_devices 2>&1)" || rc=$?
printf '%s\n' "$devs"
if ((rc == 0)) && ! grep -qw "$RXE_DEV" <<<"$devs"; then
    log "ibv_devices does not list $RXE_DEV"
    rc=1
fi
if ((rc == 0)) && ! timeout 30 ibv_devinfo -d "$RXE_DEV" 2>&1 | grep -q PORT_ACTIVE; then
    log "port 1 of $RXE_DEV is not active"
    rc=1
fi
record ibv_devices "$rc" $((SECONDS - t))
if ((rc != 0)); then
    printf '%s\n' "${results[@]}"
    exit 1
fi

# ---- 2. the backend's C test --------------------------------------------------------------------
c_test="$build/tests/test_ib_transfer"
if [[ "${RDMA_SIDECAR_VM_SKIP_C_TEST:-0}" == 1 ]]; then
    log "test_ib_transfer: skipped by RDMA_SIDECAR_VM_SKIP_C_TEST=1"
elif [[ -x "$c_test" ]]; then
    t=$SECONDS
    log "== $c_test"
    (cd /tmp && timeout -k 5 240 "$c_test") 2>&1 | tee "$VM_OUT/logs/test_ib_transfer.log"
    rc=${PIPESTATUS[0]}
    note=""
    ((rc != 77)) || note="(77 = skipped: a failure here, the VM has $RXE_DEV)"
    ((rc != 124 && rc != 137)) || note="(timed out after 240s)"
    record test_ib_transfer "$rc" $((SECONDS - t)) "$note"
elif [[ -f "$src/tests/unit/test_ib_transfer.c" ]]; then
    log "test_ib_transfer: FAIL: $c_test was not built (its source is in the tree)"
    record test_ib_transfer 1 0 "(not built)"
else
    log "test_ib_transfer: not in this tree; running the Python tests only"
fi

# ---- 3. truncated regions on real verbs ---------------------------------------------------------
# tests/integration/test_truncated_regions.py's IbverbsMatrix (issue 32): READ and WRITE x a region
# file truncated on the active or the passive side, before the Begin and while the NIC moves the
# bytes; each ends ERRORED naming the region, no daemon dies, then an honest transfer. A few minutes:
# before vm_ibverbs.py, which takes what is left of the budget.
if [[ -z "${RDMA_SIDECAR_VM_TESTS:-}" || "${RDMA_SIDECAR_VM_TESTS}" == none ]]; then
    t=$SECONDS
    log "== test_truncated_regions.py IbverbsMatrix"
    budget=$((${VM_TIMEOUT:-600} - (SECONDS - start) - 20))
    ((budget > 60)) || budget=60
    timeout -k 10 "$budget" /usr/bin/python3 "$src/tests/integration/test_truncated_regions.py" \
        IbverbsMatrix 2>&1 | tee "$VM_OUT/logs/truncated_regions.log"
    rc=${PIPESTATUS[0]}
    note=""
    ((rc != 124 && rc != 137)) || note="(timed out after ${budget}s)"
    # A skip inside the VM is a failure: it has the device.
    if ((rc == 0)) && grep -q "skipped" "$VM_OUT/logs/truncated_regions.log"; then
        rc=1
        note="(skipped: a failure here, the VM has $RXE_DEV)"
    fi
    record truncated_regions "$rc" $((SECONDS - t)) "$note"
fi

# ---- 4. two sidecars on rxe0, driven over gRPC --------------------------------------------------
if [[ "${RDMA_SIDECAR_VM_TESTS:-}" != none ]]; then
    t=$SECONDS
    py_args=()
    if [[ -n "${RDMA_SIDECAR_VM_TESTS:-}" ]]; then
        read -r -a py_args <<<"$RDMA_SIDECAR_VM_TESTS"
    fi
    log "== vm_ibverbs.py ${py_args[*]}"
    budget=$((${VM_TIMEOUT:-600} - (SECONDS - start) - 20))
    ((budget > 60)) || budget=60
    timeout -k 10 "$budget" /usr/bin/python3 "$src/tests/integration/vm_ibverbs.py" "${py_args[@]}" 2>&1 |
        tee "$VM_OUT/logs/vm_ibverbs.log"
    rc=${PIPESTATUS[0]}
    note=""
    ((rc != 77)) || note="(77 = skipped: a failure here)"
    ((rc != 124 && rc != 137)) || note="(timed out after ${budget}s)"
    record vm_ibverbs.py "$rc" $((SECONDS - t)) "$note"
fi

# Sidecar logs of every test (the harness keeps the work dirs with SC_KEEP_TMP=1).
for d in /tmp/sc-*/; do
    [[ -d "$d" ]] || continue
    for f in "$d"*/sidecar.log; do
        [[ -f "$f" ]] || continue
        n="$(basename "$d")-$(basename "$(dirname "$f")").log"
        cp "$f" "$VM_OUT/logs/$n" 2>/dev/null || true
    done
done

echo
log "summary ($((SECONDS - start))s in the guest):"
printf '  %s\n' "${results[@]}"
if ((failed)); then
    log "FAILED (logs in $VM_OUT/logs)"
    exit 1
fi
log "OK"
