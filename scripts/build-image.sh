#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build the rdma-sidecar container image with podman, from Debian packages only:
#   scripts/build-image.sh [TAG]          (default TAG: rdma-sidecar:<version>)
# 1. The base, debian:bookworm-slim: used when podman already has it (pulled or built before);
#    otherwise bootstrapped here with `mmdebstrap --variant=minbase bookworm` (docs, man pages and
#    locales left out, as in the official slim image) and `podman import`ed under that name.
#    SC_IMAGE_MIRROR picks the Debian mirror (default: the one in this machine's apt sources).
# 2. The CUDA headers for GPU support (the Dockerfile says why the build host's): cuda.h from
#    SC_CUDA_INCLUDE (a directory), else $CUDA_HOME/include, else /usr/local/cuda/include; CUDA
#    12.0 or newer. Only cuda.h is copied, into a temporary directory passed to the build as the
#    named context cuda-include; it stays in the build stage, never in the image.
#    SC_IMAGE_GPU=off builds without GPU support instead (--build-arg GPU=off).
# 3. `podman build --isolation chroot` of the Dockerfile (chroot isolation: no runc/crun, which the
#    sandboxes these tests run in refuse), with the version and commit as build arguments; they
#    end up in the image's OCI labels.
# On a normal machine docker builds the same Dockerfile (the base then comes from a registry):
#   docker build --build-context cuda-include=/usr/local/cuda/include .
# Exit 0 with the image built; 3 when podman or mmdebstrap is missing, the base cannot be
# bootstrapped (no Debian mirror) or no CUDA 12+ cuda.h is found, saying why; other codes: the build
# failed.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(sed -n 's/^project(rdma-sidecar VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
tag=${1:-rdma-sidecar:$version}
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [[ "$commit" != unknown ]] && ! git diff --quiet HEAD -- 2>/dev/null; then
  commit="$commit-dirty"
fi
base=debian:bookworm-slim
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

command -v podman >/dev/null || { echo "build-image: podman is not installed (Debian: podman)"; exit 3; }

if ! podman image exists "$base"; then
  command -v mmdebstrap >/dev/null ||
    { echo "build-image: $base is not in podman's storage and mmdebstrap is not installed (Debian: mmdebstrap)"; exit 3; }
  # The Debian mirror of this machine's apt sources (deb822 or one-line format), or SC_IMAGE_MIRROR.
  mirror=${SC_IMAGE_MIRROR:-$(sed -n 's/^URIs: *\([^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)}
  mirror=${mirror:-$(sed -n 's/^deb  *\([^ ]*\/debian\)  *bookworm .*/\1/p' /etc/apt/sources.list 2>/dev/null | head -1)}
  if [[ -z "$mirror" ]]; then
    echo "build-image: no Debian mirror in /etc/apt/sources.list*: set SC_IMAGE_MIRROR"
    exit 3
  fi
  echo "build-image: bootstrapping $base with mmdebstrap from $mirror"
  if ! mmdebstrap --variant=minbase \
         --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
         --dpkgopt='path-include=/usr/share/doc/*/copyright' \
         --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
         bookworm "$tmp/rootfs.tar" "deb $mirror bookworm main" "deb $mirror bookworm-updates main" \
         >"$tmp/mmdebstrap.log" 2>&1; then
    tail -5 "$tmp/mmdebstrap.log"
    echo "build-image: mmdebstrap could not bootstrap bookworm from $mirror (no network to the mirror?)"
    exit 3
  fi
  podman import --change 'CMD ["bash"]' "$tmp/rootfs.tar" "$base" >/dev/null
  echo "build-image: imported $base ($(du -m "$tmp/rootfs.tar" | cut -f1) MiB tar)"
fi

gpu_args=()
case "${SC_IMAGE_GPU:-required}" in
  off)
    gpu_args=(--build-arg GPU=off)
    gpu="off (SC_IMAGE_GPU=off)" ;;
  required)
    inc=${SC_CUDA_INCLUDE:-${CUDA_HOME:+$CUDA_HOME/include}}
    inc=${inc:-/usr/local/cuda/include}
    if [[ ! -f "$inc/cuda.h" ]]; then
      echo "build-image: no cuda.h in $inc: GPU support needs the CUDA 12+ driver API header at build time" \
           "(set SC_CUDA_INCLUDE or CUDA_HOME, install NVIDIA's cuda-driver-dev-12-*, or SC_IMAGE_GPU=off)"
      exit 3
    fi
    cuda=$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$inc/cuda.h" | head -1)
    if [[ -z "$cuda" || "$cuda" -lt 12000 ]]; then
      have="of unknown version (no CUDA_VERSION)"
      [[ -n "$cuda" ]] && have="$((cuda / 1000)).$((cuda % 1000 / 10)) (CUDA_VERSION $cuda)"
      echo "build-image: $inc/cuda.h is CUDA $have; the sidecar needs 12.0 or newer"
      exit 3
    fi
    mkdir "$tmp/cuda-include"
    cp "$inc/cuda.h" "$tmp/cuda-include/"
    gpu_args=(--build-context "cuda-include=$tmp/cuda-include")
    gpu="CUDA $((cuda / 1000)).$((cuda % 1000 / 10)) headers from $inc" ;;
  *)
    echo "build-image: SC_IMAGE_GPU must be required or off, not '$SC_IMAGE_GPU'"
    exit 2 ;;
esac

echo "build-image: building $tag (version $version, commit $commit, GPU support: $gpu)"
podman build --isolation chroot --build-arg "VERSION=$version" --build-arg "COMMIT=$commit" \
  "${gpu_args[@]}" -t "$tag" .
podman image inspect --format 'build-image: {{.Id}} {{.Size}} bytes' "$tag"
