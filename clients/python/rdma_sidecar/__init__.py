# SPDX-License-Identifier: Apache-2.0
"""rdma_sidecar: the Python client of rdma-sidecar, with the concepts of Dynamo's nixl_connect.

    import rdma_sidecar as rs
    async with rs.Connector() as c:                      # $RDMA_SIDECAR_ADDR or the default socket
        t = await c.zeros((4, 1024), torch.float16)      # a tensor in a sidecar region (zero copy)
        async with await c.create_readable(rs.Descriptor(t)) as op:
            await c.publish("kv.ready", op)              # or hand op.metadata over any channel
            await op.wait_for_completion()

The peer: `op = await c.begin_read(event.metadata, rs.Descriptor(dst)); await op.wait_for_completion()`.
rdma_sidecar.sync has the same API, blocking. Errors are SidecarError (.code, .message) subclasses.
"""
import pkgutil as _pkgutil

# The generated modules (v1/, _health/) ship inside an installed package. In a source checkout they
# live under the build directory instead (build/python/rdma_sidecar/, made by the CMake build, never
# written into the source tree): with that directory on sys.path too, this finds them there.
__path__ = _pkgutil.extend_path(__path__, __name__)
from ._deps import check_versions as _check_versions  # noqa: E402
_check_versions()  # grpcio and protobuf in the supported range (pyproject.toml), else ImportError
from .connector import (ANY_USES, Backend, Connector, MetadataEvent, Operation, OperationKind, OperationState,  # noqa: F401
                        OperationStatus, PassiveOperation, ReadableOperation, ReadOperation, Subscription,
                        TransferRequirement, WritableOperation, WriteOperation)
from .errors import (CancelledError, DeadlineExceededError, FailedPreconditionError, InvalidArgumentError,  # noqa: F401
                     NotFoundError, PermissionDeniedError, ResourceExhaustedError, SidecarError, UnavailableError)
from .memory import Descriptor, NotInRegionError, Region  # noqa: F401
from .fast import FastCompletion, FastPath  # noqa: F401
from .kv import KVBlocks, StridedRun, metadata_descriptor_lengths  # noqa: F401

__version__ = "0.1.0"
__all__ = ["ANY_USES", "Backend", "Connector", "MetadataEvent", "Operation", "OperationKind", "OperationState",
           "OperationStatus", "PassiveOperation", "ReadableOperation", "ReadOperation", "Subscription",
           "TransferRequirement", "WritableOperation", "WriteOperation", "CancelledError", "DeadlineExceededError",
           "FailedPreconditionError", "InvalidArgumentError", "NotFoundError", "PermissionDeniedError",
           "ResourceExhaustedError", "SidecarError", "UnavailableError", "Descriptor", "NotInRegionError", "Region",
           "FastCompletion", "FastPath", "KVBlocks", "StridedRun", "metadata_descriptor_lengths"]
