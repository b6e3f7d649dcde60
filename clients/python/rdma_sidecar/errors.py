# SPDX-License-Identifier: Apache-2.0
"""Errors: every failure the sidecar reports is raised as a SidecarError carrying the gRPC status
code and the sidecar's own message (which says what was wrong and what to do). Subclasses name the
common cases so callers can catch them alone."""
from typing import Optional

import grpc


class SidecarError(Exception):
    """A failed sidecar call or operation: `.code` (grpc.StatusCode) and `.message` (the sidecar's)."""

    def __init__(self, code: grpc.StatusCode, message: str, operation_id: Optional[str] = None):
        self.code = code
        self.message = message
        self.operation_id = operation_id
        where = " (operation %s)" % operation_id if operation_id else ""
        super().__init__("%s: %s%s" % (code.name, message, where))


class InvalidArgumentError(SidecarError, ValueError):
    """INVALID_ARGUMENT: a malformed request, metadata or out-of-bounds range."""


class NotFoundError(SidecarError, LookupError):
    """NOT_FOUND: an unknown region or operation id."""


class PermissionDeniedError(SidecarError, PermissionError):
    """PERMISSION_DENIED or UNAUTHENTICATED: metadata for another sidecar, or badly signed."""


class FailedPreconditionError(SidecarError):
    """FAILED_PRECONDITION: expired or used metadata, a busy region, no signing key."""


class DeadlineExceededError(SidecarError, TimeoutError):
    """DEADLINE_EXCEEDED: an operation's deadline (or a wait's timeout) passed."""


class ResourceExhaustedError(SidecarError):
    """RESOURCE_EXHAUSTED: a configured limit was reached."""


class UnavailableError(SidecarError, ConnectionError):
    """UNAVAILABLE: the sidecar, its peer or NATS cannot be reached, or the sidecar is draining."""


class CancelledError(SidecarError):
    """CANCELLED: the operation (or the call) was cancelled."""


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: PermissionDeniedError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.CANCELLED: CancelledError,
}
_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}


def error_for(code: grpc.StatusCode, message: str, operation_id: Optional[str] = None) -> SidecarError:
    """The SidecarError subclass for a status code."""
    return _BY_CODE.get(code, SidecarError)(code, message, operation_id)


def from_rpc_error(e: grpc.RpcError) -> SidecarError:
    """A grpc.RpcError (sync or aio) as a SidecarError."""
    return error_for(e.code(), e.details() or "")


def from_operation_error(code: int, message: str, operation_id: str) -> SidecarError:
    """An Operation.error (a numeric google.rpc.Code) as a SidecarError."""
    return error_for(_BY_VALUE.get(code, grpc.StatusCode.UNKNOWN), message, operation_id)
