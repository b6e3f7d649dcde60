#!/usr/bin/env bash
# Builds the test VM's initramfs (gzip'd newc cpio): static busybox, the
# kernel modules Soft-RoCE and the 9p shares need (copied from the unpacked
# Debian kernel tree, in the dependency order that depmod/modprobe compute
# against that tree) and guest-init.sh as /init.
# Usage: build-initramfs.sh [KERNEL_DIR]   (default: what install-deps.sh unpacked)
# The image is cached under $RDMA_SIDECAR_VM_CACHE/initramfs/, keyed on the
# kernel release and a hash of its inputs; prints the image path on stdout.
# RDMA_SIDECAR_VM_EXTRA_MODULES: more module names to load, space separated.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/lib.sh
. "$here/lib.sh"

# crc32_generic first: rdma_rxe needs the "crc32" crypto algorithm but does
# not depend on a module for it, and without it `rdma link add` fails ENOENT.
# sch_netem: loss, delay and reordering for tests/vm/netem-guest.sh.
modules=(crc32_generic virtio_pci 9pnet_virtio 9p veth rdma_rxe ib_uverbs rdma_ucm sch_netem)
read -r -a extra <<<"${RDMA_SIDECAR_VM_EXTRA_MODULES:-}"
modules+=("${extra[@]}")

kdir="${1:-}"
if [[ -z "$kdir" ]]; then
    kpkg="$(vm_kernel_pkg)" || vm_die "no kernel package known; run install-deps.sh"
    kdir="$(vm_kernel_dir "$kpkg")"
fi
[[ -f "$kdir/.complete" ]] || vm_die "no unpacked kernel in $kdir; run install-deps.sh"
kver="$(vm_kernel_release "$kdir")" || vm_die "no modules in $kdir"

busybox="$(command -v busybox || true)"
[[ -n "$busybox" ]] || vm_die "busybox not found (apt-get install busybox-static)"
if ldd "$busybox" >/dev/null 2>&1; then
    vm_die "$busybox is dynamically linked (apt-get install busybox-static)"
fi

key="$(cat "$here/build-initramfs.sh" "$here/guest-init.sh" "$busybox" |
    { sha256sum; printf '%s\n' "${modules[@]}"; } | sha256sum | cut -c1-12)"
image="$VM_CACHE/initramfs/initramfs-$kver-$key.cpio.gz"
if [[ -f "$image" ]]; then
    printf '%s\n' "$image"
    exit 0
fi

vm_lock_cache
if [[ -f "$image" ]]; then
    printf '%s\n' "$image"
    exit 0
fi
vm_log "building $image"

# depmod -b expects <base>/lib/modules; newer Debian kernels use /usr/lib/modules.
if [[ ! -d "$kdir/lib/modules" && -d "$kdir/usr/lib/modules" ]]; then
    ln -s usr/lib "$kdir/lib"
fi
depmod -b "$kdir" "$kver"

stage="$(mktemp -d "$VM_CACHE/.initramfs.XXXXXX")"
trap 'rm -rf "$stage" "$stage.cpio.gz"' EXIT
mkdir -p "$stage"/{bin,dev,proc,sys,host,rohost,out,tmp,root,lib/modules}
cp "$busybox" "$stage/bin/busybox"
install -m 0755 "$here/guest-init.sh" "$stage/init"
mknod -m 600 "$stage/dev/console" c 5 1

# modprobe --show-depends prints "insmod PATH" lines, dependencies first.
declare -A seen=()
order=()
for m in "${modules[@]}"; do
    deps="$(modprobe -d "$kdir" -S "$kver" --show-depends "$m")" ||
        vm_die "module $m not found for $kver"
    while read -r verb path _; do
        [[ "$verb" == insmod ]] || continue
        name="$(basename "$path")"
        name="${name%%.ko*}"
        [[ -z "${seen[$name]:-}" ]] || continue
        seen[$name]=1
        case "$path" in
        *.ko) cp "$path" "$stage/lib/modules/$name.ko" ;;
        *.ko.xz) xz -dc "$path" >"$stage/lib/modules/$name.ko" ;;
        *.ko.zst) zstd -qdc "$path" >"$stage/lib/modules/$name.ko" ;;
        *.ko.gz) gzip -dc "$path" >"$stage/lib/modules/$name.ko" ;;
        *) vm_die "unknown module file $path" ;;
        esac
        order+=("$name")
    done <<<"$deps"
done
printf '%s\n' "${order[@]}" >"$stage/lib/modules/order"
vm_log "modules: ${order[*]}"

mkdir -p "$VM_CACHE/initramfs"
(cd "$stage" && find . -mindepth 1 -print0 | LC_ALL=C sort -z |
    cpio --null -o -H newc -R 0:0 --quiet) | gzip -6n >"$stage.cpio.gz"
mv "$stage.cpio.gz" "$image"
# Images of older harness versions: drop those unused for a week.
find "$VM_CACHE/initramfs" -name 'initramfs-*.cpio.gz' ! -name "${image##*/}" -mtime +7 -delete
printf '%s\n' "$image"
