#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gpu-kit.sh: build here, and pack into build-gpu-kit/ what a lent GPU machine needs to run the
# sidecar and its GPU checks. That machine has the NVIDIA driver and Python with grpcio, protobuf
# and PyTorch, and nothing else (no Debian libraries, no package registry); only the checkout travels
# there (64 MiB at most, with what is carried). The kit holds:
#   libexec/   rdma-sidecar, rdma-sidecar-ctl, sc-bench, c_client_read (stripped), nats-server
#   bin/       one wrapper per program: sets LD_LIBRARY_PATH to lib/ and execs it
#   lib/       their shared libraries that are not glibc's or the compiler runtime's (found with
#              ldd: gRPC, abseil, protobuf-c, nats.c, microhttpd, ibverbs, OpenSSL, GnuTLS...)
#   python/    the generated Python modules (build/python) the tests and the package import
#   tools/     gpu_probe.py (from ../shared/tools, when present)
#   tests/     the stand-in driver (libsc_fake_cuda.so), for `gpu-check.sh --stand-in` on a machine
#              without a GPU (it checks the kit and the check, nothing about GPUs)
#   MANIFEST   every file with its size, and the total
# On the GPU machine: `bash scripts/gpu-check.sh` (it finds build-gpu-kit/). build-gpu-kit/ matches
# .gitignore's /build*/, so it is carried explicitly, never committed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build
OUT=$ROOT/build-gpu-kit
MAX_MIB=40
DO_BUILD=1

usage() {
  cat <<EOF
usage: bash scripts/gpu-kit.sh [--build DIR] [--out DIR] [--max-mib N] [--no-build]

Builds the project (Release, -j2) and packs the kit for a GPU machine into --out.
  --build DIR    build directory (default: build)
  --out DIR      where the kit goes (default: build-gpu-kit; removed and remade)
  --max-mib N    fail when the kit is larger than N MiB (default: $MAX_MIB; the checkout and
                 what is carried must stay under 64 MiB together)
  --no-build     pack what --build already holds
Exit 0 with the kit made; 1 on any failure (the message says which step).
EOF
}

while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$(realpath -m "$2"); shift 2 ;;
    --out) OUT=$(realpath -m "$2"); shift 2 ;;
    --max-mib) MAX_MIB=$2; shift 2 ;;
    --no-build) DO_BUILD=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-kit: unknown argument $1 (see --help)" >&2; exit 1 ;;
  esac
done

die() { echo "gpu-kit: $*" >&2; exit 1; }

if [ "$DO_BUILD" = 1 ]; then
  echo "gpu-kit: building in $BUILD"
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null || die "cmake configure failed"
  cmake --build "$BUILD" -j2 >/dev/null || die "build failed (run cmake --build $BUILD to see why)"
fi

PROGS=("$BUILD/rdma-sidecar" "$BUILD/client/rdma-sidecar-ctl" "$BUILD/client/sc-bench" "$BUILD/client/c_client_read")
for p in "${PROGS[@]}"; do
  [ -x "$p" ] || die "$p is missing: build first (or drop --no-build)"
done
NATS=$(command -v nats-server || true)
[ -n "$NATS" ] || NATS=/usr/sbin/nats-server
[ -x "$NATS" ] || die "nats-server not found (Debian: nats-server)"

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/libexec" "$OUT/lib" "$OUT/python" "$OUT/tools" "$OUT/tests"

# glibc, the dynamic loader and the compiler runtime are the GPU machine's own (its glibc is newer
# than bookworm's, which is what lets these binaries run there); everything else travels.
is_system() {
  case "$(basename "$1")" in
    linux-vdso.so.*|ld-linux*.so.*|libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|\
    libresolv.so.*|libutil.so.*|libstdc++.so.*|libgcc_s.so.*|libcuda.so.*) return 0 ;;
  esac
  return 1
}

wrapper() { # NAME: bin/NAME runs libexec/NAME with lib/ first on the library path
  cat >"$OUT/bin/$1" <<'EOF'
#!/bin/sh
# A gpu-kit wrapper: the program beside in ../libexec, with the kit's libraries.
kit=$(dirname "$(readlink -f "$0")")/..
LD_LIBRARY_PATH="$kit/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$kit/libexec/$(basename "$0")" "$@"
EOF
  chmod 755 "$OUT/bin/$1"
}

for p in "${PROGS[@]}"; do
  n=$(basename "$p")
  cp "$p" "$OUT/libexec/$n"
  strip --strip-unneeded "$OUT/libexec/$n"
  wrapper "$n"
  # ldd prints "name => path (addr)" or "path (addr)"; keep the resolved paths.
  ldd "$p" | awk '/=>/ { if ($3 ~ /^\//) print $3; next } $1 ~ /^\// { print $1 }' | while read -r lib; do
    is_system "$lib" && continue
    dest="$OUT/lib/$(basename "$lib")"
    [ -e "$dest" ] && continue
    cp -L "$lib" "$dest"
    strip --strip-unneeded "$dest" 2>/dev/null || true
  done
done
ldd "$BUILD/rdma-sidecar" | grep -q "not found" && die "rdma-sidecar has unresolved libraries here: $(ldd "$BUILD/rdma-sidecar" | grep 'not found')"
cp "$NATS" "$OUT/libexec/nats-server"
wrapper nats-server

[ -d "$BUILD/python" ] || die "$BUILD/python (the generated Python modules) is missing"
cp -r "$BUILD/python/." "$OUT/python/"
find "$OUT/python" -name __pycache__ -prune -exec rm -rf {} +

[ -f "$BUILD/tests/libsc_fake_cuda.so" ] && cp "$BUILD/tests/libsc_fake_cuda.so" "$OUT/tests/"

PROBE=$ROOT/../shared/tools/gpu_probe.py
if [ -f "$PROBE" ]; then
  cp "$PROBE" "$OUT/tools/gpu_probe.py"
else
  echo "gpu-kit: note: $PROBE not found; gpu-check.sh will skip the driver probe"
fi

# Every library the kit's programs need resolves inside the kit or to a system library.
for p in "$OUT"/libexec/*; do
  [ "$(basename "$p")" = nats-server ] && continue
  missing=$(LD_LIBRARY_PATH="$OUT/lib" ldd "$p" | awk '/=>/ && $3 ~ /^\// { print $3 }' | while read -r lib; do
    is_system "$lib" || case "$lib" in "$OUT"/lib/*) ;; *) echo "$lib" ;; esac
  done)
  [ -z "$missing" ] || die "$(basename "$p") would still load from the system: $missing"
done

(cd "$OUT" && find . -type f -printf '%s\t%p\n' | sort -k2) >"$OUT/MANIFEST.tmp"
total=$(awk '{ s += $1 } END { print s }' "$OUT/MANIFEST.tmp")
{
  echo "# rdma-sidecar GPU kit, $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown), built $(date -u +%FT%TZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "# bytes path"
  cat "$OUT/MANIFEST.tmp"
  echo "# total $total bytes ($(( (total + 1048575) / 1048576 )) MiB), $(wc -l <"$OUT/MANIFEST.tmp") files"
} >"$OUT/MANIFEST"
rm -f "$OUT/MANIFEST.tmp"
mib=$(( (total + 1048575) / 1048576 ))
echo "gpu-kit: $OUT: $mib MiB in $(ls "$OUT/lib" | wc -l) libraries and $(ls "$OUT/libexec" | wc -l) programs (limit $MAX_MIB MiB)"
[ "$mib" -le "$MAX_MIB" ] || die "the kit is $mib MiB, over --max-mib $MAX_MIB"
echo "gpu-kit: on the GPU machine, carry build-gpu-kit and run: bash scripts/gpu-check.sh"
