#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build the Python client's wheel:
#   bash scripts/build-wheel.sh          -> build/wheel/rdma_sidecar-<version>-py3-none-any.whl
# Pure Python (py3-none-any): it carries the generated protobuf/gRPC modules (rdma_sidecar/v1,
# rdma_sidecar/_health, made from proto/ with protoc and grpc_python_plugin while building), so it
# installs anywhere Python >= 3.9 runs (a venv, conda, uv, a pip-torch image) with only
#   pip install rdma_sidecar-<version>-py3-none-any.whl
# and grpcio and protobuf in the range pyproject.toml states (checked again at import).
# Needs, here only: python3 with pip, setuptools and wheel, protoc and grpc_python_plugin (Debian:
# scripts/install-deps.sh). Offline: no build isolation, no index. Nothing is written into the
# source tree (setup.py builds in a temporary directory); the wheel is checked before exit 0.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/wheel
py=${PYTHON:-/usr/bin/python3}
mkdir -p "$out"
rm -f "$out"/rdma_sidecar-*.whl
"$py" -m pip wheel -q --no-build-isolation --no-index --no-deps --wheel-dir "$out" ./clients/python
whl=$(ls "$out"/rdma_sidecar-*-py3-none-any.whl 2>/dev/null | head -1)
[[ -n "$whl" ]] || { echo "build-wheel: no py3-none-any wheel in $out"; ls "$out"; exit 1; }
# The generated modules must be inside, and the supported range in its metadata.
"$py" - "$whl" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["rdma_sidecar/v1/sidecar_pb2.py", "rdma_sidecar/v1/sidecar_pb2_grpc.py",
        "rdma_sidecar/_health/health_pb2.py", "rdma_sidecar/_health/health_pb2_grpc.py"]
missing = [n for n in need if n not in names]
if missing:
    sys.exit("build-wheel: %s lacks %s" % (sys.argv[1], ", ".join(missing)))
meta = next(zipfile.ZipFile(sys.argv[1]).read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
for dep in ("Requires-Dist: grpcio", "Requires-Dist: protobuf"):
    if dep not in meta:
        sys.exit("build-wheel: the wheel's METADATA has no %s" % dep)
PY
echo "build-wheel: $whl"
