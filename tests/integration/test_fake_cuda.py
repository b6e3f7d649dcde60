# SPDX-License-Identifier: Apache-2.0
"""The stand-in CUDA driver (tests/fake_cuda) behaves as the tests of the sidecar's GPU paths assume.

The stand-in is NOT a GPU: it models the driver API over host memory (see tests/fake_cuda/README.md
for what it cannot prove). This test proves the model itself: device memory that host code cannot
dereference, bounds-checked copies compared byte for byte, streams that really run asynchronously,
IPC handles opened by another process, the virtual memory API's fd taken with pidfd_getfd by another
process, dma-buf export not supported, injected copy failures. Scenarios that need their own
FAKE_CUDA_* environment (read at cuInit) run in child processes. Skipped (77) when SC_FAKE_CUDA,
set by ctest when the library was built, is empty.
"""
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = os.environ.get("SC_FAKE_CUDA", "")
SLOW = float(os.environ.get("SC_TEST_SLOW", "1"))
TIMEOUT = 60 * SLOW

if __name__ == "__main__" and not LIB:
    print("skipped: SC_FAKE_CUDA is empty (the stand-in driver is built only where cuda.h exists)")
    sys.exit(77)

os.environ["SC_TEST_CUDA_DRIVER"] = LIB
SHM = tempfile.mkdtemp(prefix="sc-fakecuda-test-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
os.environ["FAKE_CUDA_SHM_DIR"] = SHM
for k in ("FAKE_CUDA_DEVICES", "FAKE_CUDA_FAIL_COPY_AT", "FAKE_CUDA_FAIL_COPY_DIR", "FAKE_CUDA_COPY_DELAY_US",
          "FAKE_CUDA_STICKY", "FAKE_CUDA_DMA_BUF", "FAKE_CUDA_GDR", "FAKE_CUDA_FAIL_COPY_ERROR",
          "FAKE_CUDA_PCI_BUS_IDS"):
    os.environ.pop(k, None)
EXAMPLES = os.path.abspath(os.path.join(HERE, "..", "..", "examples"))  # cudadrv.py lives there
sys.path.insert(0, EXAMPLES)

import cudadrv as cu  # noqa: E402

PRELUDE = "import sys, os, ctypes\nsys.path.insert(0, %r)\nimport cudadrv as cu\n" % EXAMPLES


def child(code, env=None, stdin=None, timeout=None):
    """Runs `code` (after PRELUDE) in a fresh /usr/bin/python3 with extra environment."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", PRELUDE + code], env=e, input=stdin,
                          capture_output=True, timeout=timeout or TIMEOUT)


def pidfd_getfd(pidfd, fd):
    libc = ctypes.CDLL(None, use_errno=True)
    r = libc.syscall(438, pidfd, fd, 0)  # SYS_pidfd_getfd (x86_64 and arm64 alike)
    if r < 0:
        raise OSError(ctypes.get_errno(), "pidfd_getfd")
    return r


class FakeCudaTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cu.init(0)

    def setUp(self):
        cu.set_current(0)

    def assertCuda(self, code, name, *args):
        got = cu.raw(name, *args)
        self.assertEqual(got, code, "%s returned %s, expected %s" % (name, cu.error_text(got), cu.error_text(code)))

    def assertChildOk(self, r):
        self.assertEqual(r.returncode, 0, "child failed:\n%s\n%s" % (r.stdout.decode(), r.stderr.decode()))
        return r.stdout.decode()

    # ---- devices, contexts, lookup ---------------------------------------------------------------

    def test_devices_and_attributes(self):
        self.assertEqual(cu.device_count(), 2)
        v = ctypes.c_int()
        cu.check("cuDriverGetVersion", ctypes.byref(v))
        self.assertEqual(v.value, 13000)
        name = ctypes.create_string_buffer(128)
        cu.check("cuDeviceGetName", name, 128, 1)
        self.assertEqual(name.value, b"Stand-in GPU 1 (host memory)")
        bus = ctypes.create_string_buffer(32)
        cu.check("cuDeviceGetPCIBusId", bus, 32, 1)
        self.assertEqual(bus.value, b"0000:02:00.0")
        mem = ctypes.c_size_t()
        cu.check("cuDeviceTotalMem", ctypes.byref(mem), 0)
        self.assertEqual(mem.value, 16 << 30)
        for attr, want in ((cu.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9),
                           (cu.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0),
                           (cu.CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 0),
                           (cu.CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 0)):
            cu.check("cuDeviceGetAttribute", ctypes.byref(v), attr, 0)
            self.assertEqual(v.value, want, "attribute %d" % attr)
        self.assertCuda(cu.CUDA_ERROR_INVALID_DEVICE, "cuDeviceGetAttribute", ctypes.byref(v), 75, 2)
        self.assertEqual(cu.error_text(cu.CUDA_ERROR_ILLEGAL_ADDRESS),
                         ("CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"))

    def test_pci_bus_ids_from_the_environment(self):
        # Stand-in GPUs where a topology fixture's GPUs are (tests/unit/topology/dgx8.xml): the
        # entries as written (either form), the attributes parsed; devices past the list keep
        # the default.
        code = """
cu.init(0)
for d in range(3):
    bus = ctypes.create_string_buffer(32)
    cu.check("cuDeviceGetPCIBusId", bus, 32, d)
    vals = []
    for a in (33, 34, 50):  # CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, PCI_DEVICE_ID, PCI_DOMAIN_ID
        v = ctypes.c_int()
        cu.check("cuDeviceGetAttribute", ctypes.byref(v), a, d)
        vals.append(v.value)
    print(bus.value.decode(), *vals)
"""
        r = child(code, env={"FAKE_CUDA_DEVICES": "3", "FAKE_CUDA_PCI_BUS_IDS": "0000:b3:00.0,00000001:1A:1f.0"})
        self.assertEqual(self.assertChildOk(r).split("\n")[:3],
                         ["0000:b3:00.0 179 0 0", "00000001:1A:1f.0 26 31 1", "0000:03:00.0 3 0 0"])
        r = child("print(cu.raw('cuInit', 0))", env={"FAKE_CUDA_PCI_BUS_IDS": "0000:13:00.0,bogus"})
        self.assertEqual(self.assertChildOk(r).strip(), str(cu.CUDA_ERROR_INVALID_VALUE))
        self.assertIn("FAKE_CUDA_PCI_BUS_IDS entry 1", r.stderr.decode())

    def test_get_proc_address(self):
        lib = ctypes.CDLL(LIB)
        gpa = lib.cuGetProcAddress_v2
        gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                        ctypes.POINTER(ctypes.c_int)]
        p, st = ctypes.c_void_p(), ctypes.c_int(-1)
        self.assertEqual(gpa(b"cuMemAlloc", ctypes.byref(p), 12000, 0, ctypes.byref(st)), 0)
        self.assertEqual(st.value, 0)
        self.assertEqual(p.value, ctypes.cast(lib.cuMemAlloc_v2, ctypes.c_void_p).value)
        self.assertEqual(gpa(b"cuIpcOpenMemHandle", ctypes.byref(p), 12000, 0, ctypes.byref(st)), 0)
        self.assertEqual(p.value, ctypes.cast(lib.cuIpcOpenMemHandle_v2, ctypes.c_void_p).value)
        self.assertEqual(gpa(b"cuNoSuchThing", ctypes.byref(p), 12000, 0, ctypes.byref(st)),
                         cu.CUDA_ERROR_NOT_FOUND)
        self.assertEqual(st.value, 1)  # CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
        self.assertIsNone(p.value)
        for base in cu._PROTOS:  # every entry point the wrapper (and the sidecar) asks for by base name
            self.assertEqual(gpa(base.encode(), ctypes.byref(p), 12000, 0, ctypes.byref(st)), 0, base)
            self.assertTrue(p.value, base)
        for sym in ("cuMemAlloc", "cuMemAlloc_v2", "cuMemcpyDtoHAsync_v2", "cuDeviceTotalMem_v2",
                    "cuMemHostRegister_v2", "cuDevicePrimaryCtxRelease_v2", "cuStreamDestroy_v2"):
            self.assertTrue(hasattr(lib, sym), sym)

    def test_no_context_on_a_new_thread(self):
        out = {}

        def run():
            p = cu.c_ptr()
            out["alloc"] = cu.raw("cuMemAlloc", ctypes.byref(p), 4096)
            d = ctypes.c_int()
            out["dev"] = cu.raw("cuCtxGetDevice", ctypes.byref(d))
        t = threading.Thread(target=run)
        t.start()
        t.join(TIMEOUT)
        self.assertEqual(out, {"alloc": cu.CUDA_ERROR_INVALID_CONTEXT, "dev": cu.CUDA_ERROR_INVALID_CONTEXT})

    def test_no_devices(self):
        r = child("print(cu.raw('cuInit', 0))", env={"FAKE_CUDA_DEVICES": "0"})
        self.assertEqual(self.assertChildOk(r).strip(), str(cu.CUDA_ERROR_NO_DEVICE))

    # ---- memory and copies -----------------------------------------------------------------------

    def test_alloc_copies_bounds(self):
        n = 3 * 1024 * 1024 + 17
        a, b = cu.alloc(n), cu.alloc(n)
        try:
            self.assertEqual(a % (2 << 20), 0)
            data = os.urandom(n)
            cu.htod(a, data)
            self.assertEqual(cu.dtoh(a, n), data)
            cu.check("cuMemcpyDtoD", b + 5, a + 1000, n - 1000)
            self.assertEqual(cu.dtoh(b + 5, n - 1000), data[1000:])
            host = ctypes.create_string_buffer(100)
            cu.check("cuMemcpy", ctypes.addressof(host), a + 7, 100)  # unified: device to host
            self.assertEqual(host.raw, data[7:107])
            base, size = cu.c_ptr(), ctypes.c_size_t()
            cu.check("cuMemGetAddressRange", ctypes.byref(base), ctypes.byref(size), a + 12345)
            self.assertEqual((base.value, size.value), (a, n))
            mt, ordinal = ctypes.c_uint(), ctypes.c_int()
            cu.check("cuPointerGetAttribute", ctypes.byref(mt), cu.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a + 1)
            cu.check("cuPointerGetAttribute", ctypes.byref(ordinal), cu.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a)
            self.assertEqual((mt.value, ordinal.value), (cu.CU_MEMORYTYPE_DEVICE, 0))
            start, rsize = cu.c_ptr(), ctypes.c_size_t()
            cu.check("cuPointerGetAttribute", ctypes.byref(start), 11, a + 999)  # RANGE_START_ADDR
            cu.check("cuPointerGetAttribute", ctypes.byref(rsize), 12, a + 999)  # RANGE_SIZE
            self.assertEqual((start.value, rsize.value), (a, n))
            self.assertCuda(cu.CUDA_ERROR_INVALID_VALUE, "cuPointerGetAttribute", ctypes.byref(start), 4, a)
            # A range crossing the allocation's end, or outside any allocation: refused, nothing copied.
            buf = ctypes.create_string_buffer(b"\xee" * 64, 64)
            self.assertCuda(cu.CUDA_ERROR_INVALID_VALUE, "cuMemcpyDtoH", buf, a + n - 10, 11)
            self.assertCuda(cu.CUDA_ERROR_INVALID_VALUE, "cuMemcpyHtoD", a + n - 10, buf, 11)
            self.assertCuda(cu.CUDA_ERROR_INVALID_VALUE, "cuMemcpyDtoH", buf, a + n + (1 << 20), 1)
            self.assertEqual(buf.raw, b"\xee" * 64)
            self.assertEqual(cu.dtoh(a + n - 10, 10), data[-10:])
            cu.check("cuMemsetD8", b, 0xab, 10)
            self.assertEqual(cu.dtoh(b, 11), b"\xab" * 10 + data[1005:1006])
            # Device 1's memory, copied peer to peer.
            cu.init(1)
            c = cu.alloc(4096)
            cu.check("cuPointerGetAttribute", ctypes.byref(ordinal), cu.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, c)
            self.assertEqual(ordinal.value, 1)
            cu.check("cuMemcpyPeer", c, cu._ctx[1], a, cu._ctx[0], 4096)
            self.assertEqual(cu.dtoh(c, 4096), data[:4096])
            cu.free(c)
            cu.set_current(0)
        finally:
            cu.free(a)
            cu.free(b)
        self.assertCuda(cu.CUDA_ERROR_INVALID_VALUE, "cuMemcpyDtoH", buf, a, 1)  # freed
        self.assertCuda(cu.CUDA_ERROR_INVALID_VALUE, "cuMemFree", a)
        self.assertEqual(os.listdir(SHM), [], "backing files left after cuMemFree")

    def test_pinned_host_memory(self):
        p = ctypes.c_void_p()
        cu.check("cuMemHostAlloc", ctypes.byref(p), 8192, 0)
        mt = ctypes.c_uint()
        cu.check("cuPointerGetAttribute", ctypes.byref(mt), cu.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p.value + 5)
        self.assertEqual(mt.value, cu.CU_MEMORYTYPE_HOST)
        cu.check("cuMemFreeHost", p)
        buf = ctypes.create_string_buffer(8192)
        cu.check("cuMemHostRegister", buf, 8192, 0)
        self.assertCuda(712, "cuMemHostRegister", ctypes.addressof(buf) + 4096, 100, 0)  # already registered
        cu.check("cuPointerGetAttribute", ctypes.byref(mt), cu.CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                 ctypes.addressof(buf))
        self.assertEqual(mt.value, cu.CU_MEMORYTYPE_HOST)
        cu.check("cuMemHostUnregister", buf)
        self.assertCuda(713, "cuMemHostUnregister", buf)  # not registered any more
        self.assertCuda(cu.CUDA_ERROR_INVALID_VALUE, "cuPointerGetAttribute", ctypes.byref(mt),
                        cu.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ctypes.addressof(buf))

    def test_exit_without_free_removes_backing_files(self):
        d = tempfile.mkdtemp(prefix="sc-fakecuda-exit-", dir=os.path.dirname(SHM))
        try:
            r = child("cu.init(0)\nfor i in range(3):\n    cu.alloc(1 << 20)\nprint(len(os.listdir(os.environ['FAKE_CUDA_SHM_DIR'])))\n",
                      env={"FAKE_CUDA_SHM_DIR": d})
            self.assertEqual(self.assertChildOk(r).strip(), "3")
            self.assertEqual(os.listdir(d), [])
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_dma_buf_not_supported(self):
        a = cu.alloc(2 << 20)
        fd = ctypes.c_int(-1)
        self.assertCuda(cu.CUDA_ERROR_NOT_SUPPORTED, "cuMemGetHandleForAddressRange", ctypes.byref(fd), a,
                        2 << 20, cu.CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0)
        self.assertEqual(fd.value, -1)
        cu.free(a)

    def test_dma_buf_export_rules(self):
        # FAKE_CUDA_DMA_BUF=1: DMA_BUF_SUPPORTED is 1 and cuMemGetHandleForAddressRange returns a memfd
        # standing for the dma-buf, under the driver's rules: host-page-aligned address and size,
        # inside one cuMemAlloc allocation (or a mapped cuMemCreate range), flags 0 or PCIE mapping.
        code = r"""
cu.init(0)
PG = os.sysconf("SC_PAGESIZE")
def exp(p, n, flags=0):
    fd = ctypes.c_int(-1)
    rc = cu.raw("cuMemGetHandleForAddressRange", ctypes.byref(fd), p, n, 1, flags)
    if rc == 0:
        what = os.readlink("/proc/self/fd/%d" % fd.value).split(" ")[0], os.fstat(fd.value).st_size
        os.close(fd.value)
        return what
    return rc
v = ctypes.c_int()
cu.check("cuDeviceGetAttribute", ctypes.byref(v), cu.CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 0)
a = cu.alloc(8 << 20)
s = cu.alloc(5000)
print([v.value,
       exp(a, 8 << 20), exp(a + 65536, 1 << 20), exp(a + 65536, 1 << 20, 1),
       exp(a + 100, 1 << 20), exp(a, 5000), exp(a, (8 << 20) + PG), exp(a, 1 << 20, 2),
       exp(s, 5000), exp(s, 2 * PG), exp(s, 3 * PG)])
"""
        r = child(code, env={"FAKE_CUDA_DMA_BUF": "1"})
        out = eval(self.assertChildOk(r))
        pg = os.sysconf("SC_PAGESIZE")
        dmabuf = "/memfd:sc-fakecuda-dmabuf-dev0"
        self.assertEqual(out, [1, (dmabuf, 8 << 20), (dmabuf, 1 << 20), (dmabuf, 1 << 20),
                               1, 1, 1, 1,
                               1, (dmabuf, 2 * pg), 1])
        # An IPC-imported mapping is not in the list of what the driver exports: refused.
        a = cu.alloc(2 << 20)
        code = r"""
cu.init(0)
p = cu.ipc_open(sys.stdin.buffer.read(64))
fd = ctypes.c_int(-1)
print(cu.raw("cuMemGetHandleForAddressRange", ctypes.byref(fd), p, 2 << 20, 1, 0))
cu.ipc_close(p)
"""
        r = child(code, env={"FAKE_CUDA_DMA_BUF": "1"}, stdin=cu.ipc_handle(a))
        self.assertEqual(self.assertChildOk(r).strip(), str(cu.CUDA_ERROR_INVALID_VALUE))
        cu.free(a)

    def test_gpu_direct_rdma_capable(self):
        # FAKE_CUDA_GDR=1: GPU_DIRECT_RDMA_SUPPORTED and ..._WITH_CUDA_VMM_SUPPORTED are 1;
        # IS_GPU_DIRECT_RDMA_CAPABLE is 1 for cuMemAlloc memory and for cuMemCreate memory only
        # when allocated with allocFlags.gpuDirectRDMACapable, in the allocating process only: an
        # importer reads 0 whatever the exporter set, as on a real H200 (driver 13.0).
        code = r"""
cu.init(0)
def attr(a):
    v = ctypes.c_int(-1)
    cu.check("cuDeviceGetAttribute", ctypes.byref(v), a, 0)
    return v.value
def cap(p):
    v = ctypes.c_int(-1)
    rc = cu.raw("cuPointerGetAttribute", ctypes.byref(v), cu.CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, p)
    return v.value if rc == 0 else -rc
out = [attr(cu.CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED), attr(cu.CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED)]
a = cu.alloc(4096)
out.append(cap(a))
for gdr in (False, True):
    try:
        p, fd, n = cu.vmm_alloc(2 << 20, gdr=gdr)
    except cu.CudaError as e:
        out.append(e.name)
        continue
    q = cu.vmm_import(fd, n)
    out += [cap(p), cap(q)]
    cu.vmm_free(q)
    cu.vmm_free(p, fd)
p, fd, n = cu.vmm_alloc(2 << 20)  # gdr=None: set where the device supports it
out.append(cap(p))
cu.vmm_free(p, fd)
print(out)
"""
        r = child(code, env={"FAKE_CUDA_GDR": "1"})
        self.assertEqual(eval(self.assertChildOk(r)), [1, 1, 1, 0, 0, 1, 0, 1])
        r = child(code)
        self.assertEqual(eval(self.assertChildOk(r)), [0, 0, 0, 0, 0, "CUDA_ERROR_INVALID_VALUE", 0])

    def test_device_pointer_is_not_host_memory(self):
        code = "cu.init(0)\np = cu.alloc(4096)\ncu.htod(p, b'x' * 4096)\nprint('read', ctypes.string_at(p, 16))\n"
        crash_dir = tempfile.mkdtemp(prefix="sc-fakecuda-crash-", dir=os.path.dirname(SHM))
        try:  # the crashed child cannot unlink its backing file: give it a directory of its own
            r = child(code, env={"FAKE_CUDA_SHM_DIR": crash_dir})
        finally:
            shutil.rmtree(crash_dir, ignore_errors=True)
        self.assertEqual(r.returncode, -signal.SIGSEGV,
                         "reading a device pointer from host code must crash:\n%s\n%s" % (r.stdout, r.stderr))
        self.assertNotIn(b"read", r.stdout)
        ok = child("cu.init(0)\np = ctypes.c_void_p()\ncu.check('cuMemHostAlloc', ctypes.byref(p), 4096, 0)\n"
                   "ctypes.memset(p, 120, 16)\nprint(ctypes.string_at(p, 4))\n")
        self.assertEqual(self.assertChildOk(ok).strip(), "b'xxxx'")  # pinned host memory is host memory

    # ---- streams and events ----------------------------------------------------------------------

    def test_async_copy_is_asynchronous(self):
        code = r"""
cu.init(0)
n = 1 << 20
data = os.urandom(n)
d = cu.alloc(n)
cu.htod(d, data)
h = ctypes.c_void_p()
cu.check("cuMemHostAlloc", ctypes.byref(h), n, 0)
ctypes.memset(h, 0, n)
s, e = ctypes.c_void_p(), ctypes.c_void_p()
cu.check("cuStreamCreate", ctypes.byref(s), 1)
cu.check("cuEventCreate", ctypes.byref(e), 2)
cu.check("cuMemcpyDtoHAsync", h, d, n, s)
cu.check("cuEventRecord", e, s)
q_ev, q_st = cu.raw("cuEventQuery", e), cu.raw("cuStreamQuery", s)
stale = ctypes.string_at(h, n) == bytes(n)
cu.check("cuEventSynchronize", e)
done = cu.raw("cuEventQuery", e)
got = ctypes.string_at(h, n) == data
pg = ctypes.create_string_buffer(n)  # pageable memory: the call returns when the copy is done
cu.check("cuMemcpyDtoHAsync", pg, d, n, s)
pageable = pg.raw == data
# Ordering across streams: s2 waits for an event recorded on s after a slow copy.
s2 = ctypes.c_void_p()
cu.check("cuStreamCreate", ctypes.byref(s2), 1)
d2 = cu.alloc(n)
cu.check("cuMemsetD8Async", d, 7, n, s)
cu.check("cuEventRecord", e, s)
cu.check("cuStreamWaitEvent", s2, e, 0)
cu.check("cuMemcpyDtoDAsync", d2, d, n, s2)
cu.check("cuStreamSynchronize", s2)
ordered = cu.dtoh(d2, n) == b"\x07" * n
cu.check("cuEventDestroy", e)
cu.check("cuStreamDestroy", s)
cu.check("cuStreamDestroy", s2)
cu.check("cuMemFreeHost", h)
cu.free(d)
cu.free(d2)
print(q_ev, q_st, stale, done, got, pageable, ordered)
"""
        r = child(code, env={"FAKE_CUDA_COPY_DELAY_US": "300000"})
        self.assertEqual(self.assertChildOk(r).split(),
                         [str(cu.CUDA_ERROR_NOT_READY), str(cu.CUDA_ERROR_NOT_READY), "True", "0", "True", "True", "True"])

    def test_invalid_stream_and_event_handles(self):
        s = ctypes.c_void_p()
        cu.check("cuStreamCreate", ctypes.byref(s), 0)
        cu.check("cuStreamDestroy", s)
        a = cu.alloc(4096)
        buf = ctypes.create_string_buffer(16)
        self.assertCuda(cu.CUDA_ERROR_INVALID_HANDLE, "cuMemcpyDtoHAsync", buf, a, 16, s)
        self.assertCuda(cu.CUDA_ERROR_INVALID_HANDLE, "cuStreamSynchronize", s)
        cu.check("cuMemcpyDtoHAsync", buf, a, 16, None)  # stream 0: synchronous
        cu.free(a)

    # ---- fault injection -------------------------------------------------------------------------

    def test_fail_copy_sync(self):
        code = r"""
cu.init(0)
d = cu.alloc(4096)
buf = ctypes.create_string_buffer(b"\x55" * 64, 64)
res = []
for i in range(4):
    res.append(cu.raw("cuMemcpyDtoH", buf, d, 64))
try:
    cu.check("cuMemcpyDtoH", buf, d, 64)
    cu.check("cuMemcpyDtoH", buf, d, 64)
except cu.CudaError as e:
    print("raised", e.name, e.text)
print(res, buf.raw[:4])
cu.free(d)
"""
        r = child(code, env={"FAKE_CUDA_FAIL_COPY_AT": "3", "FAKE_CUDA_STICKY": "0"})
        out = self.assertChildOk(r)
        self.assertIn("[0, 0, 700, 0]", out)
        self.assertNotIn("raised", out)
        r = child(code, env={"FAKE_CUDA_FAIL_COPY_AT": "5", "FAKE_CUDA_STICKY": "0"})
        out = self.assertChildOk(r)
        self.assertIn("raised CUDA_ERROR_ILLEGAL_ADDRESS an illegal memory access was encountered", out)

    def test_fail_copy_async_by_direction(self):
        code = r"""
cu.init(0)
n = 4096
d = cu.alloc(n)
cu.htod(d, b"\x11" * n)              # HtoD: not counted with FAKE_CUDA_FAIL_COPY_DIR=DtoH
s, e = ctypes.c_void_p(), ctypes.c_void_p()
cu.check("cuStreamCreate", ctypes.byref(s), 1)
cu.check("cuEventCreate", ctypes.byref(e), 0)
h = ctypes.create_string_buffer(b"\x99" * n, n)
cu.check("cuMemcpyDtoHAsync", h, d, n, s)         # DtoH 1: fine
cu.check("cuStreamSynchronize", s)
ctypes.memset(h, 0x99, n)
cu.check("cuMemcpyDtoHAsync", h, d, n, s)         # DtoH 2: fails on the stream, enqueued fine
first = cu.raw("cuStreamSynchronize", s)
second = cu.raw("cuStreamSynchronize", s)
untouched = h.raw == b"\x99" * n
cu.check("cuMemcpyDtoHAsync", h, d, n, s)         # DtoH 3: fine
cu.check("cuEventRecord", e, s)
third = cu.raw("cuEventSynchronize", e)
copied = h.raw == b"\x11" * n
cu.check("cuEventDestroy", e)
cu.check("cuStreamDestroy", s)
cu.free(d)
print(first, second, untouched, third, copied)
"""
        r = child(code, env={"FAKE_CUDA_FAIL_COPY_AT": "2", "FAKE_CUDA_FAIL_COPY_DIR": "DtoH",
                                 "FAKE_CUDA_STICKY": "0"})
        self.assertEqual(self.assertChildOk(r).split(), ["700", "0", "True", "0", "True"])

    def test_fail_copy_reported_by_event(self):
        code = r"""
cu.init(0)
d = cu.alloc(4096)
s, e = ctypes.c_void_p(), ctypes.c_void_p()
cu.check("cuStreamCreate", ctypes.byref(s), 1)
cu.check("cuEventCreate", ctypes.byref(e), 0)
h = ctypes.create_string_buffer(4096)
cu.check("cuMemcpyHtoDAsync", d, h, 4096, s)
cu.check("cuEventRecord", e, s)
a = cu.raw("cuEventSynchronize", e)
b = cu.raw("cuStreamSynchronize", s)
cu.check("cuEventDestroy", e)
cu.check("cuStreamDestroy", s)
cu.free(d)
print(a, b)
"""
        r = child(code, env={"FAKE_CUDA_FAIL_COPY_AT": "1", "FAKE_CUDA_STICKY": "0"})
        self.assertEqual(self.assertChildOk(r).split(), ["700", "0"])  # reported once, then cleared

    def test_event_sync_spins_without_blocking_sync(self):
        # The driver's default scheduling: a thread in cuEventSynchronize spins (burns a core)
        # unless the event was created with CU_EVENT_BLOCKING_SYNC. Each wait here is 1 s (a
        # delayed copy). Judged by the stand-in's count of polls (fake_cuda_event_spins), not by
        # CPU time: a spinning thread on a machine busy with other work gets little CPU, yet polls.
        code = r"""
import time
cu.init(0)
a, b = cu.alloc(4096), cu.alloc(4096)
s = ctypes.c_void_p()
cu.check("cuStreamCreate", ctypes.byref(s), 1)
out = []
for flags in (0, 1):  # 1: CU_EVENT_BLOCKING_SYNC
    e = ctypes.c_void_p()
    cu.check("cuEventCreate", ctypes.byref(e), flags)
    cu.check("cuMemcpyDtoDAsync", b, a, 4096, s)
    cu.check("cuEventRecord", e, s)
    spins = ctypes.c_ulong.in_dll(cu._load(), "fake_cuda_event_spins")
    t0, n0 = time.monotonic(), spins.value
    cu.check("cuEventSynchronize", e)
    out.append((spins.value - n0, time.monotonic() - t0))
    cu.check("cuEventDestroy", e)
cu.check("cuStreamDestroy", s)
print(out)
"""
        r = child(code, env={"FAKE_CUDA_COPY_DELAY_US": "1000000"})
        (spin_polls, spin_wall), (sleep_polls, sleep_wall) = eval(self.assertChildOk(r))
        self.assertGreaterEqual(min(spin_wall, sleep_wall), 0.9)
        self.assertGreater(spin_polls, 10, "a default event's wait should spin")
        self.assertEqual(sleep_polls, 0, "a BLOCKING_SYNC event's wait should sleep")

    def test_pageable_htod_lands_late(self):
        # The driver's synchronous cuMemcpyHtoD from pageable memory returns once the bytes are
        # staged; the DMA may land later. Here it lands FAKE_CUDA_COPY_DELAY_US (1 s) later: another
        # process (the backing file) sees old bytes; this context's later work waits for it
        # (stream order); cuCtxSynchronize makes it visible to everyone.
        code = r"""
cu.init(0)
p = cu.alloc(4096)
name = [f for f in os.listdir(os.environ["FAKE_CUDA_SHM_DIR"]) if f.startswith("sc-fakecuda-%d-" % os.getpid())]
path = os.path.join(os.environ["FAKE_CUDA_SHM_DIR"], name[0])
def seen():
    with open(path, "rb") as f:
        return f.read(4096)
cu.htod(p, b"A" * 4096, sync=False)
other = seen()
mine = cu.dtoh(p, 4096)
cu.htod(p, b"B" * 4096, sync=False)
before = seen()
cu.check("cuCtxSynchronize")
after = seen()
cu.free(p)
print(other == bytes(4096), mine == b"A" * 4096, before == b"A" * 4096, after == b"B" * 4096)
"""
        r = child(code, env={"FAKE_CUDA_COPY_DELAY_US": "1000000"})
        self.assertEqual(self.assertChildOk(r).split(), ["True"] * 4)

    def test_sticky_error_poisons_the_device(self):
        # As the real driver: after an illegal address every call needing that device's context
        # fails with it until the process ends; another device's context and context-free calls
        # still answer. FAKE_CUDA_STICKY=0 turns this off (the fault-injection tests above).
        code = r"""
cu.init(0)
d = cu.alloc(4096)
buf = ctypes.create_string_buffer(64)
first = cu.raw("cuMemcpyDtoH", buf, d, 64)
p = cu.c_ptr()
after = [cu.raw("cuMemcpyDtoH", buf, d, 64), cu.raw("cuMemAlloc", ctypes.byref(p), 4096),
         cu.raw("cuCtxSynchronize"), cu.raw("cuMemFree", d)]
v = ctypes.c_int()
attr = cu.raw("cuDeviceGetAttribute", ctypes.byref(v), cu.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0)
cu.init(1)
e = cu.alloc(4096)
cu.htod(e, b"dev1 fine")
print(first, after, attr, cu.dtoh(e, 9))
cu.free(e)
"""
        r = child(code, env={"FAKE_CUDA_FAIL_COPY_AT": "1"})
        self.assertEqual(self.assertChildOk(r).strip(), "700 [700, 700, 700, 700] 0 b'dev1 fine'")
        # Another injected error (FAKE_CUDA_FAIL_COPY_ERROR) is not sticky; neither is 700 with
        # FAKE_CUDA_STICKY=0.
        r = child(code, env={"FAKE_CUDA_FAIL_COPY_AT": "1", "FAKE_CUDA_FAIL_COPY_ERROR": "999"})
        self.assertEqual(self.assertChildOk(r).strip(), "999 [0, 0, 0, 0] 0 b'dev1 fine'")
        r = child(code, env={"FAKE_CUDA_FAIL_COPY_AT": "1", "FAKE_CUDA_STICKY": "0"})
        self.assertEqual(self.assertChildOk(r).strip(), "700 [0, 0, 0, 0] 0 b'dev1 fine'")

    def test_ipc_driver_rules(self):
        n = 3 << 20
        a = cu.alloc(n)
        data = os.urandom(n)
        cu.htod(a, data)
        handle = cu.ipc_handle(a)
        # The exporting process cannot open its own handle ("exported from another process").
        p = cu.c_ptr()
        self.assertCuda(cu.CUDA_ERROR_INVALID_CONTEXT, "cuIpcOpenMemHandle", ctypes.byref(p),
                        cu.IpcHandle.from_buffer_copy(handle), 1)
        # A second open in the same context: the same pointer, reference counted.
        code = r"""
cu.init(0)
h = sys.stdin.buffer.read(64)
p1 = cu.ipc_open(h)
p2 = cu.ipc_open(h)
cu.ipc_close(p1)
still = cu.dtoh(p2 + 5, 10)
cu.ipc_close(p2)
again = cu.raw("cuIpcCloseMemHandle", p2)
# Device 1's context opens device 0's handle through peer access: the pointer's device is 0.
cu.init(1)
q = cu.ipc_open(h)
v = ctypes.c_int(-1)
cu.check("cuPointerGetAttribute", ctypes.byref(v), cu.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, q)
peer = cu.dtoh(q + 7, 10)
cu.ipc_close(q)
print(p1 == p2, still.hex(), again, v.value, peer.hex())
"""
        r = child(code, stdin=handle)
        self.assertEqual(self.assertChildOk(r).split(),
                         ["True", data[5:15].hex(), str(cu.CUDA_ERROR_INVALID_VALUE), "0", data[7:17].hex()])
        cu.free(a)

    # ---- IPC between processes -------------------------------------------------------------------

    def test_ipc_handle_in_child_process(self):
        n = (2 << 20) + 333
        a = cu.alloc(n)
        data = os.urandom(n)
        cu.htod(a, data)
        handle = cu.ipc_handle(a)
        code = r"""
cu.init(0)
h = sys.stdin.buffer.read(64)
n = int(sys.argv[1]) if len(sys.argv) > 1 else %d
p = cu.ipc_open(h)
data = cu.dtoh(p, n)
print(__import__("hashlib").sha256(data).hexdigest())
cu.htod(p + 100, b"written by the child")
bad = cu.raw("cuMemcpyDtoH", ctypes.create_string_buffer(2), p + n - 1, 2)
cu.ipc_close(p)
print(bad)
""" % n
        r = child(code, stdin=handle)
        import hashlib
        out = self.assertChildOk(r).split()
        self.assertEqual(out, [hashlib.sha256(data).hexdigest(), str(cu.CUDA_ERROR_INVALID_VALUE)])
        want = bytearray(data)
        want[100:120] = b"written by the child"
        self.assertEqual(cu.dtoh(a, n), bytes(want))
        # Garbage handle; a device-0 handle opened with device 1 current.
        opener = "cu.init(int(os.environ['DEV']))\nprint(cu.raw('cuIpcOpenMemHandle', ctypes.byref(cu.c_ptr()), " \
                 "cu.IpcHandle.from_buffer_copy(sys.stdin.buffer.read(64)), 1))\n"
        bad = bytearray(handle)
        bad[30] ^= 1
        r = child(opener, env={"DEV": "0"}, stdin=bytes(bad))
        self.assertEqual(self.assertChildOk(r).strip(), str(cu.CUDA_ERROR_INVALID_VALUE))
        r = child(opener, env={"DEV": "0"}, stdin=os.urandom(64))
        self.assertEqual(self.assertChildOk(r).strip(), str(cu.CUDA_ERROR_INVALID_VALUE))
        # Another device's handle: refused without CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, mapped through
        # peer access with it (the opener must check the device itself: see test_ipc_driver_rules).
        r = child(opener.replace("), 1))", "), 0))"), env={"DEV": "1"}, stdin=handle)
        self.assertEqual(self.assertChildOk(r).strip(), str(cu.CUDA_ERROR_INVALID_DEVICE))
        r = child(opener, env={"DEV": "1"}, stdin=handle)
        self.assertEqual(self.assertChildOk(r).strip(), "0")
        cu.free(a)
        r = child(opener, env={"DEV": "0"}, stdin=handle)  # freed by its owner
        self.assertEqual(self.assertChildOk(r).strip(), str(cu.CUDA_ERROR_INVALID_VALUE))

    # ---- virtual memory API, fd taken with pidfd_getfd -------------------------------------------

    def test_vmm_fd_taken_with_pidfd_getfd(self):
        if not hasattr(os, "pidfd_open"):
            self.skipTest("os.pidfd_open needs Python 3.9+ and Linux 5.3+")
        n = 3 << 20
        data = os.urandom(n)
        code = r"""
cu.init(0)
data = sys.stdin.buffer.read(%d)
p, fd, size = cu.vmm_alloc(len(data))
cu.htod(p, data)
print(os.getpid(), fd, size, flush=True)
sys.stdin.buffer.readline()          # the parent took the fd and wrote
sys.stdout.write(cu.dtoh(p + 10, 30).hex() + "\n")
sys.stdout.flush()
cu.vmm_free(p, fd)
""" % n
        e = dict(os.environ)
        proc = subprocess.Popen([sys.executable, "-c", PRELUDE + code], env=e, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = threading.Timer(TIMEOUT, proc.kill)  # every blocking read below ends by then
        deadline.start()
        try:
            proc.stdin.write(data)
            proc.stdin.flush()
            line = proc.stdout.readline().split()
            if len(line) != 3:
                proc.kill()
                self.fail("child said %r; stderr %r" % (line, proc.communicate()[1]))
            pid, fd, size = (int(x) for x in line)
            self.assertEqual(size, 4 << 20)  # rounded up to the 2 MiB granularity
            pidfd = os.pidfd_open(pid)
            try:
                mine = pidfd_getfd(pidfd, fd)
            finally:
                os.close(pidfd)
            p = cu.vmm_import(mine, size)
            self.assertEqual(cu.dtoh(p, n), data)
            cu.htod(p + 10, b"written by the parent ")
            cu.vmm_free(p, mine)
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            got = bytes.fromhex(proc.stdout.readline().decode().strip())
            self.assertEqual(got, b"written by the parent " + data[32:40])
            self.assertEqual(proc.wait(TIMEOUT), 0, proc.stderr.read())
        finally:
            deadline.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for f in (proc.stdin, proc.stdout, proc.stderr):
                f.close()
        # An fd that is not a stand-in allocation is refused.
        with open("/dev/null") as f:
            h = ctypes.c_ulonglong()
            self.assertCuda(cu.CUDA_ERROR_INVALID_VALUE, "cuMemImportFromShareableHandle", ctypes.byref(h),
                            ctypes.c_void_p(f.fileno()), cu.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)


def tearDownModule():
    leftover = os.listdir(SHM)
    shutil.rmtree(SHM, ignore_errors=True)
    if leftover:
        raise AssertionError("stand-in backing files left in %s: %s" % (SHM, leftover))


if __name__ == "__main__":
    unittest.main(verbosity=2)
