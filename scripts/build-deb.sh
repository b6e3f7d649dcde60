#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build the Debian package of rdma-sidecar for this machine's Debian (bookworm):
#   bash scripts/build-deb.sh            -> build/deb/rdma-sidecar_<version>-1_<arch>.deb
# One package: the daemon (/usr/bin/rdma-sidecar), rdma-sidecar-ctl, librdma-sidecar-client with
# its header and pkg-config file, the man pages (help2man), the C example's source, and a systemd
# unit for bare-metal and VM nodes (rdma-sidecar.service, LimitMEMLOCK=infinity, settings in the
# conffile /etc/default/rdma-sidecar; packaging/deb/ holds these files). Install it with
#   apt-get install ./build/deb/rdma-sidecar_<version>-1_<arch>.deb
# which pulls its dependencies (computed here by dpkg-shlibdeps).
# Built with CMake (prefix /usr, Release) in build/deb/cmake, staged in build/deb/root, packed with
# dpkg-deb: nothing is written outside build/. Needs the build dependencies (scripts/install-deps.sh)
# and dpkg-dev. Exit 0 with the package built.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
out=$src/build/deb
bld=$out/cmake
root=$out/root
jobs=${SC_JOBS:-$(nproc)}

for tool in cmake dpkg-deb dpkg-shlibdeps help2man; do
  command -v "$tool" >/dev/null || { echo "build-deb: $tool is missing (bash scripts/install-deps.sh installs it)"; exit 3; }
done

version=$(sed -n 's/^project(rdma-sidecar VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
arch=$(dpkg --print-architecture)
debver=$version-1

cmake -S . -B "$bld" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr >"$out.cmake.log" 2>&1 ||
  { tail -20 "$out.cmake.log"; echo "build-deb: cmake configure failed ($out.cmake.log)"; exit 1; }
cmake --build "$bld" -j"$jobs" --target rdma-sidecar rdma-sidecar-ctl rdma_sidecar_client man

rm -rf "$root"
DESTDIR=$root cmake --install "$bld" --strip >/dev/null
# Debian keeps man pages compressed and a copyright file beside the docs.
find "$root/usr/share/man" -type f -name '*.[0-9]' -exec gzip -9n {} +
install -D -m 0644 packaging/deb/rdma-sidecar.service "$root/lib/systemd/system/rdma-sidecar.service"
install -D -m 0644 packaging/deb/rdma-sidecar.default "$root/etc/default/rdma-sidecar"
install -D -m 0644 packaging/deb/copyright "$root/usr/share/doc/rdma-sidecar/copyright"
install -d "$root/DEBIAN"
install -m 0755 packaging/deb/postinst packaging/deb/prerm packaging/deb/postrm "$root/DEBIAN/"
echo /etc/default/rdma-sidecar >"$root/DEBIAN/conffiles"
libdir=$(cd "$root" && dirname "$(find usr/lib* -name 'librdma-sidecar-client.so.0' | head -1)")
echo "librdma-sidecar-client 0 rdma-sidecar (>= $version)" >"$root/DEBIAN/shlibs"
echo "activate-noawait ldconfig" >"$root/DEBIAN/triggers"

# Dependencies: dpkg-shlibdeps over the binaries, in a scratch debian/ tree (it wants one).
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/debian"
printf 'Source: rdma-sidecar\n\nPackage: rdma-sidecar\nArchitecture: any\n' >"$scratch/debian/control"
ln -s "$root" "$scratch/debian/rdma-sidecar"
deps=$(cd "$scratch" && dpkg-shlibdeps -O -l"$root/$libdir" -Sdebian/rdma-sidecar \
         debian/rdma-sidecar/usr/bin/rdma-sidecar debian/rdma-sidecar/usr/bin/rdma-sidecar-ctl \
         "debian/rdma-sidecar/$libdir/librdma-sidecar-client.so.0" 2>"$out.shlibdeps.log" |
       sed -n 's/^shlibs:Depends=//p' | sed 's/\(^\|, \)rdma-sidecar ([^)]*)//; s/^, //')
[[ -n "$deps" ]] || { cat "$out.shlibdeps.log"; echo "build-deb: dpkg-shlibdeps found no dependencies"; exit 1; }
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CONTROL
Package: rdma-sidecar
Version: $debver
Architecture: $arch
Maintainer: rdma-sidecar developers <rdma-sidecar@invalid>
Installed-Size: $size
Depends: $deps, passwd
Recommends: ibverbs-providers, libfabric1
Section: net
Priority: optional
Description: moves memory between ML pipeline workers over RDMA or TCP
 rdma-sidecar runs beside every worker of a distributed (ML) pipeline. Workers, in any
 language, register memory with it over gRPC (a unix socket), expose ranges to a remote
 worker as signed metadata, and the sidecars move the bytes NIC to memory (ibverbs where
 both have an RDMA NIC, TCP otherwise).
 .
 This package holds the daemon and its systemd unit, rdma-sidecar-ctl, and the C client
 library librdma-sidecar-client with its header and pkg-config file.
CONTROL

deb=$out/rdma-sidecar_${debver}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "build-deb: $deb"
