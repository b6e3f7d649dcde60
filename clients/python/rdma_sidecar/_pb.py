# SPDX-License-Identifier: Apache-2.0
"""The generated protobuf and gRPC modules that ship inside the package (rdma_sidecar.v1, made by
generate.py from proto/ at install time, or by the CMake build under build/python; never edited by hand).
The supported grpcio/protobuf range is checked by _deps, at package import."""
from ._deps import SUPPORTED, check_versions  # noqa: F401  (checked once, at package import)

try:
    from .v1 import sidecar_pb2 as pb  # noqa: F401,E402
    from .v1 import sidecar_pb2_grpc as pb_grpc  # noqa: F401,E402
except ImportError as e:  # pragma: no cover - a source checkout that was never built
    raise ImportError("rdma_sidecar: the generated modules rdma_sidecar.v1.sidecar_pb2/_grpc are missing (%s): "
                      "install the package (/usr/bin/python3 -m pip install --no-build-isolation ./clients/python), or "
                      "use this checkout with its build: cmake --build build, then put build/python on "
                      "PYTHONPATH beside clients/python" % e) from e
