# SPDX-License-Identifier: Apache-2.0
"""The generated protobuf and gRPC modules that ship inside the package (rdma_sidecar.v1, made by
generate.py from proto/ at build and install time; never edited by hand)."""
try:
    from .v1 import sidecar_pb2 as pb  # noqa: F401
    from .v1 import sidecar_pb2_grpc as pb_grpc  # noqa: F401
except ImportError as e:  # pragma: no cover - a source checkout that was never built
    raise ImportError("rdma_sidecar: the generated modules rdma_sidecar.v1.sidecar_pb2/_grpc are missing (%s): "
                      "install the package (pip install --no-build-isolation ./clients/python) or run "
                      "`python3 clients/python/generate.py` (the CMake build does)" % e) from e
