#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Guest script of the netem scenarios (ctest vm.netem via tests/vm/test-vm.sh with
# RDMA_SIDECAR_VM_GUEST=netem-guest.sh; runs inside the VM that run-in-vm.sh boots, whose Debian
# kernel has sch_netem, as root, in a read-only chroot of the host's root at the repository root):
# tests/integration/vm_netem.py, two sidecars in two network namespaces over a veth pair with netem
# (1% loss, 5% loss, 20 ms +-10 ms delay with reordering): a READ and a WRITE of SC_NETEM_MIB MiB
# each, bytes compared, beside iperf3 under the same qdisc. Sidecar work dirs go to /tmp, regions to
# /dev/shm (tmpfs in the guest). Exit: vm_netem.py's (77, no netem, counts as a failure here).
set -uo pipefail

: "${VM_OUT:?}"
src="$(cd "${VM_SCRIPT_DIR:?}/../.." && pwd)"
build="${SC_BUILD_DIR:-$src/build}"
export SC_BINARY="${SC_BINARY:-$build/rdma-sidecar}"
export SC_PYTHON_STUBS="${SC_PYTHON_STUBS:-$build/python}"
export SC_TEST_TMP=/tmp/sc-test SC_TEST_SLOW="${SC_TEST_SLOW:-2}"
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
unset SC_WRAPPER
[[ -x "$SC_BINARY" ]] || { echo "netem-guest: FAIL: no sidecar binary at $SC_BINARY"; exit 1; }

budget=$((${VM_TIMEOUT:-600} - 20))
timeout -k 10 "$budget" /usr/bin/python3 "$src/tests/integration/vm_netem.py" 2>&1 | tee "$VM_OUT/vm_netem.log"
rc=${PIPESTATUS[0]}
((rc != 77)) || { echo "netem-guest: FAIL: skipped inside the VM (no sch_netem or no ip netns?)"; rc=1; }
((rc != 124 && rc != 137)) || echo "netem-guest: FAIL: timed out after ${budget}s"
echo "netem-guest: exit $rc"
exit "$rc"
