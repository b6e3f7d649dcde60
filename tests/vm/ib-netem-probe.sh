#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Guest script (bash tests/vm/run-in-vm.sh tests/vm/ib-netem-probe.sh): can netem act on RoCE
# traffic in the VM? A second rxe device (rxe1) on the veth peer v1 (10.99.0.2), policy routing so
# that traffic between 10.99.0.1 and 10.99.0.2 leaves by the veth instead of lo, then ib_write_bw /
# ib_read_lat rxe0 -> rxe1 without and with netem on v0, and the qdisc's packet counters.
# Prints what the kernel did; exit 0 when RoCE traffic crossed the qdisc and the delay showed.
set -uo pipefail
: "${RXE_IP:?}"
IP2=10.99.0.2
say() { printf 'ib-netem: %s\n' "$*"; }
run() { say "\$ $*"; timeout 60 "$@" 2>&1; }

run ip addr add "$IP2/24" dev v1
run rdma link add rxe1 type rxe netdev v1
for c in all default v0 v1; do
    sysctl -qw "net.ipv4.conf.$c.accept_local=1" "net.ipv4.conf.$c.rp_filter=0"
done
# Locally generated traffic between the two addresses goes out by the veth (iif lo = locally
# generated); what arrives on a veth end is still delivered locally (the local table, moved after).
run ip route add "$IP2" dev v0 src "$RXE_IP" table 10
run ip route add "$RXE_IP" dev v1 src "$IP2" table 11
run ip rule add pref 10 iif lo from "$RXE_IP" to "$IP2" lookup 10
run ip rule add pref 11 iif lo from "$IP2" to "$RXE_IP" lookup 11
run ip rule add pref 1000 lookup local
run ip rule del pref 0
run ip rule show
run ip route get "$IP2" from "$RXE_IP"
run rdma link show
sleep 1
gid2=""
for i in 0 1 2 3; do
    g="$(cat /sys/class/infiniband/rxe1/ports/1/gids/$i 2>/dev/null)"
    say "rxe1 gid $i: $g"
    [[ "$g" == *"0a63:0002" ]] && gid2=$i
done
say "rxe1 IPv4 GID index: ${gid2:-none}"
g1="${RXE_GID_INDEX:-1}"

bw() { # label
    timeout 60 ib_write_bw -d rxe1 -x "${gid2:-1}" -s 65536 -n 200 -F >/tmp/srv.log 2>&1 &
    local s=$!
    sleep 2
    say "== $1: ib_write_bw rxe0 -> rxe1 ($IP2)"
    timeout 60 ib_write_bw -d rxe0 -x "$g1" -s 65536 -n 200 -F "$IP2" 2>&1 | tail -4
    say "client exit ${PIPESTATUS[0]}"
    wait "$s"; say "server exit $?"; tail -3 /tmp/srv.log
    timeout 60 ib_read_lat -d rxe1 -x "${gid2:-1}" -s 64 -n 50 -F >/tmp/srv2.log 2>&1 &
    s=$!
    sleep 2
    say "== $1: ib_read_lat rxe0 -> rxe1"
    timeout 60 ib_read_lat -d rxe0 -x "$g1" -s 64 -n 50 -F "$IP2" 2>&1 | tail -3
    wait "$s"
    run tc -s qdisc show dev v0
    run ip -s link show v0
}
bw "no qdisc"
run tc qdisc add dev v0 root netem delay 20ms
run tc qdisc add dev v1 root netem delay 20ms
bw "netem delay 20ms on v0 and v1"
run tc qdisc change dev v0 root netem loss 5%
run tc qdisc change dev v1 root netem loss 5%
bw "netem loss 5% on v0 and v1"
say done
