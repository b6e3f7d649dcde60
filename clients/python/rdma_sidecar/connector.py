# SPDX-License-Identifier: Apache-2.0
"""The asyncio client (grpc.aio): Connector and the four operation kinds, with the names and shape
of Dynamo's nixl_connect.

A Connector is one gRPC channel to this worker's own sidecar (created on first use, on the running
event loop) plus what the worker holds through it: the regions it allocated or registered and the
operations it started. close() (or leaving `async with Connector() as c:`) releases the operations
and deregisters the regions, so nothing stays allocated in the sidecar after a failure.
"""
import asyncio
import dataclasses
import enum
import logging
import mmap
import os
import time
from typing import Any, AsyncIterator, Dict, List, Optional, Sequence, Union

import grpc
import grpc.aio

from . import errors, kv
from ._pb import pb, pb_grpc
from .memory import (Descriptor, NotInRegionError, Region, as_descriptors, buffer_address, is_numpy_array,
                     is_torch_tensor)

DEFAULT_ADDRESS = "unix:/tmp/rdma-sidecar/sidecar.sock"
ADDRESS_ENV = "RDMA_SIDECAR_ADDR"
# Seconds the first call waits for a sidecar that is not up yet (a worker started before it).
WAIT_ENV = "RDMA_SIDECAR_WAIT_FOR_READY"
# A failed connection is tried again after 0.1 s, then at most 1 s apart (gRPC's default backs off
# from 1 s to 120 s): the sidecar is local and an attempt is cheap, so a worker waiting for it sees
# it within a second of it coming up.
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 1000)]
_log = logging.getLogger("rdma_sidecar")


def wait_for_ready_default(value: Optional[float]) -> float:
    """wait_for_ready as given, else $RDMA_SIDECAR_WAIT_FOR_READY, else 0 (no waiting)."""
    where = "wait_for_ready"
    if value is None:
        env = os.environ.get(WAIT_ENV, "").strip()
        if not env:
            return 0.0
        where = WAIT_ENV
        try:
            value = float(env)
        except ValueError:
            raise ValueError("%s=%r: not a number of seconds (e.g. 30)" % (WAIT_ENV, env)) from None
    if not value >= 0:
        raise ValueError("%s must be >= 0 seconds, not %r" % (where, value))
    return float(value)


def not_ready_error(address: str, waited: float) -> errors.UnavailableError:
    return errors.UnavailableError(
        grpc.StatusCode.UNAVAILABLE,
        "the sidecar at %s was not ready after waiting %.1f s: is it running, and is the address right? "
        "(address= or %s; wait longer with wait_for_ready= or %s)" % (address, waited, ADDRESS_ENV, WAIT_ENV))



# create_readable/create_writable(uses=ANY_USES): any number of uses until the deadline.
ANY_USES = -1

class OperationStatus(enum.IntEnum):
    """nixl_connect.OperationStatus, plus SCHEDULED (waiting for worker progress)."""
    UNINITIALIZED = 0
    INITIALIZED = 1
    IN_PROGRESS = 2
    COMPLETE = 3
    CANCELLED = 4
    ERRORED = 5
    SCHEDULED = 6

    @property
    def terminal(self) -> bool:
        """COMPLETE, CANCELLED and ERRORED are final."""
        return self in (OperationStatus.COMPLETE, OperationStatus.CANCELLED, OperationStatus.ERRORED)


class OperationKind(enum.IntEnum):
    """What an operation does: READABLE/WRITABLE expose memory, READ/WRITE move bytes."""
    UNSPECIFIED = 0
    READABLE = 1
    WRITABLE = 2
    READ = 3
    WRITE = 4


class Backend(enum.IntEnum):
    """The transport: TCP between sidecars, IBVERBS (RDMA), LOCAL (same sidecar)."""
    UNSPECIFIED = 0
    TCP = 1
    IBVERBS = 2
    LOCAL = 3


@dataclasses.dataclass(frozen=True)
class TransferRequirement:
    """Keep an active operation SCHEDULED until the worker reports this progress
    (Connector.report_progress): `iteration` complete, or `layer` of it when given."""
    request_id: str
    iteration: int
    layer: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class OperationState:
    """One step of an operation's progress, as Operation.watch() yields it."""
    status: OperationStatus
    bytes_done: int
    bytes_total: int
    backend: Backend


@dataclasses.dataclass(frozen=True)
class MetadataEvent:
    """Verified metadata that arrived on a NATS subject (Connector.subscribe())."""
    subject: str
    metadata: str
    issuer: str
    kind: OperationKind
    descriptor_lengths: List[int]
    expires_unix_ms: int


MetadataLike = Union[str, MetadataEvent, "PassiveOperation"]


def _metadata_text(m: MetadataLike) -> str:
    if isinstance(m, str):
        return m
    if isinstance(m, (MetadataEvent, PassiveOperation)):
        return m.metadata
    raise TypeError("metadata must be the rsm1. text, a MetadataEvent or a passive operation, not %s"
                    % type(m).__name__)


class Operation:
    """What every operation offers: its id and state, waiting, cancelling, progress and disposal
    (`async with op:` releases it on exit, as nixl_connect's operations do)."""

    def __init__(self, connector: "Connector", proto: Any, descriptors: Sequence[Descriptor]):
        self._connector = connector
        self._proto = proto
        self._descriptors = list(descriptors)  # keeps the memory alive while the operation is
        self._released = False

    # ---- state ----
    @property
    def id(self) -> str:
        """The sidecar's operation id."""
        return self._proto.operation_id

    @property
    def proto(self) -> Any:
        """The last Operation message seen (rdma_sidecar.v1.sidecar_pb2.Operation)."""
        return self._proto

    @property
    def status(self) -> OperationStatus:
        """The status as last seen (refresh(), wait_for_completion() and watch() update it)."""
        return OperationStatus(self._proto.status)

    @property
    def kind(self) -> OperationKind:
        """READABLE, WRITABLE, READ or WRITE."""
        return OperationKind(self._proto.kind)

    @property
    def backend(self) -> Backend:
        """The transport that moves (or moved) the bytes; UNSPECIFIED until one is chosen."""
        return Backend(self._proto.backend)

    @property
    def peer(self) -> str:
        """The other sidecar's id (active: the metadata's issuer; passive: who used it, once known)."""
        return self._proto.peer

    @property
    def backend_reason(self) -> str:
        """Why this backend, in words (e.g. "ibverbs unavailable on peer, using tcp")."""
        return self._proto.backend_reason

    @property
    def trace_id(self) -> str:
        """The W3C trace id (32 hex digits) of the operation's log lines on both sidecars: the
        `traceparent` it was created with, else a new one (a readable or writable created without
        one takes the first transfer's). See docs/operations/logs.md."""
        return self._proto.trace_id

    @property
    def bytes_total(self) -> int:
        """Bytes the operation covers (the sum of its descriptors' lengths)."""
        return self._proto.bytes_total

    @property
    def bytes_done(self) -> int:
        """Bytes moved so far, as last seen."""
        return self._proto.bytes_done

    @property
    def rails(self) -> List[Any]:
        """Active operations: the rails the transfer used, as last seen (RailUsage messages, each
        .rail and .bytes); empty until bytes move, and for LOCAL. refresh() updates it."""
        return list(self._proto.rails)

    @property
    def error(self) -> Optional[errors.SidecarError]:
        """Why the operation ERRORED or was CANCELLED (None otherwise)."""
        if self._proto.status in (pb.OPERATION_STATUS_ERRORED, pb.OPERATION_STATUS_CANCELLED) and self._proto.error.code:
            return errors.from_operation_error(self._proto.error.code, self._proto.error.message, self.id)
        return None

    def _update(self, proto: Any) -> OperationStatus:
        self._proto = proto
        return self.status

    # ---- calls ----
    async def refresh(self) -> OperationStatus:
        """GetOperation: the current status."""
        return self._update(await self._connector._call("GetOperation", pb.GetOperationRequest(operation_id=self.id)))

    async def wait_for_completion(self, timeout: Optional[float] = None) -> OperationStatus:
        """Waits until the operation is terminal; returns COMPLETE. Raises the operation's error
        (a SidecarError subclass, CancelledError when cancelled) when it ERRORED or was cancelled,
        and DeadlineExceededError when `timeout` seconds pass first (the operation goes on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.status.terminal:
            step = 5.0 if deadline is None else min(5.0, deadline - time.monotonic())
            if step <= 0:
                raise errors.DeadlineExceededError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    "operation still %s after wait_for_completion(timeout=%s)" % (self.status.name, timeout), self.id)
            ms = max(1, int(step * 1000))
            self._update(await self._connector._call(
                "WaitOperation", pb.WaitOperationRequest(operation_id=self.id, timeout_ms=ms),
                timeout=ms / 1000 + self._connector.rpc_timeout))
        if self.status != OperationStatus.COMPLETE:
            raise self.error or errors.error_for(
                grpc.StatusCode.CANCELLED if self.status == OperationStatus.CANCELLED else grpc.StatusCode.UNKNOWN,
                "operation %s" % self.status.name.lower(), self.id)
        return self.status

    async def cancel(self) -> OperationStatus:
        """CancelOperation (the peer's operation ends too); cancelling a terminal one changes nothing.
        Returns once the operation is terminal: the sidecar no longer touches its memory. Answers
        within the sidecar's --cancel-wait (1 s): a transfer that has not stopped by then raises
        FailedPreconditionError saying how it will end; wait_for_completion() then tells when."""
        return self._update(await self._connector._call("CancelOperation",
                                                        pb.CancelOperationRequest(operation_id=self.id)))

    async def release(self) -> None:
        """Disposal: cancels the operation if it is not terminal and makes the sidecar forget it."""
        if self._released:
            return
        self._released = True
        self._connector._ops.pop(self.id, None)
        try:
            await self._connector._call("ReleaseOperation", pb.ReleaseOperationRequest(operation_id=self.id))
        except errors.NotFoundError:
            pass  # already gone (released elsewhere, or the sidecar forgot it)

    async def watch(self) -> AsyncIterator[OperationState]:
        """WatchOperation: the current state, then every change, ending after the terminal one."""
        call = self._connector._stub().WatchOperation(pb.WatchOperationRequest(operation_id=self.id))
        try:
            async for proto in call:
                self._update(proto)
                yield OperationState(self.status, proto.bytes_done, proto.bytes_total, Backend(proto.backend))
        except grpc.aio.AioRpcError as e:
            raise errors.from_rpc_error(e) from None
        finally:
            call.cancel()

    async def __aenter__(self) -> "Operation":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.release()

    def __repr__(self) -> str:
        return "%s(%s, %s, %d/%d bytes)" % (type(self).__name__, self.id, self.status.name, self.bytes_done,
                                            self.bytes_total)


class PassiveOperation(Operation):
    """A READABLE or WRITABLE operation: local memory exposed to one remote peer."""

    @property
    def metadata(self) -> str:
        """The signed "rsm1." text to hand to the peer (publish() sends it over NATS)."""
        return self._proto.metadata


class ReadableOperation(PassiveOperation):
    """Local memory a remote worker may read (Connector.create_readable)."""


class WritableOperation(PassiveOperation):
    """Local memory a remote worker may write into (Connector.create_writable)."""


class ReadOperation(Operation):
    """Pulls a remote readable into local memory (Connector.begin_read)."""


class WriteOperation(Operation):
    """Pushes local memory into a remote writable (Connector.begin_write)."""


class Subscription:
    """Verified metadata arriving on a NATS subject through the sidecar: `async for event in sub`.
    `await sub.ready()` returns once the sidecar has subscribed (publish after it); close() ends it."""

    def __init__(self, connector: "Connector", subject: str, queue_group: Optional[str]):
        self._connector = connector
        self._req = pb.SubscribeMetadataRequest(subject=subject, queue_group=queue_group or "")
        self._call: Any = None
        self._pending: Optional[asyncio.Future] = None

    def _start(self) -> Any:
        if self._call is None:
            self._call = self._connector._stub().SubscribeMetadata(self._req)
            self._connector._subs.add(self)
        return self._call

    async def ready(self) -> "Subscription":
        """Waits until the sidecar's NATS subscription is in place."""
        try:
            await self._start().initial_metadata()
        except grpc.aio.AioRpcError as e:
            raise errors.from_rpc_error(e) from None
        if self._call.done():
            code = await self._call.code()
            raise errors.error_for(code, await self._call.details() or "subscription ended")
        return self

    def __aiter__(self) -> "Subscription":
        return self

    async def __anext__(self) -> MetadataEvent:
        return await self.next()

    async def next(self, timeout: Optional[float] = None) -> MetadataEvent:
        """The next event; DeadlineExceededError after `timeout` seconds (None: wait for ever), the
        subscription staying in place; StopAsyncIteration once it has ended."""
        call = self._start()
        # One read in flight, never cancelled by a timeout: cancelling a read would end the RPC.
        if self._pending is None:
            self._pending = asyncio.ensure_future(call.read())
        done, _ = await asyncio.wait({self._pending}, timeout=timeout)
        if not done:
            raise errors.DeadlineExceededError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                               "no metadata on %s within %ss" % (self._req.subject, timeout))
        task, self._pending = self._pending, None
        try:
            ev = task.result()
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED and call.cancelled():
                raise StopAsyncIteration from None
            raise errors.from_rpc_error(e) from None
        except asyncio.CancelledError:
            raise StopAsyncIteration from None
        if ev is grpc.aio.EOF:
            code = await call.code()
            if code not in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED):
                raise errors.error_for(code, await call.details() or "")
            raise StopAsyncIteration
        return MetadataEvent(ev.subject, ev.metadata, ev.issuer, OperationKind(ev.kind),
                             list(ev.descriptor_lengths), ev.expires_unix_ms)

    def close(self) -> None:
        """Ends the subscription (the sidecar unsubscribes from NATS)."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if self._call is not None:
            self._call.cancel()
        self._connector._subs.discard(self)

    async def __aenter__(self) -> "Subscription":
        return await self.ready()

    async def __aexit__(self, *exc: Any) -> None:
        self.close()


def quiet_grpc_poller(loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
    """Silences grpcio's spurious "BlockingIOError in PollerCompletionQueue._handle_events" on `loop`
    (default: the running one). grpc.aio wakes every event loop of the process that uses it; all but
    one find nothing to read and log that harmless error (grpc/grpc#25364). A Connector calls this
    for its loop unless the loop already has an exception handler."""
    loop = loop or asyncio.get_running_loop()
    previous = loop.get_exception_handler()

    def handler(lp: asyncio.AbstractEventLoop, context: dict) -> None:
        if isinstance(context.get("exception"), BlockingIOError) and \
                "PollerCompletionQueue" in str(context.get("handle", "")):
            return
        if previous is not None:
            previous(lp, context)
        else:
            lp.default_exception_handler(context)
    loop.set_exception_handler(handler)


def _health_messages() -> tuple:
    """HealthCheckRequest/Response. The package's generated health module is imported only when no
    other module (grpcio-health-checking, a test's own stubs) has defined grpc.health.v1 already:
    protobuf refuses a second definition of the same message names from another file."""
    from google.protobuf import descriptor_pool, symbol_database
    try:
        descriptor_pool.Default().FindMessageTypeByName("grpc.health.v1.HealthCheckRequest")
    except KeyError:
        from ._health import health_pb2  # noqa: F401  (registers the messages)
    db = symbol_database.Default()
    return db.GetSymbol("grpc.health.v1.HealthCheckRequest"), db.GetSymbol("grpc.health.v1.HealthCheckResponse")


def _resolve_numpy_dtype(dtype: Any) -> Any:
    import numpy as np
    return np.dtype(dtype)


def _is_torch_dtype(dtype: Any) -> bool:
    try:
        import torch
    except ImportError:
        return False
    return isinstance(dtype, torch.dtype)


class Connector:
    """The client of this worker's own sidecar (asyncio; rdma_sidecar.sync.Connector blocks).

    address: a gRPC target ("unix:/path" or "host:port"); default $RDMA_SIDECAR_ADDR, else
    unix:/tmp/rdma-sidecar/sidecar.sock. rpc_timeout: seconds each unary call may take.
    wait_for_ready: seconds the first call waits for a sidecar that is not up yet (failed
    connections retried at most 1 s apart; a warning on the "rdma_sidecar" logger says it waits);
    default $RDMA_SIDECAR_WAIT_FOR_READY, else 0: a missing sidecar fails the call at once
    (UnavailableError). When the time passes: UnavailableError naming the address and the wait."""

    def __init__(self, address: Optional[str] = None, rpc_timeout: float = 30.0,
                 wait_for_ready: Optional[float] = None):
        self.address = address or os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS
        self.rpc_timeout = rpc_timeout
        self.wait_for_ready = wait_for_ready_default(wait_for_ready)
        self._ready = self.wait_for_ready == 0
        self._channel: Any = None
        self._stub_obj: Any = None
        self._regions: Dict[str, Region] = {}
        self._cuda_regions: Dict[tuple, Region] = {}
        self._ops: Dict[str, Operation] = {}
        self._subs: set = set()

    # ---- plumbing ----
    def _stub(self) -> Any:
        if self._stub_obj is None:
            loop = asyncio.get_running_loop()
            if loop.get_exception_handler() is None:
                quiet_grpc_poller(loop)
            self._channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
            self._stub_obj = pb_grpc.SidecarStub(self._channel)
        return self._stub_obj

    async def _channel_ready(self, timeout: float) -> bool:
        """Whether the channel connects within `timeout` seconds (failed attempts retried)."""
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def wait_ready(self, timeout: Optional[float] = None) -> None:
        """Waits up to `timeout` seconds (default: wait_for_ready) for the sidecar to accept a
        connection; UnavailableError (naming the address and the wait) when the time passes.
        Calls do this by themselves the first time when wait_for_ready is set."""
        t = self.wait_for_ready if timeout is None else float(timeout)
        self._stub()
        start = time.monotonic()
        if not await self._channel_ready(min(0.2, t)):
            _log.warning("rdma_sidecar: waiting up to %.1f s for the sidecar at %s", t, self.address)
            if not await self._channel_ready(max(0.0, t - (time.monotonic() - start))):
                raise not_ready_error(self.address, time.monotonic() - start)
        self._ready = True

    async def _call(self, method: str, req: Any, timeout: Optional[float] = None, traceparent: str = "") -> Any:
        if not self._ready:
            await self.wait_ready()
        # traceparent: a W3C traceparent header, sent as gRPC metadata (the sidecar reads it).
        md = (("traceparent", traceparent),) if traceparent else None
        try:
            return await getattr(self._stub(), method)(req, timeout=timeout or self.rpc_timeout, metadata=md)
        except grpc.aio.AioRpcError as e:
            raise errors.from_rpc_error(e) from None

    async def _unary(self, path: str, req: Any, resp_cls: Any) -> Any:
        """A unary call outside the Sidecar service (the health check)."""
        if not self._ready:
            await self.wait_ready()
        self._stub()
        call = self._channel.unary_unary(path, request_serializer=type(req).SerializeToString,
                                         response_deserializer=resp_cls.FromString)
        try:
            return await call(req, timeout=self.rpc_timeout)
        except grpc.aio.AioRpcError as e:
            raise errors.from_rpc_error(e) from None

    async def _close_channel(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "Connector":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Releases this connector's operations, ends its subscriptions, deregisters its regions
        (unmapping them) and closes the channel. Errors on the way are ignored: it runs after failures."""
        for sub in list(self._subs):
            sub.close()
        if self._stub_obj is None:
            return
        for op in list(self._ops.values()):
            try:
                await op.release()
            except errors.SidecarError:
                pass
        for region in list(self._regions.values()):
            try:
                await self._deregister(region, force=True)
            except errors.SidecarError:
                pass
        await self._close_channel()
        self._channel = self._stub_obj = None

    # ---- the sidecar ----
    async def info(self) -> Any:
        """GetInfo: the sidecar's id, version, backends, NATS state, GPUs (a SidecarInfo message),
        and its data plane's layout: .rails (RailInfo: name, backend, state, pci_address,
        numa_node, rate_mbps, detail, counters), .topology (MemoryRails: one row per GPU ("gpu 0")
        and NUMA node ("numa 1"), every rail nearest first with its PCIe distance class, and
        .chosen, the rails that memory goes through) and .topology_source."""
        return await self._call("GetInfo", pb.GetInfoRequest())

    async def connect_peer(self, metadata: MetadataLike, timeout_ms: int = 0) -> Any:
        """ConnectPeer: sets up the connections to the sidecar that issued `metadata` (rsm1. text,
        a MetadataEvent or a passive operation; checked, not used up) before the first transfer, on
        every backend both sides offer. timeout_ms bounds the setup (0: the sidecar's 10 s).
        Returns the ConnectPeerResponse: .peer (the issuer's sidecar id) and .paths (PeerPath:
        backend, ready, detail, elapsed_us); a backend that could not connect is a path with
        ready False. Bad, expired or foreign metadata raises (InvalidArgument, ...) and so does a
        peer that cannot be reached (Unavailable) or does not answer in time (DeadlineExceeded)."""
        if timeout_ms < 0:
            raise ValueError("timeout_ms must be >= 0, not %r" % (timeout_ms,))
        req = pb.ConnectPeerRequest(metadata=_metadata_text(metadata), timeout_ms=int(timeout_ms))
        # The call's own deadline: the setup's bound plus the usual call timeout.
        return await self._call("ConnectPeer", req, timeout=(timeout_ms or 10000) / 1000.0 + self.rpc_timeout)

    async def health(self) -> str:
        """The gRPC health service's answer: "SERVING", "NOT_SERVING" (draining)..."""
        req_cls, resp_cls = _health_messages()
        r = await self._unary("/grpc.health.v1.Health/Check", req_cls(), resp_cls)
        return resp_cls.DESCRIPTOR.enum_types_by_name["ServingStatus"].values_by_number[r.status].name

    async def list_regions(self) -> List[Any]:
        """ListRegions: every region the sidecar holds (Region messages), not only this connector's."""
        return list((await self._call("ListRegions", pb.ListRegionsRequest())).regions)

    async def list_operations(self) -> List[Any]:
        """ListOperations: every operation the sidecar holds (Operation messages)."""
        return list((await self._call("ListOperations", pb.ListOperationsRequest())).operations)

    # ---- memory ----
    async def create_region(self, size: int, name: str = "") -> Region:
        """A host region of `size` bytes, mapped into this process (Region.memoryview())."""
        proto = await self._call("CreateRegion", pb.CreateRegionRequest(size=size, name=name))
        try:
            with open(proto.path, "r+b") as f:
                mm = mmap.mmap(f.fileno(), proto.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            await self._call("DeregisterRegion", pb.DeregisterRegionRequest(region_id=proto.region_id))
            raise
        region = Region(proto, mm)
        self._regions[region.region_id] = region
        return region

    async def empty(self, shape: Any, dtype: Any = "float32", device: str = "cpu", name: str = "") -> Any:
        """An uninitialised array in sidecar memory, zero-copy for transfers.

        A torch dtype (torch.float16...) gives a PyTorch tensor, anything else a NumPy array.
        device "cpu": backed by a new host region (mmap of the region file). device "cuda[:N]"
        (torch only): a CUDA tensor, registered with the sidecar by IPC handle when first used."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        count = 1
        for n in shape:
            count *= int(n)
        if _is_torch_dtype(dtype):
            import torch
            if str(device) != "cpu":
                return torch.empty(shape, dtype=dtype, device=device)
            itemsize = torch.empty((), dtype=dtype).element_size()
            region = await self.create_region(max(1, count * itemsize), name or "torch%s" % (list(shape),))
            if count == 0:
                return torch.empty(shape, dtype=dtype)
            return torch.frombuffer(region._mm, dtype=dtype, count=count).reshape(shape)
        if str(device) != "cpu":
            raise ValueError("device %r needs a torch dtype (NumPy arrays live in host memory)" % (device,))
        import numpy as np
        dt = _resolve_numpy_dtype(dtype)
        region = await self.create_region(max(1, count * dt.itemsize), name or "numpy%s" % (list(shape),))
        return np.frombuffer(region._mm, dtype=dt, count=count).reshape(shape)

    async def zeros(self, shape: Any, dtype: Any = "float32", device: str = "cpu", name: str = "") -> Any:
        """empty(), filled with zeros."""
        a = await self.empty(shape, dtype, device, name)
        if is_torch_tensor(a):
            a.zero_()
        else:
            a.fill(0)
        return a

    async def copy_into_region(self, obj: Any, name: str = "") -> Any:
        """A copy of host memory that lies in no region (an ndarray, CPU tensor or bytes-like) in a new
        region; returns an object of the same kind (a memoryview for bytes-like) to build Descriptors on."""
        if is_torch_tensor(obj):
            out = await self.empty(tuple(obj.shape), obj.dtype, "cpu", name)
            out.copy_(obj)
            return out
        if is_numpy_array(obj):
            out = await self.empty(obj.shape, obj.dtype, "cpu", name)
            out[...] = obj
            return out
        src = memoryview(obj).cast("B")
        region = await self.create_region(max(1, src.nbytes), name or "copy")
        mv = region.memoryview()[:src.nbytes]
        mv[:] = src
        return mv

    def region_of(self, obj: Any) -> Region:
        """The region (of this connector) an array, tensor or memoryview lies in."""
        addr, n = buffer_address(obj)
        for r in self._regions.values():
            if r.contains(addr, n):
                return r
        raise NotInRegionError(
            "memory at 0x%x (%d bytes) is in no region of this connector: the sidecar can only move region "
            "memory; copy it into one with connector.copy_into_region(obj), or allocate it with "
            "connector.empty()/zeros()" % (addr, n))

    async def register_cuda(self, dptr: int, size: int, device: int = 0, name: str = "") -> Region:
        """Registers raw CUDA memory (from cuMemAlloc, this process's context current on the calling
        thread) as one region, by the CUDA IPC handle of its allocation; use (region, offset, length)
        descriptors on it. The memory stays the caller's: free() the region before freeing it."""
        d = Descriptor((dptr, size, device))
        return await self._register_cuda(d, name)

    async def free(self, obj: Union[Region, Any], force: bool = False) -> None:
        """Deregisters the region that `obj` (a Region, or an array/tensor/memoryview in one) lies
        in and unmaps it; arrays still viewing it keep their pages until they are gone. A CUDA
        tensor: deregisters its IPC registration. force: cancel live operations on the region
        instead of failing with FailedPreconditionError."""
        if isinstance(obj, Region):
            region = obj
        elif is_torch_tensor(obj) and obj.is_cuda:
            # Every registration of the tensor's allocation block (contiguous or not: a KVBlocks
            # layer tensor may have padded rows), found by the block's IPC handle.
            key = Descriptor((obj.data_ptr(), 1, obj.device.index or 0)).cuda_ipc()[:2]
            regions = [r for k, r in self._cuda_regions.items() if k[:2] == key]
            for r in regions:
                await self._deregister(r, force=force)
            return
        else:
            region = self.region_of(obj)
        await self._deregister(region, force=force)

    async def _deregister(self, region: Region, force: bool) -> None:
        region.unmap()
        self._regions.pop(region.region_id, None)
        for k, r in list(self._cuda_regions.items()):
            if r is region:
                del self._cuda_regions[k]
        await self._call("DeregisterRegion", pb.DeregisterRegionRequest(region_id=region.region_id, force=force))

    async def _register_cuda(self, d: Descriptor, name: str = "") -> Region:
        device, handle, offset, size = d.cuda_ipc()
        key = (device, handle, offset, size)
        region = self._cuda_regions.get(key)
        if region is None:
            proto = await self._call("RegisterRegion", pb.RegisterRegionRequest(
                cuda_ipc=pb.CudaIpcSource(device_index=device, handle=handle, offset=offset, size=size,
                                          device_uuid=getattr(d, "device_uuid", "")),
                name=name or "cuda:%d" % device))
            region = self._cuda_regions[key] = Region(proto, None, "cuda:%d" % device)
            self._regions[region.region_id] = region
        return region

    async def _wire(self, descs: Any) -> tuple:
        """Descriptors -> (list of Descriptor, list of pb.Descriptor)."""
        ds = as_descriptors(descs)
        out = []
        # GPU work that wrote (or still reads) this memory must be finished before the sidecar
        # touches it: synchronize each device's primary context (PyTorch's streams, pageable copies
        # still landing) once per operation. Raw pointers of another context: the caller's job.
        settled = set()
        for d in ds:
            if d.kind in ("cuda_tensor", "cuda_ptr") and d.device not in settled:
                from . import _cuda
                _cuda.synchronize(d.device)  # on the caller's thread (the sync client has no loop)
                settled.add(d.device)
        for d in ds:
            if d.kind == "region":
                out.append(pb.Descriptor(region_id=d.region_id, offset=d.offset, length=d.length))
            elif d.kind in ("cuda_tensor", "cuda_ptr"):
                r = await self._register_cuda(d)
                out.append(pb.Descriptor(region_id=r.region_id, offset=0, length=d.length))
            else:
                r = self.region_of(d.obj)
                out.append(pb.Descriptor(region_id=r.region_id, offset=d.addr - r.base, length=d.length))
        return ds, out

    async def _wire_sets(self, descs: Any) -> tuple:
        """As _wire, plus compact forms (kv.KVBlocks, kv.StridedRun): (objects to keep alive,
        plain pb.Descriptors, pb.DescriptorSets). With any compact form everything goes, in order,
        as DescriptorSets."""
        items = [descs] if kv.is_compact(descs) else descs if isinstance(descs, list) else None
        if items is None or not any(kv.is_compact(d) for d in items):
            ds, wire = await self._wire(descs)
            return ds, wire, []
        keep, sets = [], []
        for d in items:
            if kv.is_compact(d):
                keep.append(d)
                sets.extend(await d._sets(self))
            else:
                ds, wire = await self._wire([d])
                keep.extend(ds)
                sets.extend(pb.DescriptorSet(descriptor=w) for w in wire)
        return keep, [], sets

    # ---- operations ----
    def _track(self, cls: type, proto: Any, ds: list) -> Any:
        op = cls(self, proto, ds)
        self._ops[op.id] = op
        return op

    async def _passive(self, method: str, cls: type, descs: Any, timeout: Optional[float], audience: str,
                       uses: int, request_id: str, traceparent: str = "") -> Any:
        ds, wire, sets = await self._wire_sets(descs)
        any_uses = uses == ANY_USES
        proto = await self._call(method, pb.CreatePassiveRequest(
            descriptors=wire, descriptor_sets=sets, timeout_ms=int((timeout or 0) * 1000), audience=audience or "",
            max_uses=0 if any_uses else uses, any_uses=any_uses, request_id=request_id or ""),
            traceparent=traceparent)
        return self._track(cls, proto, ds)

    async def create_readable(self, descs: Any, timeout: Optional[float] = None, audience: str = "",
                              uses: int = 1, request_id: str = "", traceparent: str = "") -> ReadableOperation:
        """Exposes local memory for a remote read. timeout: seconds the operation and its metadata
        live (None: the sidecar's --default-timeout); audience: the only sidecar id that may use the
        metadata; uses: how many transfers may use it (at most 1,048,576), or ANY_USES: any number
        until the deadline, one readable read by many workers; traceparent: a W3C traceparent
        ("00-<trace id>-<parent id>-<flags>", e.g. your request's) whose trace id tags the
        operation's log lines (op.trace_id). Hand `op.metadata` to the peer."""
        return await self._passive("CreateReadable", ReadableOperation, descs, timeout, audience, uses, request_id,
                                   traceparent)

    async def create_writable(self, descs: Any, timeout: Optional[float] = None, audience: str = "",
                              uses: int = 1, request_id: str = "", traceparent: str = "") -> WritableOperation:
        """Exposes local memory for a remote write; as create_readable()."""
        return await self._passive("CreateWritable", WritableOperation, descs, timeout, audience, uses, request_id,
                                   traceparent)

    async def _active(self, method: str, cls: type, metadata: MetadataLike, descs: Any,
                      requirement: Optional[TransferRequirement], timeout: Optional[float],
                      backend: Optional[Backend], request_id: str, traceparent: str = "") -> Any:
        ds, wire, sets = await self._wire_sets(descs)
        req = pb.BeginTransferRequest(metadata=_metadata_text(metadata), descriptors=wire, descriptor_sets=sets,
                                      timeout_ms=int((timeout or 0) * 1000), backend=int(backend or 0),
                                      request_id=request_id or "")
        if requirement is not None:
            req.requirement.CopyFrom(pb.TransferRequirement(
                request_id=requirement.request_id, iteration=requirement.iteration,
                has_layer=requirement.layer is not None, layer=requirement.layer or 0))
        return self._track(cls, await self._call(method, req, traceparent=traceparent), ds)

    async def begin_read(self, metadata: MetadataLike, descs: Any, requirement: Optional[TransferRequirement] = None,
                         timeout: Optional[float] = None, backend: Optional[Backend] = None,
                         request_id: str = "", traceparent: str = "") -> ReadOperation:
        """Pulls the remote readable named by `metadata` into local `descs` (count and lengths must
        match). Returns at once (SCHEDULED or IN_PROGRESS): await op.wait_for_completion().
        traceparent: a W3C traceparent whose trace id tags this transfer's log lines on both
        sidecars (op.trace_id; without one the sidecar starts a new trace)."""
        return await self._active("BeginRead", ReadOperation, metadata, descs, requirement, timeout, backend,
                                  request_id, traceparent)

    async def begin_write(self, metadata: MetadataLike, descs: Any, requirement: Optional[TransferRequirement] = None,
                          timeout: Optional[float] = None, backend: Optional[Backend] = None,
                          request_id: str = "", traceparent: str = "") -> WriteOperation:
        """Pushes local `descs` into the remote writable named by `metadata`; as begin_read()."""
        return await self._active("BeginWrite", WriteOperation, metadata, descs, requirement, timeout, backend,
                                  request_id, traceparent)

    # ---- NATS and scheduling ----
    async def publish(self, subject: str, op: MetadataLike) -> None:
        """Publishes a passive operation's metadata (or an rsm1. text, verified first) on a NATS subject."""
        if isinstance(op, PassiveOperation):
            req = pb.PublishMetadataRequest(subject=subject, operation_id=op.id)
        else:
            req = pb.PublishMetadataRequest(subject=subject, metadata=_metadata_text(op))
        await self._call("PublishMetadata", req)

    def subscribe(self, subject: str, queue_group: Optional[str] = None) -> Subscription:
        """Metadata published on `subject` (wildcards allowed): `async for event in
        connector.subscribe(subject)`; with queue_group one member of the group gets each message."""
        return Subscription(self, subject, queue_group)

    async def wait_metadata(self, subject: str, timeout: float = 30.0) -> MetadataEvent:
        """The first verified metadata on `subject` (wildcards allowed), one call: published before
        this call (kept by the sidecar's JetStream hand-off) or while it waits, so the two workers of
        a hand-off may start in any order. Raises DeadlineExceededError when nothing valid came
        within `timeout` seconds (the message says whether anything was stored), or the refusal's
        error (PermissionDeniedError for a tampered copy: UNAUTHENTICATED) when only refused metadata came."""
        ms = max(1, int(timeout * 1000))
        ev = await self._call("WaitMetadata", pb.WaitMetadataRequest(subject=subject, timeout_ms=ms),
                              timeout=timeout + max(10.0, self.rpc_timeout or 0))
        return MetadataEvent(ev.subject, ev.metadata, ev.issuer, OperationKind(ev.kind),
                             list(ev.descriptor_lengths), ev.expires_unix_ms)

    async def report_progress(self, request_id: str, iteration: int, layer: Optional[int] = None,
                              iteration_complete: bool = False) -> int:
        """Reports worker progress; returns how many SCHEDULED operations it released."""
        r = await self._call("ReportProgress", pb.ReportProgressRequest(
            request_id=request_id, iteration=iteration, has_layer=layer is not None, layer=layer or 0,
            iteration_complete=iteration_complete))
        return r.released
