# SPDX-License-Identifier: Apache-2.0
"""rdma_sidecar.ray: the sidecar as a Ray Direct Transport (RDT) tensor transport.

    import rdma_sidecar.ray
    rdma_sidecar.ray.register()   # before any actor is created, in every process that uses it

    @ray.remote
    class Producer:
        @ray.method(tensor_transport="RDMA_SIDECAR")
        def kv(self):
            return torch.randn(1024, 4096)

Each actor talks to the sidecar beside it: the address given to register() (address=), else
$RDMA_SIDECAR_ADDR, else unix:/tmp/rdma-sidecar/sidecar.sock. The transport is one-sided and can
abort:

- source (extract_tensor_transport_metadata): the tensors go into sidecar regions (CPU tensors
  allocated there already are used in place, others are copied in once; CUDA tensors are
  registered by their CUDA IPC handle) and one readable operation exposes them all. The metadata
  Ray carries holds the shapes, dtypes, device and the signed "rsm1." text: a few hundred bytes,
  whatever the sizes. It serves `max_uses` reads (Ray may read an object more than once; -1 or
  RDMA_SIDECAR_RAY_MAX_USES=any: any number, for one object read by many actors) until `ttl`
  seconds have passed.
- destination (recv_multiple_tensors, or fetch_multiple_tensors + wait_fetch_complete): one
  begin_read into `target_buffers` or into fresh tensors in sidecar regions (zero copy for CPU;
  CUDA tensors are allocated on the current device); TimeoutError when the wait runs out, after
  the read was cancelled (memory quiet).
- garbage_collect releases the readable and frees what the transport allocated; abort_transport
  cancels what is in flight for the object on this side, and returns promptly.

Ray is imported only if it is installed: without it, the module still defines everything (the base
classes are stand-ins of Ray's documented ones), which is how the project's tests drive it.
"""
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from . import errors
from .sync import Connector

NAME = "RDMA_SIDECAR"
DEFAULT_TTL = float(os.environ.get("RDMA_SIDECAR_RAY_TTL", "600"))          # seconds a readable lives
_max_uses_env = os.environ.get("RDMA_SIDECAR_RAY_MAX_USES", "16")
# reads Ray may make of one object; "any": any number until the ttl (one object, many readers)
DEFAULT_MAX_USES = -1 if _max_uses_env.strip().lower() == "any" else int(_max_uses_env)   # reads Ray may make of one object
DEFAULT_TIMEOUT = float(os.environ.get("RDMA_SIDECAR_RAY_TIMEOUT", "60"))   # a receive's wait (Ray's default)

try:  # Ray's documented interface, where Ray is installed
    from ray.experimental.rdt.tensor_transport_manager import (CommunicatorMetadata, TensorTransportManager,
                                                               TensorTransportMetadata)
except ImportError:  # pragma: no cover - depends on the Ray version installed
    try:
        from ray.experimental import TensorTransportManager  # type: ignore
        from ray.experimental import CommunicatorMetadata, TensorTransportMetadata  # type: ignore
    except ImportError:
        TensorTransportManager = object  # type: ignore

        @dataclass
        class CommunicatorMetadata:  # type: ignore
            """Ray's CommunicatorMetadata (empty for a one-sided transport)."""

        @dataclass
        class TensorTransportMetadata:  # type: ignore
            """Ray's TensorTransportMetadata: (shape, dtype) per tensor, and the device."""
            tensor_meta: List[Tuple[Any, Any]]
            tensor_device: Optional[str] = None


@dataclass
class SidecarTransportMetadata(TensorTransportMetadata):
    """What Ray carries from the source to the destination: shapes and dtypes (Ray's own fields),
    the signed metadata of the readable, its issuer and byte counts, and its expiry."""
    metadata: str = ""
    issuer: str = ""
    nbytes: List[int] = field(default_factory=list)
    expires_unix_ms: int = 0


@dataclass
class SidecarCommunicatorMetadata(CommunicatorMetadata):
    """One-sided: the destination needs nothing but the transport metadata."""


@dataclass
class FetchRequest:
    """An asynchronous fetch: wait_fetch_complete(request, timeout) returns its tensors."""
    obj_id: str
    op: Any
    tensors: List[Any]
    allocated: List[Any]


def _nbytes(t: Any) -> int:
    return int(t.numel()) * int(t.element_size())


def _device_of(tensors: List[Any]) -> str:
    kinds = {"cuda" if getattr(t, "is_cuda", False) else "cpu" for t in tensors}
    if len(kinds) > 1:
        raise ValueError("rdma_sidecar.ray: all tensors of one object must be on the same kind of device")
    return kinds.pop() if kinds else "cpu"


class SidecarTensorTransport(TensorTransportManager):
    """Ray's TensorTransportManager over this process's sidecar. One per process (Ray makes it);
    thread safe (a lock around the connector and the per-object state)."""

    address: Optional[str] = None
    ttl: float = DEFAULT_TTL
    max_uses: int = DEFAULT_MAX_USES
    timeout: float = DEFAULT_TIMEOUT

    def __init__(self, address: Optional[str] = None):
        self._address = address or type(self).address
        self._lock = threading.RLock()
        self._conn: Optional[Connector] = None
        # obj_id -> (readable, CPU copies we allocated, CUDA tensors we registered by IPC handle)
        self._sources: Dict[str, Tuple[Any, List[Any], List[Any]]] = {}
        self._inflight: Dict[str, List[Any]] = {}              # obj_id -> active reads

    # ---- plumbing -----------------------------------------------------------------------------

    def connector(self) -> Connector:
        with self._lock:
            if self._conn is None:
                self._conn = Connector(self._address)
            return self._conn

    def close(self) -> None:
        """Releases every operation and region of this transport and closes the connection."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self._sources.clear()
            self._inflight.clear()

    # ---- Ray's interface -----------------------------------------------------------------------

    def tensor_transport_backend(self) -> str:
        return NAME

    @staticmethod
    def is_one_sided() -> bool:
        return True

    @staticmethod
    def can_abort_transport() -> bool:
        return True

    def actor_has_tensor_transport(self, actor: Any) -> bool:
        """Asks the actor (in its own process) whether its sidecar answers; the reason is logged
        by probe() there when it does not."""
        import ray
        ok, _ = ray.get(actor.__ray_call__.remote(_actor_probe))
        return bool(ok)

    def extract_tensor_transport_metadata(self, obj_id: str, rdt_object: List[Any]) -> SidecarTransportMetadata:
        import torch
        tensors = [t for t in rdt_object if isinstance(t, torch.Tensor)]
        if len(tensors) != len(rdt_object):
            raise TypeError("rdma_sidecar.ray transports torch.Tensor objects only (got %s)"
                            % sorted({type(t).__name__ for t in rdt_object}))
        device = _device_of(tensors)
        c = self.connector()
        from .memory import Descriptor, NotInRegionError
        with self._lock:
            allocated, exposed = [], []
            try:
                for t in tensors:
                    if not t.is_contiguous():
                        t = t.contiguous()  # a CPU copy lies in no region: copied in below
                    if not t.is_cuda and _nbytes(t) > 0:  # an empty tensor moves nothing
                        try:
                            c.region_of(t)
                        except NotInRegionError:
                            t = c.copy_into_region(t, name="ray-" + obj_id[:16])
                            allocated.append(t)
                    exposed.append(t)
                descs = [Descriptor(t) for t in exposed if _nbytes(t) > 0]
                op = c.create_readable(descs, timeout=self.ttl, uses=self.max_uses) if descs else None
            except BaseException:
                for t in allocated:
                    c.free(t, force=True)
                raise
            self._sources[obj_id] = (op, allocated, [t for t in exposed if t.is_cuda])
        return SidecarTransportMetadata(
            tensor_meta=[(tuple(t.shape), t.dtype) for t in tensors], tensor_device=device,
            metadata=op.metadata if op else "", issuer=c.info().sidecar_id,
            nbytes=[_nbytes(t) for t in tensors],
            expires_unix_ms=int(time.time() * 1000 + self.ttl * 1000))

    def get_communicator_metadata(self, src_actor: Any, dst_actor: Any,
                                  backend: Optional[str] = None) -> SidecarCommunicatorMetadata:
        return SidecarCommunicatorMetadata()

    def recv_multiple_tensors(self, obj_id: str, tensor_transport_metadata: Any, communicator_metadata: Any = None,
                              target_buffers: Optional[List[Any]] = None) -> List[Any]:
        req = self.fetch_multiple_tensors(obj_id, tensor_transport_metadata, communicator_metadata, target_buffers)
        return self.wait_fetch_complete(req, self.timeout)

    def fetch_multiple_tensors(self, obj_id: str, tensor_transport_metadata: Any, communicator_metadata: Any = None,
                               target_buffers: Optional[List[Any]] = None) -> FetchRequest:
        """Starts the read and returns at once; wait_fetch_complete(request, timeout) finishes it."""
        import torch
        meta = tensor_transport_metadata
        c = self.connector()
        from .memory import Descriptor
        shapes = list(meta.tensor_meta)
        if target_buffers is not None and len(target_buffers) != len(shapes):
            raise ValueError("rdma_sidecar.ray: %d target buffers for %d tensors" % (len(target_buffers), len(shapes)))
        device = meta.tensor_device or "cpu"
        tensors, allocated = [], []
        try:
            for i, (shape, dtype) in enumerate(shapes):
                if target_buffers is not None:
                    t = target_buffers[i]
                    if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
                        raise ValueError("rdma_sidecar.ray: target buffer %d is %s %s, the object's tensor is %s %s"
                                         % (i, tuple(t.shape), t.dtype, tuple(shape), dtype))
                elif device == "cuda":
                    t = torch.empty(tuple(shape), dtype=dtype, device="cuda")
                else:
                    t = c.empty(tuple(shape), dtype, "cpu", name="ray-" + obj_id[:16])
                    allocated.append(t)
                tensors.append(t)
            descs = [Descriptor(t) for t in tensors if _nbytes(t) > 0]
            op = c.begin_read(meta.metadata, descs, timeout=self.timeout) if descs else None
        except BaseException:
            for t in allocated:
                c.free(t, force=True)
            raise
        if op is not None:
            with self._lock:
                self._inflight.setdefault(obj_id, []).append(op)
        return FetchRequest(obj_id, op, tensors, allocated)

    def wait_fetch_complete(self, fetch_request: FetchRequest, timeout: Optional[float] = None) -> List[Any]:
        """The fetched tensors once the read is complete; TimeoutError (the read cancelled first, so
        the memory is quiet) when it is not within timeout seconds; the sidecar's error otherwise."""
        req = fetch_request
        try:
            if req.op is not None:
                try:
                    req.op.wait_for_completion(timeout)
                except errors.DeadlineExceededError as e:
                    try:
                        req.op.cancel()
                    except errors.SidecarError:
                        pass  # committed or ending: it ends by its own deadline
                    raise TimeoutError("rdma_sidecar.ray: object %s not received within %ss: %s"
                                       % (req.obj_id, timeout, e.message)) from None
        finally:
            with self._lock:
                ops = self._inflight.get(req.obj_id, [])
                if req.op in ops:
                    ops.remove(req.op)
                if not ops:
                    self._inflight.pop(req.obj_id, None)
            if req.op is not None:
                try:
                    req.op.release()
                except errors.SidecarError:
                    pass
        return req.tensors

    def send_multiple_tensors(self, tensors: List[Any], tensor_transport_metadata: Any,
                              communicator_metadata: Any) -> None:
        raise NotImplementedError("rdma_sidecar.ray is one-sided: the destination reads, the source sends nothing")

    def garbage_collect(self, obj_id: str, tensor_transport_meta: Any = None, tensors: Optional[List[Any]] = None) -> None:
        """Releases the object's readable, frees the region copies the transport made, and drops the
        CUDA IPC registrations of its tensors (unless another live object shares the allocation)."""
        with self._lock:
            op, allocated, cuda = self._sources.pop(obj_id, (None, [], []))
            c = self._conn
        if c is None:
            return
        if op is not None:
            try:
                op.release()
            except errors.SidecarError:
                pass
        for t in allocated:
            c.free(t, force=True)
        for t in cuda:
            try:
                c.free(t)
            except errors.FailedPreconditionError:
                pass  # another object's readable still uses this allocation block
            except errors.NotFoundError:
                pass  # an earlier object of the same block dropped it already

    def abort_transport(self, obj_id: str, communicator_metadata: Any = None) -> None:
        """Cancels what is in flight for obj_id on this side: the source's readable (its peers'
        reads then fail) and the destination's reads. Returns promptly (each cancel answers within
        the sidecar's --cancel-wait)."""
        with self._lock:
            ops = list(self._inflight.get(obj_id, []))
            src = self._sources.get(obj_id, (None, [], []))[0]
        for op in ops + ([src] if src is not None else []):
            try:
                op.cancel()
            except errors.SidecarError:
                pass  # already ended, or committed: it ends by its deadline


def probe(address: Optional[str] = None) -> Tuple[bool, str]:
    """Whether this process's sidecar answers and can serve the transport: (True, "") or (False, why)."""
    try:
        with Connector(address or SidecarTensorTransport.address, rpc_timeout=5.0) as c:
            if c.health() != "SERVING":
                return False, "the sidecar at %s is not serving" % c.address
            c.info()
            return True, ""
    except Exception as e:  # noqa: BLE001 (any failure is the answer)
        return False, "no usable sidecar at %s: %s" % (address or os.environ.get("RDMA_SIDECAR_ADDR", "the default socket"), e)


def _actor_probe(actor_self: Any) -> Tuple[bool, str]:
    """Runs inside an actor (actor.__ray_call__): its own sidecar's answer."""
    return probe()


def register(name: str = NAME, devices: Tuple[str, ...] = ("cpu", "cuda"), address: Optional[str] = None,
             ttl: Optional[float] = None, max_uses: Optional[int] = None, timeout: Optional[float] = None,
             data_type: Any = None) -> None:
    """Registers the transport with Ray under `name` (use it as @ray.method(tensor_transport=name)).
    Call it before actors are created, in every process that creates or uses them. address, ttl,
    max_uses and timeout set the transport's defaults (see the module documentation)."""
    import ray.experimental
    if address is not None:
        SidecarTensorTransport.address = address
    if ttl is not None:
        SidecarTensorTransport.ttl = float(ttl)
    if max_uses is not None:
        SidecarTensorTransport.max_uses = int(max_uses)
    if timeout is not None:
        SidecarTensorTransport.timeout = float(timeout)
    if data_type is None:
        import torch
        data_type = torch.Tensor
    ray.experimental.register_tensor_transport(name, list(devices), SidecarTensorTransport, data_type)
