# SPDX-License-Identifier: Apache-2.0
"""Memory the sidecar can move: regions and descriptors.

A host Region is a file the sidecar allocated under its --shm-dir and this process maps
(MAP_SHARED): NumPy arrays and PyTorch tensors made by Connector.empty()/zeros() are views of that
mapping, so a transfer lands in them with no copy. A Descriptor names a contiguous range of memory
the sidecar knows: a region-backed array, tensor, slice or memoryview (found by address among the
connector's regions), an explicit (region, offset, length), a CUDA tensor (registered with the
sidecar by the CUDA IPC handle of its allocation block, which the driver gives, when first used) or
a raw CUDA pointer (dptr, size, device).
NumPy and PyTorch are optional: each is imported only when an object of its kind shows up.
"""
import ctypes
import mmap
import sys
from typing import Any, Optional, Tuple, Union


class NotInRegionError(ValueError):
    """Host memory that lies in no sidecar region: the sidecar cannot reach it. Copy it into one
    with Connector.copy_into_region(obj), or allocate it there with Connector.empty()/zeros()."""


class Region:
    """A sidecar region this process uses: `region_id`, `size`, `device` ("cpu" or "cuda:N") and,
    for host regions, `path` and the mapping (`memoryview()`). Made by a Connector; given back with
    Connector.free() or when the connector closes."""

    def __init__(self, proto: Any, mm: Optional[mmap.mmap] = None, device: str = "cpu"):
        self.proto = proto
        self.region_id: str = proto.region_id
        self.size: int = proto.size
        self.path: str = proto.path
        self.device = device
        self._mm = mm
        self.base = 0
        if mm is not None and self.size:
            probe = ctypes.c_char.from_buffer(mm)
            self.base = ctypes.addressof(probe)
            del probe  # releases the buffer export, so that close() can unmap

    def memoryview(self) -> memoryview:
        """The whole mapped region as a writable memoryview (host regions only)."""
        if self._mm is None:
            raise ValueError("region %s is not mapped in this process (%s)" % (self.region_id, self.device))
        return memoryview(self._mm)

    def contains(self, addr: int, length: int) -> bool:
        """Whether [addr, addr + length) lies in this process's mapping of the region."""
        return self._mm is not None and self.base <= addr and addr + length <= self.base + self.size

    def unmap(self) -> None:
        """Drops this object's mapping; arrays still viewing it keep it until they are gone."""
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # arrays or memoryviews still use it: unmapped when the last one goes

    def __repr__(self) -> str:
        return "Region(%s, %d bytes, %s)" % (self.region_id, self.size, self.device)


def _torch():
    return sys.modules.get("torch")


def _numpy():
    return sys.modules.get("numpy")


def is_torch_tensor(obj: Any) -> bool:
    t = _torch()
    return t is not None and isinstance(obj, t.Tensor)


def is_numpy_array(obj: Any) -> bool:
    np = _numpy()
    return np is not None and isinstance(obj, np.ndarray)


def buffer_address(obj: Any) -> Tuple[int, int]:
    """(address, length in bytes) of a contiguous host buffer: an ndarray, a CPU tensor, a
    memoryview, an mmap or a bytearray."""
    if is_torch_tensor(obj):
        if not obj.is_contiguous():
            raise ValueError("a non-contiguous tensor cannot be one descriptor: use .contiguous() on "
                             "region memory, or one Descriptor per contiguous piece")
        return obj.data_ptr(), obj.numel() * obj.element_size()
    if is_numpy_array(obj):
        if not (obj.flags.c_contiguous or obj.flags.f_contiguous):
            raise ValueError("a non-contiguous array cannot be one descriptor: use one Descriptor per "
                             "contiguous piece")
        return obj.__array_interface__["data"][0], obj.nbytes
    mv = memoryview(obj)
    if not mv.contiguous:
        raise ValueError("a non-contiguous buffer cannot be one descriptor")
    n = mv.nbytes
    if n == 0:
        return 0, 0
    if mv.readonly:
        np = _numpy()
        if np is None:
            raise ValueError("a read-only buffer is not sidecar memory: regions are writable")
        return np.frombuffer(mv, dtype=np.uint8).__array_interface__["data"][0], n
    probe = (ctypes.c_char * n).from_buffer(mv.cast("B"))
    try:
        return ctypes.addressof(probe), n
    finally:
        del probe


class Descriptor:
    """A contiguous range of memory for an operation, as in nixl_connect.

    Accepts: a NumPy array or CPU PyTorch tensor allocated by Connector.empty()/zeros() or a
    contiguous slice of one; a memoryview of a region (Region.memoryview()[a:b]);
    (region, offset, length) with a Region or a region id; a CUDA tensor (registered with the
    sidecar by its CUDA IPC handle on first use); (dptr, size, device) for raw CUDA memory from
    cuMemAlloc. Holds a reference to the object, so the memory lives as long as the descriptor.
    Host memory outside every region raises NotInRegionError when an operation uses it."""

    def __init__(self, obj: Any):
        self.obj = obj
        self.kind: str
        self.region_id: Optional[str] = None
        self.offset = 0
        self.length = 0
        self.addr = 0
        self.device = 0
        if isinstance(obj, Descriptor):
            self.__dict__.update(obj.__dict__)
            return
        if isinstance(obj, tuple):
            if len(obj) != 3:
                raise ValueError("a tuple descriptor is (region, offset, length) or (dptr, size, device)")
            first, a, b = obj
            if isinstance(first, (Region, str)):
                self.kind = "region"
                self.region_id = first.region_id if isinstance(first, Region) else first
                self.offset, self.length = int(a), int(b)
                if self.offset < 0 or self.length <= 0:
                    raise ValueError("(region, offset, length): offset must be >= 0 and length > 0")
                return
            if isinstance(first, int):
                self.kind = "cuda_ptr"
                self.addr, self.length, self.device = first, int(a), int(b)
                if self.length <= 0:
                    raise ValueError("(dptr, size, device): size must be > 0")
                # Now, on the caller's thread, where its CUDA context is current (the blocking
                # client runs the calls on its own thread, which has none).
                self._ipc = self._pointer_ipc()
                return
            raise TypeError("a tuple descriptor is (region, offset, length) or (dptr, size, device), "
                            "got a %s first" % type(first).__name__)
        if is_torch_tensor(obj) and obj.is_cuda:
            if not obj.is_contiguous():
                raise ValueError("a non-contiguous CUDA tensor cannot be one descriptor: use .contiguous()")
            self.kind = "cuda_tensor"
            self.device = obj.device.index or 0
            self.length = obj.numel() * obj.element_size()
            if self.length == 0:
                raise ValueError("an empty CUDA tensor cannot be a descriptor")
            self.addr = obj.data_ptr()
            # From the driver, not from untyped_storage()._share_cuda_(): that call pins the
            # storage in this process until a PyTorch receiver lets go, which the sidecar never is.
            self._ipc = self._pointer_ipc()
            return
        self.kind = "host"
        self.addr, self.length = buffer_address(obj)
        if self.length == 0:
            raise ValueError("an empty buffer cannot be a descriptor")

    def cuda_ipc(self) -> Tuple[int, bytes, int, int]:
        """(device, 64-byte IPC handle of the allocation block, offset in the block, size) of CUDA
        memory, as the driver gives them (cuMemGetAddressRange + cuIpcGetMemHandle on the block's
        base), looked up when the descriptor was made."""
        return self._ipc

    def _pointer_ipc(self) -> Tuple[int, bytes, int, int]:
        from . import _cuda
        handle, base, size = _cuda.ipc_range(self.addr, self.device)
        self.device_uuid = _cuda.device_uuid(self.device)
        if self.addr + self.length > base + size:
            raise ValueError("(dptr, size, device): 0x%x + %d runs past its allocation (%d bytes at 0x%x)"
                             % (self.addr, self.length, size, base))
        return self.device, handle, self.addr - base, self.length

    def __repr__(self) -> str:
        if self.kind == "region":
            return "Descriptor(%s, %d, %d)" % (self.region_id, self.offset, self.length)
        return "Descriptor(%s, %d bytes)" % (self.kind, self.length)


DescriptorLike = Union[Descriptor, Any]


def as_descriptors(descs: Any) -> list:
    """One Descriptor or array-like, or a list/tuple of them, as a list of Descriptors. A plain
    3-tuple is one descriptor ((region, offset, length) or (dptr, size, device))."""
    if isinstance(descs, tuple) and len(descs) == 3 and isinstance(descs[0], (Region, str, int)):
        return [Descriptor(descs)]
    if isinstance(descs, (list, tuple)):
        out = [d if isinstance(d, Descriptor) else Descriptor(d) for d in descs]
        if not out:
            raise ValueError("no descriptors given")
        return out
    return [descs if isinstance(descs, Descriptor) else Descriptor(descs)]
