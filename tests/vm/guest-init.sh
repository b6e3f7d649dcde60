#!/bin/busybox sh
# PID 1 of the Soft-RoCE test VM (busybox sh; build-initramfs.sh installs it
# as /init). Loads the modules listed in /lib/modules/order, mounts the host
# root read-only (9p tag "host") and the writable results share (9p tag "out"),
# creates veth v0/v1 with 10.99.0.1/24 on v0 and the rxe0 Soft-RoCE device on
# v0, then chroots into the host root and runs the job script that
# run-in-vm.sh left in the share. Output goes to the console and to
# <share>/guest.log; the exit code to <share>/.vm/exit-code. Always ends with
# the marker line "RDMA_SIDECAR_VM_DONE rc=N" and a forced power-off.
# shellcheck shell=sh

PATH=/bin
export PATH
MARKER=RDMA_SIDECAR_VM_DONE
NINEP=trans=virtio,version=9p2000.L,msize=262144
RXE_DEV=rxe0
RXE_IP=10.99.0.1
share_ok=0

/bin/busybox --install -s /bin

finish() {
    if [ "$share_ok" = 1 ]; then
        echo "$1" >/out/.vm/exit-code
    fi
    sync
    echo "$MARKER rc=$1"
    poweroff -f
    sleep 5
    exit "$1"
}

fail() {
    echo "vm-init: error: $*"
    finish 1
}

# "rdma_sidecar.debug" on the kernel command line: time each stage.
debug=0
stamp() {
    if [ "$debug" = 1 ]; then
        read -r up _ </proc/uptime
        echo "vm-init: [${up}s] $*"
    fi
}

# Bounded helpers: nothing in the guest may hang the VM.
t() {
    timeout 60 "$@"
}

in_host() {
    t chroot /host /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
case " $(cat /proc/cmdline) " in
*" rdma_sidecar.debug "*) debug=1 ;;
esac
stamp "init started"

while read -r mod; do
    t insmod "/lib/modules/$mod.ko" || fail "insmod $mod failed"
done </lib/modules/order
stamp "modules loaded"

t mount -t 9p -o "$NINEP" out /out || fail "cannot mount the results share"
[ -f /out/.vm/init.conf ] || fail "no .vm/init.conf in the results share"
share_ok=1
# Written by run-in-vm.sh: VM_OUT_PATH, VM_CWD, VM_SHOW (space-separated).
# shellcheck disable=SC1091
. /out/.vm/init.conf

t mount -t 9p -o "$NINEP,cache=loose,ro" host /host || fail "cannot mount the host root"
# A second view of the host root, so host paths that the tmpfs mounts below
# hide (a cwd under /tmp) can be shown again.
mount --bind /host /rohost

t mount -t proc proc /host/proc || fail "mount proc"
t mount -t sysfs sysfs /host/sys || fail "mount sysfs"
t mount -t devtmpfs devtmpfs /host/dev || fail "mount devtmpfs"
mkdir -p /host/dev/shm /host/dev/pts
t mount -t tmpfs -o mode=1777 tmpfs /host/dev/shm || fail "mount /dev/shm"
t mount -t devpts -o newinstance,ptmxmode=0666 devpts /host/dev/pts || fail "mount devpts"
for d in /tmp /var/tmp /run; do
    if [ -d "/host$d" ]; then
        t mount -t tmpfs -o mode=1777 tmpfs "/host$d" || fail "mount tmpfs on $d"
    fi
done
# The cwd and the directories the caller asked for (an out-of-tree build dir)
# under those tmpfs mounts: show the host's (read-only) at the same path.
for p in $VM_CWD ${VM_SHOW:-}; do
    case "$p" in
    /tmp/* | /var/tmp/* | /run/*)
        [ -d "/rohost$p" ] || fail "cannot show $p: not a directory on the host"
        mkdir -p "/host$p" 2>/dev/null
        t mount --bind "/rohost$p" "/host$p" || fail "cannot show $p"
        ;;
    esac
done
stamp "file systems mounted"
mkdir -p "/host$VM_OUT_PATH" 2>/dev/null
t mount --bind /out "/host$VM_OUT_PATH" || fail "cannot mount the share at $VM_OUT_PATH"

in_host ip link set lo up || fail "lo up"
in_host ip link add v0 type veth peer name v1 || fail "veth"
in_host ip addr add "$RXE_IP/24" dev v0 || fail "address on v0"
in_host ip link set v0 up || fail "v0 up"
in_host ip link set v1 up || fail "v1 up"
in_host rdma link add "$RXE_DEV" type rxe netdev v0 || fail "rdma link add $RXE_DEV"

stamp "rxe added"
# The GID table fills asynchronously; find the RoCEv2 IPv4-mapped GID of RXE_IP.
want=0000:0000:0000:0000:0000:ffff:0a63:0001
gid_index=
tries=0
while [ -z "$gid_index" ] && [ "$tries" -lt 100 ]; do
    for f in "/sys/class/infiniband/$RXE_DEV/ports/1/gids/"*; do
        if [ "$(cat "$f" 2>/dev/null)" = "$want" ]; then
            gid_index=${f##*/}
            break
        fi
    done
    [ -n "$gid_index" ] || sleep 0.1
    tries=$((tries + 1))
done
[ -n "$gid_index" ] || fail "no GID for $RXE_IP on $RXE_DEV"
read -r up _ </proc/uptime
echo "vm-init: $RXE_DEV ready on v0 ($RXE_IP, GID index $gid_index) at ${up}s"

(
    chroot /host /usr/bin/env -i \
        RXE_DEV="$RXE_DEV" RXE_IP="$RXE_IP" RXE_GID_INDEX="$gid_index" \
        /bin/bash "$VM_OUT_PATH/.vm/job.sh"
    echo "$?" >/out/.vm/exit-code
) 2>&1 | tee /out/guest.log

rc=$(cat /out/.vm/exit-code 2>/dev/null)
case "$rc" in
'' | *[!0-9]*) rc=1 ;;
esac
finish "$rc"
