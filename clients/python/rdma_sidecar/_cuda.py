# SPDX-License-Identifier: Apache-2.0
"""The two CUDA driver calls the package needs for raw device pointers (Descriptor((dptr, size,
device))): cuMemGetAddressRange (the allocation block a pointer lies in) and cuIpcGetMemHandle (the
block's IPC handle, which the sidecar opens). Loads SC_TEST_CUDA_DRIVER when set (the test suite's
stand-in driver), else libcuda.so.1; loaded on first use only. The caller's CUDA context must be
current on the calling thread, as for any driver call."""
import ctypes
import os
from typing import Tuple

_lib = None


def _load():
    global _lib
    if _lib is None:
        name = os.environ.get("SC_TEST_CUDA_DRIVER") or "libcuda.so.1"
        try:
            _lib = ctypes.CDLL(name)
        except OSError as e:
            raise RuntimeError("rdma_sidecar: cannot load the CUDA driver %s (%s): raw CUDA pointers need "
                               "libcuda.so.1" % (name, e)) from None
        _lib.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t),
                                                 ctypes.c_uint64]
        _lib.cuIpcGetMemHandle.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
    return _lib


def ipc_range(dptr: int) -> Tuple[bytes, int, int]:
    """(64-byte IPC handle of the allocation block, the block's base, the block's size) for dptr."""
    lib = _load()
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    rc = lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), dptr)
    if rc != 0:
        raise ValueError("rdma_sidecar: 0x%x is not CUDA device memory of the current context "
                         "(cuMemGetAddressRange: error %d)" % (dptr, rc))
    handle = ctypes.create_string_buffer(64)
    rc = lib.cuIpcGetMemHandle(handle, base.value)
    if rc != 0:
        raise ValueError("rdma_sidecar: cuIpcGetMemHandle(0x%x) failed with error %d: the memory must come "
                         "from cuMemAlloc (not cuMemCreate or managed memory)" % (base.value, rc))
    return handle.raw, base.value, size.value
