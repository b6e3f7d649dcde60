#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs every Debian bookworm package that building, running and testing rdma-sidecar needs.
# Used by the README, .ci/run and the Dockerfile. Idempotent; run as root (or with sudo).
#   scripts/install-deps.sh            build + test dependencies
#   scripts/install-deps.sh --runtime  only what the daemon needs at run time (container image)
#   scripts/install-deps.sh --image-build  only what building the daemon needs (the image's build stage)
set -euo pipefail

# No rdma-core at run time: its udev rules and daemons are the host's business, and it pulls in
# udev and perl (~60 MB of the image); libibverbs1 + ibverbs-providers are the verbs user space.
runtime=(libgrpc29 libprotobuf-c1 libnats3.4 libssl3 libmicrohttpd12 libibverbs1 ibverbs-providers
         libfabric1   # the libfabric backend (sidecar/ofi/: EFA, cxi, verbs, tcp providers)
         libhwloc15   # the PCIe topology of the rails (sidecar/os/topology.c)
         man-db)  # `man rdma-sidecar` in the image (the page is built with help2man)
build=(build-essential cmake pkg-config git
       libgrpc-dev protobuf-c-compiler libprotobuf-c-dev libssl-dev libnats-dev libmicrohttpd-dev
       libibverbs-dev rdma-core ibverbs-providers ibverbs-utils
       libfabric-dev libfabric-bin   # sidecar/ofi/ and its tests (fi_info, fi_pingpong)
       libhwloc-dev hwloc   # topology.c; hwloc's lstopo/hwloc-info write and check the XML fixtures
       nats-server python3 python3-grpcio python3-protobuf protobuf-compiler protobuf-compiler-grpc
       protoc-gen-go protoc-gen-go-grpc   # test_proto_contract.py: Go code from the proto, no flags
       python3-setuptools python3-pip python3-wheel python3-venv python3-numpy python3-torch python3-pytest
       iproute2 iptables procps psmisc valgrind clang libclang-rt-14-dev
       openssl   # the openssl CLI: test_security_listen.py makes its CA and certificates
       nodejs   # test_reflection.py's reflection client and the manifest validator (tests/node)
       prometheus   # promtool: test_metrics_promtool.py checks /metrics with it; test_prometheus_dashboard.py runs it
       python3-yaml   # test_deploy_manifests.py reads the rendered manifests
       python3-matplotlib   # the benchmarks' plots (bench/plot.py: throughput and latency against size)
       mkdocs mkdocs-material   # the documentation site (docs/, mkdocs.yml; ctest docs.site)
       help2man   # the man pages rdma-sidecar(8) and rdma-sidecar-ctl(1) (build/man; ctest docs.man)
       dpkg-dev   # dpkg-shlibdeps: scripts/build-deb.sh computes the .deb's Depends
       podman mmdebstrap)  # scripts/build-image.sh and the image test (tests/image); the .deb test (tests/packaging)
# The Soft-RoCE VM test and the benchmarks.
vm=(qemu-system-x86 busybox-static kmod cpio perftest iperf3 ucx-utils)

# The image's build stage: the daemon only (no tests, clients, VM or benchmarks).
image_build=(build-essential cmake pkg-config libgrpc-dev protobuf-c-compiler libprotobuf-c-dev
             libssl-dev libnats-dev libmicrohttpd-dev libibverbs-dev libhwloc-dev libfabric-dev
             help2man)  # the man page rdma-sidecar(8)

pkgs=("${build[@]}" "${vm[@]}")
if [[ "${1:-}" == "--runtime" ]]; then
  pkgs=("${runtime[@]}")
elif [[ "${1:-}" == "--image-build" ]]; then
  pkgs=("${image_build[@]}")
fi

# kubectl (test_deploy_manifests.py: `kubectl kustomize`): not in Debian bookworm; installed when an
# apt source offers it (Kubernetes' or Google Cloud's repository), else that test is skipped.
if [[ -z "${1:-}" ]] && ! command -v kubectl >/dev/null &&
   apt-cache show kubectl >/dev/null 2>&1; then
  pkgs+=(kubectl)
fi

# npm: Debian's package, unless npm came with nodejs already (NodeSource's nodejs ships it and
# conflicts with Debian's npm).
if [[ -z "${1:-}" ]] && ! command -v npm >/dev/null; then
  pkgs+=(npm)
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=600 "${missing[@]}"
