# SPDX-License-Identifier: Apache-2.0
"""The blocking client: the same Connector and operations as the asyncio one, for code without an
event loop (threads, scripts, Ray actors).

Each sync Connector runs an asyncio Connector on an event loop in a daemon thread (one for the
whole process) and waits for each call there; arrays, tensors, Regions and Descriptors are the same objects as in the
asyncio API. close() (or leaving `with Connector() as c:`) releases everything.
"""
import asyncio
import threading
from typing import Any, Iterator, List, Optional

from . import connector as _aio
from .connector import (Backend, MetadataEvent, MetadataLike, OperationState, OperationStatus,  # noqa: F401
                        TransferRequirement)
from .memory import Region


class _Loop:
    """The event loop, in its own daemon thread, that every blocking Connector of the process shares
    (one loop: grpc.aio wakes every loop of the process on each event)."""

    _shared: Optional["_Loop"] = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        _aio.quiet_grpc_poller(self.loop)
        self.thread = threading.Thread(target=self.loop.run_forever, name="rdma-sidecar-client", daemon=True)
        self.thread.start()

    @classmethod
    def shared(cls) -> "_Loop":
        with cls._lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def run(self, coro: Any) -> Any:
        if threading.current_thread() is self.thread:
            raise RuntimeError("rdma_sidecar.sync called from its own event loop thread: use the asyncio API there")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def iterate(self, agen: Any) -> Iterator[Any]:
        """An async iterator as a blocking one."""
        while True:
            try:
                yield self.run(agen.__anext__())
            except StopAsyncIteration:
                return


class Operation:
    """A blocking view of an asyncio operation (see rdma_sidecar.connector.Operation): the same
    properties; wait_for_completion(), cancel(), refresh(), release() and watch() block;
    `with op:` releases it on exit."""

    def __init__(self, loop: _Loop, op: _aio.Operation):
        self._loop = loop
        self.aio = op

    def __getattr__(self, name: str) -> Any:  # id, status, kind, bytes_done, metadata, error, proto...
        return getattr(self.aio, name)

    def wait_for_completion(self, timeout: Optional[float] = None) -> OperationStatus:
        """Blocks until terminal; returns COMPLETE or raises the operation's SidecarError."""
        return self._loop.run(self.aio.wait_for_completion(timeout))

    def cancel(self) -> OperationStatus:
        """Cancels the operation (the peer's ends too)."""
        return self._loop.run(self.aio.cancel())

    def refresh(self) -> OperationStatus:
        """The current status from the sidecar."""
        return self._loop.run(self.aio.refresh())

    def release(self) -> None:
        """Disposal: cancels it if not terminal; the sidecar forgets it."""
        self._loop.run(self.aio.release())

    def watch(self) -> Iterator[OperationState]:
        """The current state, then every change, ending after the terminal one."""
        return self._loop.iterate(self.aio.watch())

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


class Subscription:
    """Blocking Subscription: `for event in sub` (ready() has waited for the sidecar's NATS
    subscription already); close() ends it."""

    def __init__(self, loop: _Loop, sub: _aio.Subscription):
        self._loop = loop
        self.aio = sub

    def __iter__(self) -> Iterator[MetadataEvent]:
        return self._loop.iterate(self.aio)

    def next(self, timeout: Optional[float] = None) -> MetadataEvent:
        """The next event; raises TimeoutError after `timeout` seconds (None: wait for ever)."""
        async def one() -> MetadataEvent:
            return await asyncio.wait_for(self.aio.__anext__(), timeout)
        try:
            return self._loop.run(one())
        except asyncio.TimeoutError:
            raise TimeoutError("no metadata within %ss" % timeout) from None

    def close(self) -> None:
        self._loop.loop.call_soon_threadsafe(self.aio.close)

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Connector:
    """The blocking client of this worker's own sidecar; methods as rdma_sidecar.Connector's.

    address: default $RDMA_SIDECAR_ADDR, else unix:/tmp/rdma-sidecar/sidecar.sock."""

    def __init__(self, address: Optional[str] = None, rpc_timeout: float = 30.0):
        self._loop = _Loop.shared()
        self.aio = _aio.Connector(address, rpc_timeout)
        self.address = self.aio.address
        self._closed = False

    def _run(self, coro: Any) -> Any:
        return self._loop.run(coro)

    def close(self) -> None:
        """Releases operations, ends subscriptions, deregisters regions, closes the channel."""
        if self._closed:
            return
        self._closed = True
        self._run(self.aio.close())

    def __enter__(self) -> "Connector":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def info(self) -> Any:
        """GetInfo (a SidecarInfo message)."""
        return self._run(self.aio.info())

    def health(self) -> str:
        """The gRPC health status, e.g. "SERVING"."""
        return self._run(self.aio.health())

    def list_regions(self) -> List[Any]:
        """Every region the sidecar holds."""
        return self._run(self.aio.list_regions())

    def list_operations(self) -> List[Any]:
        """Every operation the sidecar holds."""
        return self._run(self.aio.list_operations())

    def create_region(self, size: int, name: str = "") -> Region:
        """A host region mapped into this process."""
        return self._run(self.aio.create_region(size, name))

    def empty(self, shape: Any, dtype: Any = "float32", device: str = "cpu", name: str = "") -> Any:
        """An uninitialised NumPy array / torch tensor in sidecar memory (see the asyncio Connector)."""
        return self._run(self.aio.empty(shape, dtype, device, name))

    def zeros(self, shape: Any, dtype: Any = "float32", device: str = "cpu", name: str = "") -> Any:
        """empty(), filled with zeros."""
        return self._run(self.aio.zeros(shape, dtype, device, name))

    def copy_into_region(self, obj: Any, name: str = "") -> Any:
        """A region-backed copy of host memory that lies in no region."""
        return self._run(self.aio.copy_into_region(obj, name))

    def region_of(self, obj: Any) -> Region:
        """The region an array, tensor or memoryview lies in."""
        return self.aio.region_of(obj)

    def free(self, obj: Any) -> None:
        """Deregisters and unmaps the region of `obj`."""
        self._run(self.aio.free(obj))

    def create_readable(self, descs: Any, timeout: Optional[float] = None, audience: str = "", uses: int = 1,
                        request_id: str = "") -> ReadableOperation:
        """Exposes local memory for a remote read."""
        return ReadableOperation(self._loop, self._run(self.aio.create_readable(descs, timeout, audience, uses,
                                                                                request_id)))

    def create_writable(self, descs: Any, timeout: Optional[float] = None, audience: str = "", uses: int = 1,
                        request_id: str = "") -> WritableOperation:
        """Exposes local memory for a remote write."""
        return WritableOperation(self._loop, self._run(self.aio.create_writable(descs, timeout, audience, uses,
                                                                                request_id)))

    @staticmethod
    def _meta(metadata: Any) -> Any:
        return metadata.aio if isinstance(metadata, Operation) else metadata

    def begin_read(self, metadata: MetadataLike, descs: Any, requirement: Optional[TransferRequirement] = None,
                   timeout: Optional[float] = None, backend: Optional[Backend] = None,
                   request_id: str = "") -> ReadOperation:
        """Pulls a remote readable into local memory; returns at once."""
        return ReadOperation(self._loop, self._run(self.aio.begin_read(self._meta(metadata), descs, requirement,
                                                                       timeout, backend, request_id)))

    def begin_write(self, metadata: MetadataLike, descs: Any, requirement: Optional[TransferRequirement] = None,
                    timeout: Optional[float] = None, backend: Optional[Backend] = None,
                    request_id: str = "") -> WriteOperation:
        """Pushes local memory into a remote writable; returns at once."""
        return WriteOperation(self._loop, self._run(self.aio.begin_write(self._meta(metadata), descs, requirement,
                                                                         timeout, backend, request_id)))

    def publish(self, subject: str, op: Any) -> None:
        """Publishes a passive operation's metadata (or an rsm1. text) on a NATS subject."""
        self._run(self.aio.publish(subject, self._meta(op)))

    def subscribe(self, subject: str, queue_group: Optional[str] = None) -> Subscription:
        """A subscription to `subject`, in place when this returns: `for event in sub`."""
        sub = self.aio.subscribe(subject, queue_group)
        self._run(sub.ready())
        return Subscription(self._loop, sub)

    def report_progress(self, request_id: str, iteration: int, layer: Optional[int] = None,
                        iteration_complete: bool = False) -> int:
        """Reports worker progress; returns how many scheduled operations it released."""
        return self._run(self.aio.report_progress(request_id, iteration, layer, iteration_complete))
