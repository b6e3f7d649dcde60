# SPDX-License-Identifier: Apache-2.0
"""The few CUDA driver calls the package needs to share device memory with the sidecar: which
allocation block a pointer lies in (cuMemGetAddressRange), the block's IPC handle
(cuIpcGetMemHandle), and the pointer's device (cuPointerGetAttribute DEVICE_ORDINAL).

Used for CUDA tensors and raw device pointers alike. CUDA tensors are NOT shared through PyTorch's
`untyped_storage()._share_cuda_()`: that call marks the storage as sent to another process, with a
reference count only a PyTorch receiver ever gives back, so the caching allocator never reuses the
block (and after about a thousand calls every call synchronizes); since PyTorch 2.5 it also returns
a 66-byte handle (version, type, then the 64-byte cudaIpcMemHandle). The driver answers the same
question without side effects.

Loads SC_TEST_CUDA_DRIVER when set (the test suite's stand-in driver), else libcuda.so.1; loaded on
first use only. A pointer is looked up in the context current on the calling thread when there is
one on the right device; otherwise in the device's primary context (the one PyTorch and the CUDA
runtime use), pushed for the call and popped after, so any thread may call."""
import ctypes
import os
import threading
from typing import Tuple

_lib = None
_lock = threading.Lock()
CUDA_ERROR_INVALID_CONTEXT = 201
CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9


def _load():
    global _lib
    with _lock:
        if _lib is None:
            name = os.environ.get("SC_TEST_CUDA_DRIVER") or "libcuda.so.1"
            try:
                lib = ctypes.CDLL(name)
            except OSError as e:
                raise RuntimeError("rdma_sidecar: cannot load the CUDA driver %s (%s): CUDA memory needs "
                                   "libcuda.so.1" % (name, e)) from None
            P, u64, vp = ctypes.POINTER, ctypes.c_uint64, ctypes.c_void_p
            lib.cuInit.argtypes = [ctypes.c_uint]
            lib.cuMemGetAddressRange_v2.argtypes = [P(u64), P(ctypes.c_size_t), u64]
            lib.cuIpcGetMemHandle.argtypes = [ctypes.c_char_p, u64]
            lib.cuPointerGetAttribute.argtypes = [vp, ctypes.c_int, u64]
            lib.cuCtxGetCurrent.argtypes = [P(vp)]
            lib.cuCtxGetDevice.argtypes = [P(ctypes.c_int)]
            lib.cuDeviceGet.argtypes = [P(ctypes.c_int), ctypes.c_int]
            lib.cuDevicePrimaryCtxRetain.argtypes = [P(vp), ctypes.c_int]
            lib.cuDevicePrimaryCtxRelease_v2.argtypes = [ctypes.c_int]
            lib.cuCtxPushCurrent_v2.argtypes = [vp]
            lib.cuCtxPopCurrent_v2.argtypes = [P(vp)]
            lib.cuGetErrorName.argtypes = [ctypes.c_int, P(ctypes.c_char_p)]
            lib.cuDeviceGetUuid_v2.argtypes = [ctypes.c_char_p, ctypes.c_int]
            lib.cuCtxSynchronize.argtypes = []
            rc = lib.cuInit(0)
            if rc != 0:
                raise RuntimeError("rdma_sidecar: cuInit failed with %s: no usable GPU in this process"
                                   % _name(lib, rc))
            _lib = lib
    return _lib


def _name(lib, rc: int) -> str:
    s = ctypes.c_char_p()
    if lib.cuGetErrorName(rc, ctypes.byref(s)) == 0 and s.value:
        return "%s (%d)" % (s.value.decode(), rc)
    return "error %d" % rc


class _DeviceContext:
    """The current context when it is on `device` (or device is None), else the device's primary
    context, pushed on enter and popped (and released) on exit."""

    def __init__(self, lib, device):
        self.lib, self.device, self.pushed = lib, device, None

    def __enter__(self):
        lib, cur = self.lib, ctypes.c_void_p()
        if lib.cuCtxGetCurrent(ctypes.byref(cur)) == 0 and cur.value:
            dev = ctypes.c_int()
            if self.device is None or (lib.cuCtxGetDevice(ctypes.byref(dev)) == 0 and dev.value == self.device):
                return self
        if self.device is None:
            return self  # no context: the calls below answer INVALID_CONTEXT, reported as such
        dev = ctypes.c_int()
        rc = lib.cuDeviceGet(ctypes.byref(dev), self.device)
        if rc != 0:
            raise ValueError("rdma_sidecar: CUDA device %d does not exist in this process (cuDeviceGet: %s)"
                             % (self.device, _name(lib, rc)))
        ctx = ctypes.c_void_p()
        rc = lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value)
        if rc != 0:
            raise ValueError("rdma_sidecar: cannot use CUDA device %d's primary context (%s)"
                             % (self.device, _name(lib, rc)))
        rc = lib.cuCtxPushCurrent_v2(ctx)
        if rc != 0:
            lib.cuDevicePrimaryCtxRelease_v2(dev.value)
            raise ValueError("rdma_sidecar: cuCtxPushCurrent failed on device %d (%s)" % (self.device, _name(lib, rc)))
        self.pushed = dev.value
        return self

    def __exit__(self, *exc):
        if self.pushed is not None:
            popped = ctypes.c_void_p()
            self.lib.cuCtxPopCurrent_v2(ctypes.byref(popped))
            self.lib.cuDevicePrimaryCtxRelease_v2(self.pushed)
        return False


def synchronize(device: int) -> None:
    """Waits until every stream of `device`'s primary context (PyTorch's, the CUDA runtime's) has
    finished, so that the sidecar, another process, sees what they wrote: kernels, async copies,
    and synchronous copies from pageable memory, whose DMA may land after the call returned."""
    lib = _load()
    with _DeviceContext(lib, device):
        rc = lib.cuCtxSynchronize()
    if rc != 0:
        raise RuntimeError("rdma_sidecar: cuCtxSynchronize on CUDA device %d failed with %s: the GPU work that "
                           "produced this memory failed" % (device, _name(lib, rc)))


def device_uuid(device: int) -> str:
    """The UUID of this process's CUDA device `device` as nvidia-smi prints it ("GPU-..."): what
    names the GPU to the sidecar, whose device numbering may differ (CUDA_VISIBLE_DEVICES)."""
    lib = _load()
    dev = ctypes.c_int()
    rc = lib.cuDeviceGet(ctypes.byref(dev), device)
    if rc != 0:
        raise ValueError("rdma_sidecar: CUDA device %d does not exist in this process (cuDeviceGet: %s)"
                         % (device, _name(lib, rc)))
    u = ctypes.create_string_buffer(16)
    rc = lib.cuDeviceGetUuid_v2(u, dev.value)
    if rc != 0:
        raise ValueError("rdma_sidecar: cuDeviceGetUuid(%d) failed with %s" % (device, _name(lib, rc)))
    h = u.raw.hex()
    return "GPU-%s-%s-%s-%s-%s" % (h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])


def ipc_range(dptr: int, device=None) -> Tuple[bytes, int, int]:
    """(64-byte IPC handle of the allocation block, the block's base, the block's size) for dptr,
    a pointer into memory from cuMemAlloc/cudaMalloc (PyTorch's caching allocator included).
    device: the CUDA device the pointer must be on (checked), or None for the current context's."""
    lib = _load()
    with _DeviceContext(lib, device):
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        rc = lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), dptr)
        if rc != 0:
            where = "the current context" if device is None else "device %d" % device
            raise ValueError("rdma_sidecar: 0x%x is not CUDA device memory of %s (cuMemGetAddressRange: %s)"
                             % (dptr, where, _name(lib, rc)))
        if device is not None:
            ordinal = ctypes.c_int(-1)
            rc = lib.cuPointerGetAttribute(ctypes.byref(ordinal), CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dptr)
            if rc == 0 and ordinal.value != device:
                raise ValueError("rdma_sidecar: 0x%x lies on CUDA device %d, not device %d as given"
                                 % (dptr, ordinal.value, device))
        handle = ctypes.create_string_buffer(64)
        rc = lib.cuIpcGetMemHandle(handle, base.value)
        if rc != 0:
            raise ValueError(
                "rdma_sidecar: cuIpcGetMemHandle(0x%x) failed with %s: CUDA IPC shares only memory from "
                "cuMemAlloc/cudaMalloc. Memory from cuMemCreate (PyTorch with "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or managed memory) cannot be shared this "
                "way: turn expandable segments off for tensors the sidecar moves, or register cuMemCreate "
                "memory by file descriptor (RegisterRegion cuda_fd)" % (base.value, _name(lib, rc)))
        return handle.raw, base.value, size.value
