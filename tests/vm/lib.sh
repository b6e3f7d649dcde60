# Shared helpers for the Soft-RoCE VM harness (sourced by install-deps.sh,
# build-initramfs.sh and run-in-vm.sh; not run on its own): cache location,
# the Debian kernel package to boot, logging and a cache lock.
# shellcheck shell=bash

VM_CACHE="${RDMA_SIDECAR_VM_CACHE:-/var/cache/rdma-sidecar-vm}"

vm_log() {
    printf 'vm: %s\n' "$*" >&2
}

vm_die() {
    printf 'vm: error: %s\n' "$*" >&2
    exit 1
}

# Name of the versioned kernel image package the linux-image-amd64
# metapackage depends on (e.g. linux-image-6.1.0-56-amd64). Falls back to the
# newest kernel already unpacked in the cache when apt knows no such package.
vm_kernel_pkg() {
    local pkg
    pkg="$(apt-cache depends linux-image-amd64 2>/dev/null |
        sed -n 's/^ *Depends: <\{0,1\}\(linux-image-[0-9][^ >]*\)>\{0,1\}$/\1/p' | head -n 1)"
    if [[ -z "$pkg" && -d "$VM_CACHE/kernel" ]]; then
        pkg="$(find "$VM_CACHE/kernel" -mindepth 2 -maxdepth 2 -name .complete -printf '%h\n' |
            xargs -r -n 1 basename | sort -V | tail -n 1)"
    fi
    [[ -n "$pkg" ]] || return 1
    printf '%s\n' "$pkg"
}

# Directory the kernel package is unpacked into.
vm_kernel_dir() {
    printf '%s/kernel/%s\n' "$VM_CACHE" "$1"
}

# Kernel release (uname -r) of an unpacked kernel tree.
vm_kernel_release() {
    local root="$1" mods
    for mods in "$root/lib/modules" "$root/usr/lib/modules"; do
        if [[ -d "$mods" ]]; then
            find "$mods" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort -V | tail -n 1
            return 0
        fi
    done
    return 1
}

# Take an exclusive lock on the cache for the rest of the calling script (fd 9),
# so concurrent harness runs (ctest -j) do not download or build one thing twice.
vm_lock_cache() {
    mkdir -p "$VM_CACHE"
    exec 9>"$VM_CACHE/.lock"
    flock -w 900 9 || vm_die "timed out waiting for the lock on $VM_CACHE"
}

# Decompresses the ELF vmlinux out of a bzImage (xz, zstd or gzip payload),
# so QEMU can boot it through its PVH entry point: this skips the real-mode
# setup and in-guest decompression, about 5 s under TCG. Returns 1 when no
# payload decompresses to an ELF file.
vm_extract_vmlinux() {
    local img="$1" out="$2" magic tool off
    for magic in 'xz:\xFD7zXZ\x00' 'zstd:\x28\xB5\x2F\xFD' 'gzip:\x1F\x8B\x08'; do
        tool="${magic%%:*}"
        command -v "$tool" >/dev/null || continue
        while read -r off; do
            case "$tool" in
            xz) tail -c +"$((off + 1))" "$img" | xz -dc --single-stream >"$out.tmp" 2>/dev/null || true ;;
            zstd) tail -c +"$((off + 1))" "$img" | zstd -qdc >"$out.tmp" 2>/dev/null || true ;;
            gzip) tail -c +"$((off + 1))" "$img" | gzip -dc >"$out.tmp" 2>/dev/null || true ;;
            esac
            if [[ "$(head -c 4 "$out.tmp" | od -An -tx1 | tr -d ' \n')" == 7f454c46 ]]; then
                mv "$out.tmp" "$out"
                return 0
            fi
        done < <(LC_ALL=C grep -obUaP "${magic#*:}" "$img" | cut -d: -f1)
    done
    rm -f "$out.tmp"
    return 1
}
