#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Guest script of the rails benchmark (issue 24; bench/run-vm-bench.sh rails ... runs it in the
# Soft-RoCE VM): builds two rails per side as tests/integration/vm_ibverbs.py second_rail does
# (rxe1 on v1 = 10.99.0.2 beside rxe0 on v0; a veth pair v2/v3 = 10.98.0.1/2 with rxe2/rxe3;
# policy routing so that traffic between the two addresses of a pair leaves by the veth and
# crosses its qdiscs), then runs bench/rails_bench.py with the arguments. Results: $VM_OUT/bench.txt
# (the table), $VM_OUT/bench.json, $VM_OUT/logs.
set -uo pipefail

: "${RXE_DEV:?} ${VM_OUT:?} ${VM_SCRIPT_DIR:?}"
src="$(cd "$VM_SCRIPT_DIR/.." && pwd)"
build="${SC_BUILD_DIR:-$src/build}"
export SC_SOURCE_DIR="$src"
export SC_BINARY="${SC_BINARY:-$build/rdma-sidecar}"
export SC_PYTHON_STUBS="${SC_PYTHON_STUBS:-$build/python}"
export SC_TEST_SLOW="${SC_TEST_SLOW:-2}"
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
unset SC_WRAPPER

set -e
ip addr replace 10.99.0.2/24 dev v1
ip link add v2 type veth peer name v3
ip addr replace 10.98.0.1/24 dev v2
ip addr replace 10.98.0.2/24 dev v3
ip link set v2 up
ip link set v3 up
rdma link add rxe1 type rxe netdev v1
rdma link add rxe2 type rxe netdev v2
rdma link add rxe3 type rxe netdev v3
for c in all default v0 v1 v2 v3; do
    echo 1 > /proc/sys/net/ipv4/conf/$c/accept_local
    echo 0 > /proc/sys/net/ipv4/conf/$c/rp_filter
done
route() { # table dst dev src
    ip route replace "$2" dev "$3" src "$4" table "$1"
    ip rule add pref "$1" iif lo from "$4" to "$2" lookup "$1"
}
route 10 10.99.0.2 v0 10.99.0.1
route 11 10.99.0.1 v1 10.99.0.2
route 12 10.98.0.2 v2 10.98.0.1
route 13 10.98.0.1 v3 10.98.0.2
for x in "10.99.0.2 v0 v1" "10.99.0.1 v1 v0" "10.98.0.2 v2 v3" "10.98.0.1 v3 v2"; do
    read -r addr dev peer <<<"$x"
    ip neigh replace "$addr" lladdr "$(cat "/sys/class/net/$peer/address")" dev "$dev" nud permanent
done
ip rule add pref 1000 lookup local
ip rule del pref 0
set +e
for i in $(seq 50); do # the RoCE v2 GIDs of the new addresses
    grep -qs 0000:0000:0000:0000:0000:ffff:0a62:0002 /sys/class/infiniband/rxe3/ports/1/gids/* && break
    sleep 0.2
done
echo "guest-rails-bench: $(ibv_devices | tr -s ' \n' ' '), $(nproc) vCPUs"

cd /tmp || exit 1
budget=$((${VM_TIMEOUT:-1200} - 15))
timeout -k 10 "$budget" /usr/bin/python3 "$src/bench/rails_bench.py" --json "$VM_OUT/bench.json" \
    --log-dir "$VM_OUT/logs" "$@" | tee "$VM_OUT/bench.txt"
rc=${PIPESTATUS[0]}
((rc != 124 && rc != 137)) || echo "guest-rails-bench: timed out after ${budget}s" >&2
exit "$rc"
