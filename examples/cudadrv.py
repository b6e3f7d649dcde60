# SPDX-License-Identifier: Apache-2.0
"""A small ctypes wrapper over the CUDA driver API, for worker processes in tests and examples.

Loads the library named by SC_TEST_CUDA_DRIVER when set (the stand-in driver of tests/fake_cuda,
which is NOT a GPU: see tests/fake_cuda/README.md), else the real "libcuda.so.1". Entry points are
resolved with cuGetProcAddress_v2 by base name (so the real driver hands out the right versioned
symbols), falling back to dlsym of the `_v2` name, then of the plain name.

    import cudadrv as cu
    cu.init(0)                       # cuInit + device 0's primary context, current on this thread
    p = cu.alloc(1 << 20); cu.htod(p, b"x" * 100); cu.dtoh(p, 100)
    h = cu.ipc_handle(p)             # 64 bytes for another process: cu.ipc_open(h)

Every failing call raises CudaError(code, name, text). The current context is per thread, as in
CUDA: call init() (or set_current()) on each thread that calls the driver.
"""
import ctypes
import os

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_ILLEGAL_ADDRESS = 700
CUDA_ERROR_NOT_SUPPORTED = 801

CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1
CU_POINTER_ATTRIBUTE_CONTEXT = 1
CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
CU_MEMORYTYPE_HOST = 1
CU_MEMORYTYPE_DEVICE = 2
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED = 116
CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124
CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = 110
CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE = 15

c_ptr = ctypes.c_uint64  # CUdeviceptr
c_handle = ctypes.c_void_p  # CUcontext, CUstream, CUevent
P = ctypes.POINTER


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


class MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class MemAllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", MemLocation), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", _AllocFlags)]


class MemAccessDesc(ctypes.Structure):
    _fields_ = [("location", MemLocation), ("flags", ctypes.c_int)]


# base name -> argument types (all return CUresult, an int)
_PROTOS = {
    "cuInit": [ctypes.c_uint],
    "cuDriverGetVersion": [P(ctypes.c_int)],
    "cuDeviceGetCount": [P(ctypes.c_int)],
    "cuDeviceGet": [P(ctypes.c_int), ctypes.c_int],
    "cuDeviceGetName": [ctypes.c_char_p, ctypes.c_int, ctypes.c_int],
    "cuDeviceGetPCIBusId": [ctypes.c_char_p, ctypes.c_int, ctypes.c_int],
    "cuDeviceTotalMem": [P(ctypes.c_size_t), ctypes.c_int],
    "cuDeviceGetAttribute": [P(ctypes.c_int), ctypes.c_int, ctypes.c_int],
    "cuGetErrorName": [ctypes.c_int, P(ctypes.c_char_p)],
    "cuGetErrorString": [ctypes.c_int, P(ctypes.c_char_p)],
    "cuDevicePrimaryCtxRetain": [P(c_handle), ctypes.c_int],
    "cuDevicePrimaryCtxRelease": [ctypes.c_int],
    "cuCtxSetCurrent": [c_handle],
    "cuCtxGetCurrent": [P(c_handle)],
    "cuCtxGetDevice": [P(ctypes.c_int)],
    "cuCtxSynchronize": [],
    "cuMemAlloc": [P(c_ptr), ctypes.c_size_t],
    "cuMemFree": [c_ptr],
    "cuMemGetAddressRange": [P(c_ptr), P(ctypes.c_size_t), c_ptr],
    "cuPointerGetAttribute": [ctypes.c_void_p, ctypes.c_int, c_ptr],
    "cuMemsetD8": [c_ptr, ctypes.c_ubyte, ctypes.c_size_t],
    "cuMemsetD8Async": [c_ptr, ctypes.c_ubyte, ctypes.c_size_t, c_handle],
    "cuMemHostAlloc": [P(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint],
    "cuMemFreeHost": [ctypes.c_void_p],
    "cuMemHostRegister": [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint],
    "cuMemHostUnregister": [ctypes.c_void_p],
    "cuMemcpyHtoD": [c_ptr, ctypes.c_void_p, ctypes.c_size_t],
    "cuMemcpyDtoH": [ctypes.c_void_p, c_ptr, ctypes.c_size_t],
    "cuMemcpyDtoD": [c_ptr, c_ptr, ctypes.c_size_t],
    "cuMemcpy": [c_ptr, c_ptr, ctypes.c_size_t],
    "cuMemcpyPeer": [c_ptr, c_handle, c_ptr, c_handle, ctypes.c_size_t],
    "cuMemcpyHtoDAsync": [c_ptr, ctypes.c_void_p, ctypes.c_size_t, c_handle],
    "cuMemcpyDtoHAsync": [ctypes.c_void_p, c_ptr, ctypes.c_size_t, c_handle],
    "cuMemcpyDtoDAsync": [c_ptr, c_ptr, ctypes.c_size_t, c_handle],
    "cuMemcpyAsync": [c_ptr, c_ptr, ctypes.c_size_t, c_handle],
    "cuMemcpyPeerAsync": [c_ptr, c_handle, c_ptr, c_handle, ctypes.c_size_t, c_handle],
    "cuStreamCreate": [P(c_handle), ctypes.c_uint],
    "cuStreamDestroy": [c_handle],
    "cuStreamSynchronize": [c_handle],
    "cuStreamQuery": [c_handle],
    "cuStreamWaitEvent": [c_handle, c_handle, ctypes.c_uint],
    "cuEventCreate": [P(c_handle), ctypes.c_uint],
    "cuEventDestroy": [c_handle],
    "cuEventRecord": [c_handle, c_handle],
    "cuEventSynchronize": [c_handle],
    "cuEventQuery": [c_handle],
    "cuIpcGetMemHandle": [P(IpcHandle), c_ptr],
    "cuIpcOpenMemHandle": [P(c_ptr), IpcHandle, ctypes.c_uint],
    "cuIpcCloseMemHandle": [c_ptr],
    "cuMemGetHandleForAddressRange": [ctypes.c_void_p, c_ptr, ctypes.c_size_t, ctypes.c_int,
                                      ctypes.c_ulonglong],
    "cuMemGetAllocationGranularity": [P(ctypes.c_size_t), P(MemAllocationProp), ctypes.c_int],
    "cuMemCreate": [P(ctypes.c_ulonglong), ctypes.c_size_t, P(MemAllocationProp), ctypes.c_ulonglong],
    "cuMemExportToShareableHandle": [ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_int, ctypes.c_ulonglong],
    "cuMemImportFromShareableHandle": [P(ctypes.c_ulonglong), ctypes.c_void_p, ctypes.c_int],
    "cuMemAddressReserve": [P(c_ptr), ctypes.c_size_t, ctypes.c_size_t, c_ptr, ctypes.c_ulonglong],
    "cuMemAddressFree": [c_ptr, ctypes.c_size_t],
    "cuMemMap": [c_ptr, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_ulonglong, ctypes.c_ulonglong],
    "cuMemUnmap": [c_ptr, ctypes.c_size_t],
    "cuMemSetAccess": [c_ptr, ctypes.c_size_t, P(MemAccessDesc), ctypes.c_size_t],
    "cuMemRelease": [ctypes.c_ulonglong],
    "cuFlushGPUDirectRDMAWrites": [ctypes.c_int, ctypes.c_int],
}


class CudaError(Exception):
    def __init__(self, code, name, text, call=""):
        self.code, self.name, self.text, self.call = code, name, text, call
        super().__init__("%s: %s (%d): %s" % (call or "CUDA", name, code, text))


_lib = None
_fns = {}
_ctx = {}  # device -> primary context retained by init()
_vmm = {}  # dptr -> (allocation handle, size)


def library_path():
    return os.environ.get("SC_TEST_CUDA_DRIVER") or "libcuda.so.1"


def _load():
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL(library_path())
    return _lib


def fn(name):
    """The ctypes function for a driver entry point (base name, e.g. "cuMemAlloc")."""
    f = _fns.get(name)
    if f is not None:
        return f
    lib = _load()
    addr = ctypes.c_void_p()
    gpa = getattr(lib, "cuGetProcAddress_v2", None)
    if gpa is not None:
        gpa.restype = ctypes.c_int
        gpa.argtypes = [ctypes.c_char_p, P(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64, P(ctypes.c_int)]
        status = ctypes.c_int()
        if gpa(name.encode(), ctypes.byref(addr), 12000, 0, ctypes.byref(status)) != 0:
            addr = ctypes.c_void_p()
    proto = ctypes.CFUNCTYPE(ctypes.c_int, *_PROTOS[name])
    if addr.value:
        f = proto(addr.value)
    else:
        for sym in (name + "_v2", name):
            try:
                f = proto((sym, lib))
                break
            except AttributeError:
                continue
        if f is None:
            raise CudaError(CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found", name)
    _fns[name] = f
    return f


def error_text(code):
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    n = fn("cuGetErrorName")(code, ctypes.byref(name))
    t = fn("cuGetErrorString")(code, ctypes.byref(text))
    return ((name.value or b"").decode() if n == 0 else "CUDA_ERROR_%d" % code,
            (text.value or b"").decode() if t == 0 else "unknown error")


def raw(name, *args):
    """Calls an entry point and returns its CUresult (for tests that expect failures)."""
    return fn(name)(*args)


def check(name, *args):
    code = fn(name)(*args)
    if code != CUDA_SUCCESS:
        n, t = error_text(code)
        raise CudaError(code, n, t, name)


def device_count():
    n = ctypes.c_int()
    check("cuDeviceGetCount", ctypes.byref(n))
    return n.value


def device_name(device=0):
    """The device's name, e.g. "NVIDIA H100 80GB HBM3"."""
    dev = ctypes.c_int()
    check("cuDeviceGet", ctypes.byref(dev), device)
    buf = ctypes.create_string_buffer(256)
    check("cuDeviceGetName", buf, 256, dev)
    return buf.value.decode(errors="replace")


def init(device=0):
    """cuInit, then the primary context of `device`, made current on the calling thread."""
    check("cuInit", 0)
    ctx = _ctx.get(device)
    if ctx is None:
        c = c_handle()
        check("cuDevicePrimaryCtxRetain", ctypes.byref(c), device)
        ctx = _ctx[device] = c.value
    check("cuCtxSetCurrent", ctx)
    return ctx


def set_current(device):
    check("cuCtxSetCurrent", _ctx[device])


def alloc(size):
    p = c_ptr()
    check("cuMemAlloc", ctypes.byref(p), size)
    return p.value


def free(dptr):
    check("cuMemFree", dptr)


def ipc_handle(dptr):
    h = IpcHandle()
    check("cuIpcGetMemHandle", ctypes.byref(h), dptr)
    return bytes(ctypes.string_at(ctypes.addressof(h), 64))


def ipc_open(handle, flags=CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS):
    if len(handle) != 64:
        raise ValueError("a CUDA IPC handle is 64 bytes, got %d" % len(handle))
    h = IpcHandle()
    ctypes.memmove(ctypes.addressof(h), handle, 64)
    p = c_ptr()
    check("cuIpcOpenMemHandle", ctypes.byref(p), h, flags)
    return p.value


def ipc_close(dptr):
    check("cuIpcCloseMemHandle", dptr)


def htod(dptr, data, sync=True):
    """Copies data (pageable host memory) to dptr. The driver may return before the bytes reach
    device memory ("the DMA to final destination may not have completed"); later work of this
    context sees them, another process (the sidecar) may not: sync=True (the default) waits with
    cuCtxSynchronize, as a worker must before it hands the memory to the sidecar."""
    data = bytes(data)
    buf = ctypes.create_string_buffer(data, len(data))
    check("cuMemcpyHtoD", dptr, buf, len(data))
    if sync:
        check("cuCtxSynchronize")


def dtoh(dptr, n):
    buf = ctypes.create_string_buffer(n)
    check("cuMemcpyDtoH", buf, dptr, n)
    return buf.raw


def _prop(device):
    prop = MemAllocationProp()
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    return prop


def _map(handle, size, device):
    p = c_ptr()
    check("cuMemAddressReserve", ctypes.byref(p), size, 0, 0, 0)
    try:
        check("cuMemMap", p.value, size, 0, handle, 0)
        acc = MemAccessDesc()
        acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE
        acc.location.id = device
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        check("cuMemSetAccess", p.value, size, ctypes.byref(acc), 1)
    except CudaError:
        raw("cuMemUnmap", p.value, size)
        raw("cuMemAddressFree", p.value, size)
        raise
    _vmm[p.value] = (handle, size)
    return p.value


def vmm_alloc(size, device=0, gdr=None):
    """cuMemCreate (POSIX fd shareable) + map: (dptr, fd, alloc_size). The fd is the caller's.
    gdr: allocate with allocFlags.gpuDirectRDMACapable (without it a NIC cannot reach the memory by
    GPUDirect RDMA and the sidecar stages it); None: whenever the device supports it
    (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED)."""
    prop = _prop(device)
    if gdr is None:
        v = ctypes.c_int(0)
        gdr = raw("cuDeviceGetAttribute", ctypes.byref(v), CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                  device) == 0 and v.value == 1
    prop.allocFlags.gpuDirectRDMACapable = 1 if gdr else 0
    gran = ctypes.c_size_t()
    check("cuMemGetAllocationGranularity", ctypes.byref(gran), ctypes.byref(prop), 0)
    asize = (size + gran.value - 1) // gran.value * gran.value
    h = ctypes.c_ulonglong()
    check("cuMemCreate", ctypes.byref(h), asize, ctypes.byref(prop), 0)
    try:
        fd = ctypes.c_int(-1)
        check("cuMemExportToShareableHandle", ctypes.byref(fd), h.value,
              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
        try:
            dptr = _map(h.value, asize, device)
        except CudaError:
            os.close(fd.value)
            raise
    except CudaError:
        raw("cuMemRelease", h.value)
        raise
    return dptr, fd.value, asize


def vmm_import(fd, size, device=0):
    """Maps memory shared as a POSIX fd (e.g. taken with pidfd_getfd): dptr. The fd stays the caller's."""
    h = ctypes.c_ulonglong()
    check("cuMemImportFromShareableHandle", ctypes.byref(h), ctypes.c_void_p(fd),
          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    try:
        return _map(h.value, size, device)
    except CudaError:
        raw("cuMemRelease", h.value)
        raise


def vmm_free(dptr, fd=None):
    """Unmaps and releases what vmm_alloc or vmm_import mapped; closes fd when given."""
    handle, size = _vmm.pop(dptr)
    check("cuMemUnmap", dptr, size)
    check("cuMemAddressFree", dptr, size)
    check("cuMemRelease", handle)
    if fd is not None:
        os.close(fd)
