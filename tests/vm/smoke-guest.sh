#!/usr/bin/env bash
# Guest script (run by tests/vm/run-in-vm.sh) checking the VM harness itself:
# the Soft-RoCE device is listed and active, its RoCEv2 GID is the one the
# harness exported, and perftest's ib_write_bw and ib_read_bw (server and
# client on the same rxe device, client connecting to $RXE_IP) complete with
# small sizes. Prints the perftest figures; exits non-zero on any failure.
set -euo pipefail

: "${RXE_DEV:?} ${RXE_IP:?} ${RXE_GID_INDEX:?} ${VM_SCRIPT_DIR:?}"

fail() {
    echo "smoke: FAIL: $*" >&2
    exit 1
}

start=$SECONDS

echo "== ibv_devices"
devices="$(timeout 30 ibv_devices)" || fail "ibv_devices failed"
echo "$devices"
grep -qw "$RXE_DEV" <<<"$devices" || fail "ibv_devices does not list $RXE_DEV"

echo "== ibv_devinfo -d $RXE_DEV"
info="$(timeout 30 ibv_devinfo -d "$RXE_DEV")" || fail "ibv_devinfo failed"
grep -E 'transport|state|active_mtu|link_layer' <<<"$info"
grep -q 'PORT_ACTIVE' <<<"$info" || fail "port 1 of $RXE_DEV is not active"

gid="$(cat "/sys/class/infiniband/$RXE_DEV/ports/1/gids/$RXE_GID_INDEX")"
gid_type="$(cat "/sys/class/infiniband/$RXE_DEV/ports/1/gid_attrs/types/$RXE_GID_INDEX")"
echo "GID[$RXE_GID_INDEX] = $gid ($gid_type)"
[[ "$gid" == "0000:0000:0000:0000:0000:ffff:0a63:0001" ]] || fail "GID $RXE_GID_INDEX is not $RXE_IP"

echo "== perftest on $RXE_DEV"
# shellcheck source=SCRIPTDIR/../../bench/vm-perftest.sh
. "$VM_SCRIPT_DIR/../../bench/vm-perftest.sh"
perf_start=$SECONDS
vmperf_main 64K:100 1M:10 || fail "perftest runs failed"

echo "smoke: OK (checks $((perf_start - start))s, perftest $((SECONDS - perf_start))s)"
