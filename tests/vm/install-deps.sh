#!/usr/bin/env bash
# Installs what the Soft-RoCE VM harness needs on the host (Debian packages:
# QEMU, busybox, kmod, cpio, rdma-core, ibverbs, perftest, iproute2) and
# downloads and unpacks (does not install) the stock Debian kernel that
# linux-image-amd64 points at into the cache
# (${RDMA_SIDECAR_VM_CACHE:-/var/cache/rdma-sidecar-vm}/kernel/<package>/).
# Idempotent and non-interactive; waits for a dpkg lock held by another apt.
# Prints the unpacked kernel directory on stdout.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/lib.sh
. "$here/lib.sh"

packages=(qemu-system-x86 busybox-static kmod cpio rdma-core ibverbs-providers
    ibverbs-utils libibverbs-dev perftest iproute2 util-linux coreutils xz-utils)

apt_opts=(-y -q -o DPkg::Lock::Timeout=600 -o Acquire::Retries=3)
export DEBIAN_FRONTEND=noninteractive

missing_packages() {
    local p
    for p in "${packages[@]}"; do
        if ! dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
            printf '%s\n' "$p"
        fi
    done
}

# apt-get update at most once per run, and only when something is missing.
updated=0
apt_update() {
    if ((updated == 0)); then
        apt-get "${apt_opts[@]}" update >&2
        updated=1
    fi
}

mapfile -t missing < <(missing_packages)
if ((${#missing[@]} > 0)); then
    vm_log "installing: ${missing[*]}"
    if ! apt-get "${apt_opts[@]}" install --no-install-recommends "${missing[@]}" >&2; then
        apt_update
        apt-get "${apt_opts[@]}" install --no-install-recommends "${missing[@]}" >&2
    fi
fi

vm_lock_cache

kpkg="$(vm_kernel_pkg || true)"
if [[ -z "$kpkg" ]]; then
    apt_update
    kpkg="$(vm_kernel_pkg)" || vm_die "apt knows no linux-image-amd64 dependency"
fi
kdir="$(vm_kernel_dir "$kpkg")"

# Downloads and unpacks kernel package $1 into $2.
fetch_kernel() {
    local pkg="$1" dir="$2" work kver
    vm_log "downloading and unpacking $pkg into $dir"
    work="$(mktemp -d "$VM_CACHE/.dl.XXXXXX")"
    # As root: apt's sandbox user (_apt) cannot write into a mktemp dir.
    if ! (cd "$work" && apt-get -q -o APT::Sandbox::User=root download "$pkg" >&2); then
        rm -rf "$work"
        return 1
    fi
    mkdir -p "$work/tree"
    dpkg-deb -x "$work"/"$pkg"_*.deb "$work/tree" || vm_die "cannot unpack $pkg"
    kver="$(vm_kernel_release "$work/tree")" || vm_die "no modules in $pkg"
    [[ -f "$work/tree/boot/vmlinuz-$kver" ]] || vm_die "no vmlinuz-$kver in $pkg"
    touch "$work/tree/.complete"
    rm -rf "$dir"
    mkdir -p "$(dirname "$dir")"
    mv "$work/tree" "$dir" || vm_die "cannot move the kernel into $dir"
    rm -rf "$work"
}

if [[ ! -f "$kdir/.complete" ]] && ! fetch_kernel "$kpkg" "$kdir"; then
    # Stale package lists name a kernel the mirror no longer has.
    apt_update
    kpkg="$(vm_kernel_pkg)" || vm_die "apt knows no linux-image-amd64 dependency"
    kdir="$(vm_kernel_dir "$kpkg")"
    [[ -f "$kdir/.complete" ]] || fetch_kernel "$kpkg" "$kdir" || vm_die "cannot download $kpkg"
fi

# The uncompressed kernel, for a faster (PVH) boot; run-in-vm.sh falls back
# to vmlinuz without it. Also done for trees unpacked by older versions.
kver="$(vm_kernel_release "$kdir")"
if [[ ! -f "$kdir/boot/vmlinux-$kver" ]] && grep -q '^CONFIG_PVH=y' "$kdir/boot/config-$kver"; then
    vm_extract_vmlinux "$kdir/boot/vmlinuz-$kver" "$kdir/boot/vmlinux-$kver" ||
        vm_log "could not extract vmlinux from vmlinuz-$kver; booting the compressed kernel"
fi

printf '%s\n' "$kdir"
