# SPDX-License-Identifier: Apache-2.0
"""The blocking client: the same Connector and operations as the asyncio one, for code without an
event loop (threads, scripts, Ray actors).

One implementation serves both: the asyncio Connector's methods are coroutines whose only waits are
its calls to the sidecar (_call). Here a subclass makes those calls with grpc's blocking stubs, so
each coroutine runs to its end without ever suspending, and _drive() just steps it once on the
caller's thread: no event loop, no extra thread, no grpc.aio. The streams (watch, subscribe) use
the blocking stream API. Arrays, tensors, Regions and Descriptors are the same objects as in the
asyncio API. close() (or leaving `with Connector() as c:`) releases everything it holds.
"""
import queue
import threading
from typing import Any, Coroutine, Iterator, List, Optional

import grpc

from . import connector as _aio
from . import errors
from ._pb import pb, pb_grpc
from .connector import (Backend, MetadataEvent, MetadataLike, OperationKind, OperationState,  # noqa: F401
                        OperationStatus, TransferRequirement)
from .memory import Region


def _drive(coro: Coroutine) -> Any:
    """Runs a coroutine that never suspends (every call in it blocks instead) and returns its value."""
    try:
        coro.send(None)
    except StopIteration as e:
        return e.value
    coro.close()
    raise RuntimeError("rdma_sidecar.sync: a call suspended; this is a bug in the package")


class _Core(_aio.Connector):
    """The asyncio Connector with blocking calls underneath (see the module docstring)."""

    def _stub(self) -> Any:
        if self._stub_obj is None:
            self._channel = grpc.insecure_channel(self.address, options=_aio.CHANNEL_OPTIONS)
            self._stub_obj = pb_grpc.SidecarStub(self._channel)
        return self._stub_obj

    async def _channel_ready(self, timeout: float) -> bool:
        fut = grpc.channel_ready_future(self._channel)
        try:
            fut.result(timeout=timeout)
            return True
        except grpc.FutureTimeoutError:
            fut.cancel()
            return False

    async def _call(self, method: str, req: Any, timeout: Optional[float] = None, traceparent: str = "") -> Any:
        if not self._ready:
            await self.wait_ready()
        md = (("traceparent", traceparent),) if traceparent else None  # as connector._call
        try:
            return getattr(self._stub(), method)(req, timeout=timeout or self.rpc_timeout, metadata=md)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None

    async def _unary(self, path: str, req: Any, resp_cls: Any) -> Any:
        self._stub()
        if not self._ready:
            await self.wait_ready()
        call = self._channel.unary_unary(path, request_serializer=type(req).SerializeToString,
                                         response_deserializer=resp_cls.FromString)
        try:
            return call(req, timeout=self.rpc_timeout)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None

    async def _close_channel(self) -> None:
        self._channel.close()


class Operation:
    """A blocking operation (see rdma_sidecar.connector.Operation): the same properties (id,
    status, kind, backend, bytes_done, bytes_total, rails, metadata, error, proto); wait_for_completion(),
    cancel(), refresh(), release() and watch() block; `with op:` releases it on exit."""

    def __init__(self, op: _aio.Operation):
        self.aio = op

    def __getattr__(self, name: str) -> Any:
        return getattr(self.aio, name)

    def wait_for_completion(self, timeout: Optional[float] = None) -> OperationStatus:
        """Blocks until terminal; returns COMPLETE or raises the operation's SidecarError
        (DeadlineExceededError when `timeout` seconds pass first)."""
        return _drive(self.aio.wait_for_completion(timeout))

    def cancel(self) -> OperationStatus:
        """Cancels the operation (the peer's ends too); returns once it is terminal and the sidecar
        no longer touches its memory."""
        return _drive(self.aio.cancel())

    def refresh(self) -> OperationStatus:
        """The current status from the sidecar."""
        return _drive(self.aio.refresh())

    def release(self) -> None:
        """Disposal: cancels it if not terminal; the sidecar forgets it."""
        _drive(self.aio.release())

    def watch(self) -> Iterator[OperationState]:
        """The current state, then every change, ending after the terminal one."""
        call = self.aio._connector._stub().WatchOperation(pb.WatchOperationRequest(operation_id=self.aio.id))
        try:
            for proto in call:
                self.aio._update(proto)
                yield OperationState(self.aio.status, proto.bytes_done, proto.bytes_total, Backend(proto.backend))
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None
        finally:
            call.cancel()

    def __enter__(self) -> "Operation":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        return repr(self.aio)


class ReadableOperation(Operation):
    """Blocking ReadableOperation (`.metadata` for the peer)."""


class WritableOperation(Operation):
    """Blocking WritableOperation (`.metadata` for the peer)."""


class ReadOperation(Operation):
    """Blocking ReadOperation (`.bytes_done`, watch())."""


class WriteOperation(Operation):
    """Blocking WriteOperation (`.bytes_done`, watch())."""


_END = object()


class Subscription:
    """Metadata arriving on a NATS subject, in place when Connector.subscribe() returns:
    `for event in sub`, or sub.next(timeout). A reader thread takes the stream; close() ends it."""

    def __init__(self, core: _Core, subject: str, queue_group: Optional[str]):
        self._core = core
        self._q: "queue.Queue[Any]" = queue.Queue()
        self._call = core._stub().SubscribeMetadata(
            pb.SubscribeMetadataRequest(subject=subject, queue_group=queue_group or ""))
        core._subs.add(self)
        try:
            self._call.initial_metadata()  # the sidecar sends its headers once it has subscribed
        except grpc.RpcError as e:
            self.close()
            raise errors.from_rpc_error(e) from None
        if self._call.done() and self._call.code() != grpc.StatusCode.OK:
            code, details = self._call.code(), self._call.details()
            self.close()
            raise errors.error_for(code, details or "subscription ended")
        self._thread = threading.Thread(target=self._read, name="rdma-sidecar-subscription", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for ev in self._call:
                self._q.put(MetadataEvent(ev.subject, ev.metadata, ev.issuer, OperationKind(ev.kind),
                                          list(ev.descriptor_lengths), ev.expires_unix_ms))
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                self._q.put(errors.from_rpc_error(e))
        self._q.put(_END)

    def next(self, timeout: Optional[float] = None) -> MetadataEvent:
        """The next event; TimeoutError after `timeout` seconds (None: wait for ever);
        StopIteration once the subscription has ended."""
        try:
            item = self._q.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError("no metadata within %ss" % timeout) from None
        if item is _END:
            self._q.put(_END)
            raise StopIteration
        if isinstance(item, Exception):
            raise item
        return item

    def __iter__(self) -> Iterator[MetadataEvent]:
        while True:
            try:
                yield self.next()
            except StopIteration:
                return

    def close(self) -> None:
        """Ends the subscription (the sidecar unsubscribes from NATS)."""
        self._call.cancel()
        self._core._subs.discard(self)
        t = getattr(self, "_thread", None)
        if t is not None and t is not threading.current_thread():
            t.join(10)

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Connector:
    """The blocking client of this worker's own sidecar; methods as rdma_sidecar.Connector's.

    address: default $RDMA_SIDECAR_ADDR, else unix:/tmp/rdma-sidecar/sidecar.sock. Use one
    Connector from one thread at a time (several threads: one Connector each). wait_for_ready:
    seconds the first call waits for a sidecar that is not up yet (default
    $RDMA_SIDECAR_WAIT_FOR_READY, else 0), as the asyncio Connector's."""

    def __init__(self, address: Optional[str] = None, rpc_timeout: float = 30.0,
                 wait_for_ready: Optional[float] = None):
        self.aio = _Core(address, rpc_timeout, wait_for_ready)
        self.address = self.aio.address

    def wait_ready(self, timeout: Optional[float] = None) -> None:
        """Blocks up to `timeout` seconds (default: wait_for_ready) until the sidecar accepts a
        connection; UnavailableError naming the address and the wait when the time passes."""
        _drive(self.aio.wait_ready(timeout))

    def close(self) -> None:
        """Releases operations, ends subscriptions, deregisters regions, closes the channel."""
        _drive(self.aio.close())

    def __enter__(self) -> "Connector":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def info(self) -> Any:
        """GetInfo (a SidecarInfo message, with .rails, .topology and .topology_source)."""
        return _drive(self.aio.info())

    def connect_peer(self, metadata: MetadataLike, timeout_ms: int = 0) -> Any:
        """ConnectPeer: opens the connections to the issuer of `metadata` before the first transfer
        (not used up); returns the ConnectPeerResponse (.peer, .paths). See the asyncio Connector."""
        return _drive(self.aio.connect_peer(self._meta(metadata), timeout_ms))

    def health(self) -> str:
        """The gRPC health status, e.g. "SERVING"."""
        return _drive(self.aio.health())

    def list_regions(self) -> List[Any]:
        """Every region the sidecar holds."""
        return _drive(self.aio.list_regions())

    def list_operations(self) -> List[Any]:
        """Every operation the sidecar holds."""
        return _drive(self.aio.list_operations())

    def create_region(self, size: int, name: str = "") -> Region:
        """A host region mapped into this process."""
        return _drive(self.aio.create_region(size, name))

    def empty(self, shape: Any, dtype: Any = "float32", device: str = "cpu", name: str = "") -> Any:
        """An uninitialised NumPy array / torch tensor in sidecar memory (see the asyncio Connector)."""
        return _drive(self.aio.empty(shape, dtype, device, name))

    def zeros(self, shape: Any, dtype: Any = "float32", device: str = "cpu", name: str = "") -> Any:
        """empty(), filled with zeros."""
        return _drive(self.aio.zeros(shape, dtype, device, name))

    def copy_into_region(self, obj: Any, name: str = "") -> Any:
        """A region-backed copy of host memory that lies in no region."""
        return _drive(self.aio.copy_into_region(obj, name))

    def region_of(self, obj: Any) -> Region:
        """The region an array, tensor or memoryview lies in."""
        return self.aio.region_of(obj)

    def register_cuda(self, dptr: int, size: int, device: int = 0, name: str = "") -> Region:
        """Registers raw CUDA memory (cuMemAlloc) as one region, by its CUDA IPC handle."""
        return _drive(self.aio.register_cuda(dptr, size, device, name))

    def free(self, obj: Any, force: bool = False) -> None:
        """Deregisters and unmaps the region of `obj` (force: cancel operations still using it)."""
        _drive(self.aio.free(obj, force))

    def create_readable(self, descs: Any, timeout: Optional[float] = None, audience: str = "", uses: int = 1,
                        request_id: str = "", traceparent: str = "") -> ReadableOperation:
        """Exposes local memory for a remote read."""
        return ReadableOperation(_drive(self.aio.create_readable(descs, timeout, audience, uses, request_id,
                                                                 traceparent)))

    def create_writable(self, descs: Any, timeout: Optional[float] = None, audience: str = "", uses: int = 1,
                        request_id: str = "", traceparent: str = "") -> WritableOperation:
        """Exposes local memory for a remote write."""
        return WritableOperation(_drive(self.aio.create_writable(descs, timeout, audience, uses, request_id,
                                                                 traceparent)))

    @staticmethod
    def _meta(metadata: Any) -> Any:
        return metadata.aio if isinstance(metadata, Operation) else metadata

    def begin_read(self, metadata: MetadataLike, descs: Any, requirement: Optional[TransferRequirement] = None,
                   timeout: Optional[float] = None, backend: Optional[Backend] = None,
                   request_id: str = "", traceparent: str = "") -> ReadOperation:
        """Pulls a remote readable into local memory; returns at once."""
        return ReadOperation(_drive(self.aio.begin_read(self._meta(metadata), descs, requirement, timeout, backend,
                                                        request_id, traceparent)))

    def begin_write(self, metadata: MetadataLike, descs: Any, requirement: Optional[TransferRequirement] = None,
                    timeout: Optional[float] = None, backend: Optional[Backend] = None,
                    request_id: str = "", traceparent: str = "") -> WriteOperation:
        """Pushes local memory into a remote writable; returns at once."""
        return WriteOperation(_drive(self.aio.begin_write(self._meta(metadata), descs, requirement, timeout, backend,
                                                          request_id, traceparent)))

    def publish(self, subject: str, op: Any) -> None:
        """Publishes a passive operation's metadata (or an rsm1. text) on a NATS subject."""
        _drive(self.aio.publish(subject, self._meta(op)))

    def subscribe(self, subject: str, queue_group: Optional[str] = None) -> Subscription:
        """A subscription to `subject`, in place when this returns: `for event in sub`."""
        return Subscription(self.aio, subject, queue_group)

    def wait_metadata(self, subject: str, timeout: float = 30.0) -> MetadataEvent:
        """The first verified metadata on `subject`, published before this call or while it waits
        (see Connector.wait_metadata in the asyncio API)."""
        return _drive(self.aio.wait_metadata(subject, timeout))

    def report_progress(self, request_id: str, iteration: int, layer: Optional[int] = None,
                        iteration_complete: bool = False) -> int:
        """Reports worker progress; returns how many scheduled operations it released."""
        return _drive(self.aio.report_progress(request_id, iteration, layer, iteration_complete))

    def fast_path(self, socket_path: Optional[str] = None, spin_us: Optional[int] = None,
                  require_ring: bool = False) -> Any:
        """A fast-path session (rdma_sidecar.FastPath) with this connector's sidecar: READs and
        WRITEs prepared once and run many times through shared-memory rings, or over gRPC when the
        sidecar offers none. Host descriptors are found among this connector's regions. spin_us:
        as FastPath.open (None: poll 50 us only where this process may run on 4 CPUs or more)."""
        from .fast import FastPath
        return FastPath.open(self, socket_path=socket_path, spin_us=spin_us, require_ring=require_ring)
