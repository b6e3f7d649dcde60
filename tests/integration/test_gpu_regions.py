# SPDX-License-Identifier: Apache-2.0
"""GPU regions end to end, on the STAND-IN CUDA driver (tests/fake_cuda, no GPU needed).

The sidecars load libsc_fake_cuda.so (SC_TEST_CUDA_DRIVER) instead of libcuda.so.1, and this test
process, acting as the GPU worker, uses the same library through cudadrv.py. The stand-in keeps
"device memory" in shared files behind addresses that host code cannot dereference (a sidecar bug
that memcpy's a device address crashes it), runs async copies on real stream threads, and can
inject copy failures. It proves the sidecar's control logic: registration (IPC handles, cuMemCreate
fds through pidfd_getfd), the staging pipeline over TCP, LOCAL device copies, mixed descriptor
lists, errors and clean-up. It cannot prove real DMA, PCIe, GPUDirect RDMA or timing: that is what
tests/gpu/ does on a real GPU.

Every transfer compares random bytes at odd sizes and offsets, inside and outside the targets.
"""
import atexit
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

# tests/gpu/test_gpu_real.py runs these same tests on the real driver (SC_GPU_REAL=1).
REAL = os.environ.get("SC_GPU_REAL") == "1"
FAKE = os.environ.get("SC_FAKE_CUDA", "")
if REAL:
    os.environ.pop("SC_TEST_CUDA_DRIVER", None)
elif not FAKE or not os.path.exists(FAKE):
    print("SKIP: the stand-in CUDA driver was not built (no cuda.h at build time)")
    sys.exit(77)
else:
    os.environ["SC_TEST_CUDA_DRIVER"] = FAKE
    # The stand-in's "device memory" files: one directory for this run (worker and sidecars
    # alike, as IPC needs), removed at exit, so crashed processes leave nothing in /dev/shm.
    FAKE_SHM = tempfile.mkdtemp(prefix="sc-gpu-test-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.environ["FAKE_CUDA_SHM_DIR"] = FAKE_SHM
    # A GPU that supports GPUDirect RDMA, for cuMemCreate memory too (as an H100 does): the
    # stand-in then answers IS_GPU_DIRECT_RDMA_CAPABLE by how the memory was allocated.
    os.environ["FAKE_CUDA_GDR"] = "1"
    atexit.register(shutil.rmtree, FAKE_SHM, True)

import grpc  # noqa: E402
from harness import SLOW, SidecarTest, desc, free_port, health_pb2, main, pb, wait_until  # noqa: E402 (also puts examples/ on the path)
import cudadrv as cu  # noqa: E402

try:
    cu.init(0)
    NDEV = cu.device_count()
except Exception as e:  # noqa: BLE001
    print("SKIP: cuInit found no usable GPU: %s" % e)
    sys.exit(77)
DEV1 = 1 if NDEV > 1 else 0  # a second GPU where there is one
MiB = 1 << 20
ENV = {} if REAL else {"SC_TEST_CUDA_DRIVER": FAKE, "FAKE_CUDA_SHM_DIR": os.environ["FAKE_CUDA_SHM_DIR"],
                       "FAKE_CUDA_GDR": "1"}
stand_in_only = unittest.skipIf(REAL, "needs the stand-in driver (fault injection, delays)")


class GpuMem:
    """Worker-owned GPU memory (cuMemAlloc in this process) registered with a sidecar by IPC."""

    def __init__(self, sidecar, size, device=0, offset=0, block=None):
        cu.init(device)
        self.device = device
        self.block = block or (offset + size + (2 * MiB - 1)) // (2 * MiB) * (2 * MiB)
        self.base = cu.alloc(self.block)
        self.offset = offset
        self.size = size
        self.region = sidecar.stub.RegisterRegion(pb.RegisterRegionRequest(
            cuda_ipc=pb.CudaIpcSource(device_index=device, handle=cu.ipc_handle(self.base),
                                      offset=offset, size=size), name="worker-gpu"), timeout=30)

    def write(self, off, data):
        cu.set_current(self.device)
        cu.htod(self.base + self.offset + off, data)

    def read(self, off, n):
        cu.set_current(self.device)
        return cu.dtoh(self.base + self.offset + off, n)


class HostMem:
    def __init__(self, sidecar, size):
        self.sc = sidecar
        self.size = size
        self.region = sidecar.create_region(size)

    def write(self, off, data):
        self.sc.fill(self.region, off, data)

    def read(self, off, n):
        return self.sc.peek(self.region, off, n)


class GpuRegionTest(SidecarTest):
    def setUp(self):
        super().setUp()
        self.rnd = random.Random(int.from_bytes(os.urandom(8), "little"))

    def gpu_sidecar(self, name, keys=None, extra=(), env=None):
        return self.sidecar(name, key_file=keys, extra=list(extra), env=dict(ENV, **(env or {})))

    def pair(self, extra=(), env_b=None, suffix=""):
        keys = self.key_file("keys" + suffix)
        return (self.gpu_sidecar("a" + suffix, keys, extra), self.gpu_sidecar("b" + suffix, keys, extra, env_b))

    def transfer(self, src_sc, src_mems, dst_sc, dst_mems, lengths, direction, expect=pb.OPERATION_STATUS_COMPLETE):
        """src_sc holds the passive op; each mem gets one descriptor at a random odd offset.
        Fills noise everywhere, the payload in the holder, moves it, and checks every byte."""
        plan = []
        for mems in (src_mems, dst_mems):
            descs = []
            for m, ln in zip(mems, lengths):
                off = self.rnd.randrange(1, m.size - ln + 1) if m.size > ln else 0
                descs.append((m, off, ln))
            plan.append(descs)
        noise = {}
        for mems in (src_mems, dst_mems):
            for m in mems:
                if id(m) not in noise:
                    noise[id(m)] = bytearray(os.urandom(m.size))
                    m.write(0, bytes(noise[id(m)]))
        payload = [os.urandom(ln) for ln in lengths]
        holder = plan[0] if direction == "read" else plan[1]
        for (m, off, ln), data in zip(holder, payload):
            m.write(off, data)
            noise[id(m)][off:off + ln] = data
        passive = (src_sc.stub.CreateReadable if direction == "read" else src_sc.stub.CreateWritable)(
            pb.CreatePassiveRequest(descriptors=[desc(m.region, o, ln) for m, o, ln in plan[0]],
                                    timeout_ms=60000), timeout=30)
        begin = dst_sc.stub.BeginRead if direction == "read" else dst_sc.stub.BeginWrite
        op = begin(pb.BeginTransferRequest(metadata=passive.metadata,
                                           descriptors=[desc(m.region, o, ln) for m, o, ln in plan[1]],
                                           timeout_ms=60000), timeout=30)
        done = dst_sc.wait(op.operation_id, 60000)
        self.assertEqual(done.status, expect, done.error.message)
        pdone = src_sc.wait(passive.operation_id, 10000)
        self.assertEqual(pdone.status, expect, pdone.error.message)
        if expect != pb.OPERATION_STATUS_COMPLETE:
            return done, pdone
        receiver = plan[1] if direction == "read" else plan[0]
        for (m, off, ln), data in zip(receiver, payload):
            noise[id(m)][off:off + ln] = data
        for mems in (src_mems, dst_mems):
            for m in mems:
                got = m.read(0, m.size)
                if got != bytes(noise[id(m)]):
                    first = next(i for i in range(m.size) if got[i] != noise[id(m)][i])
                    self.fail("%s: first wrong byte at %d of %d" % (m.region.region_id, first, m.size))
        return done, pdone

    # ---- info and regions ----

    def test_info_lists_gpus_and_paths(self):
        a = self.gpu_sidecar("a")
        info = a.info()
        self.assertTrue(info.cuda_available, info.cuda_detail)
        self.assertEqual("STAND-IN" in info.cuda_detail, not REAL)
        self.assertEqual(len(info.gpus), NDEV)
        for i, g in enumerate(info.gpus):
            print("GPU %d: %s" % (i, g))
            self.assertEqual(g.index, i)
            self.assertTrue(g.pci_bus_id)
            self.assertGreater(g.total_memory, 0)
            self.assertRegex(g.compute_capability, r"^\d+\.\d+$")
            self.assertTrue(g.rdma_path)
            self.assertRegex(g.uuid, r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
            self.assertTrue(g.nearest_rdma_detail)
            if not REAL:
                self.assertIn("Stand-in GPU", g.name)
                self.assertEqual(g.compute_capability, "9.0")
                self.assertFalse(g.dma_buf_supported)
                self.assertIn("staged through pinned host memory", g.rdma_path)
        self.assertEqual(len({g.uuid for g in info.gpus}), len(info.gpus))

    @stand_in_only
    def test_no_driver_says_why(self):
        a = self.sidecar("a", env={"SC_TEST_CUDA_DRIVER": "/nonexistent/libcuda-standin.so"})
        info = a.info()
        self.assertFalse(info.cuda_available)
        self.assertIn("CUDA driver not found", info.cuda_detail)
        self.assertEqual(len(info.gpus), 0)
        self.assertEqual(a.health.Check(health_pb2.HealthCheckRequest(service="rdma_sidecar.v1.Sidecar/gpu"),
                                        timeout=10).status, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.assertRpcError(grpc.StatusCode.FAILED_PRECONDITION, a.stub.CreateRegion,
                            pb.CreateRegionRequest(size=MiB, device_kind=pb.DEVICE_KIND_CUDA),
                            contains="no usable CUDA driver", timeout=10)

    @stand_in_only
    def test_driver_without_get_proc_address_v2_is_refused(self):
        # Before CUDA 12.0 dlsym gives the legacy entry points: GPU support stays off, saying why.
        legacy = os.environ.get("SC_FAKE_CUDA_LEGACY", "")
        if not legacy or not os.path.exists(legacy):
            self.skipTest("SC_FAKE_CUDA_LEGACY (the stand-in built as a pre-12.0 driver) is not set")
        a = self.sidecar("a", env={"SC_TEST_CUDA_DRIVER": legacy})
        info = a.info()
        self.assertFalse(info.cuda_available)
        self.assertIn("no cuGetProcAddress_v2", info.cuda_detail)
        self.assertEqual(len(info.gpus), 0)

    def test_create_region_ipc_handle_and_region_io(self):
        a = self.gpu_sidecar("a")
        r = a.stub.CreateRegion(pb.CreateRegionRequest(size=3 * MiB + 5, device_kind=pb.DEVICE_KIND_CUDA,
                                                       device_index=DEV1, name="kv"), timeout=30)
        self.assertEqual(r.device_kind, pb.DEVICE_KIND_CUDA)
        self.assertEqual(r.device_index, DEV1)
        self.assertEqual(len(r.cuda_ipc_handle), 64)
        # The worker opens the sidecar's memory and writes it; ReadRegion sees those bytes.
        cu.init(DEV1)
        p = cu.ipc_open(r.cuda_ipc_handle)
        data = os.urandom(r.size)
        cu.htod(p, data)
        got = b"".join(m.data for m in a.stub.ReadRegion(
            pb.ReadRegionRequest(region_id=r.region_id, offset=0, length=r.size), timeout=30))
        self.assertEqual(got, data)
        # WriteRegion (through pinned staging) lands in GPU memory at an odd offset.
        more = os.urandom(MiB + 3)
        resp = a.stub.WriteRegion(iter([pb.WriteRegionRequest(region_id=r.region_id, offset=77,
                                                              data=more)]), timeout=30)
        self.assertEqual(resp.bytes_written, len(more))
        self.assertEqual(cu.dtoh(p + 77, len(more)), more)
        cu.ipc_close(p)
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, lambda: list(a.stub.ReadRegion(
            pb.ReadRegionRequest(region_id=r.region_id, offset=r.size - 1, length=2), timeout=10)),
            contains="outside")
        a.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=r.region_id), timeout=10)

    def test_register_ipc_exposes_only_the_range(self):
        a = self.gpu_sidecar("a")
        m = GpuMem(a, MiB + 7, device=0, offset=12345, block=4 * MiB)
        secret = os.urandom(4 * MiB)
        cu.htod(m.base, secret)
        self.assertEqual(m.region.size, MiB + 7)
        got = b"".join(x.data for x in a.stub.ReadRegion(
            pb.ReadRegionRequest(region_id=m.region.region_id, offset=0, length=m.size), timeout=30))
        self.assertEqual(got, secret[12345:12345 + MiB + 7])
        # Nothing before or after the registered range is reachable.
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, a.stub.CreateReadable,
                            pb.CreatePassiveRequest(descriptors=[desc(m.region, 0, m.size + 1)]),
                            contains="outside", timeout=10)

    def test_register_errors(self):
        a = self.gpu_sidecar("a")
        cu.init(0)
        base = cu.alloc(2 * MiB)
        h = cu.ipc_handle(base)

        def reg(**kw):
            return a.stub.RegisterRegion(pb.RegisterRegionRequest(cuda_ipc=pb.CudaIpcSource(**kw)), timeout=10)
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, reg, device_index=0, handle=h[:10], size=10,
                            contains="64 bytes")
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, reg, device_index=7, handle=h, size=10,
                            contains="sees %d GPU" % NDEV)
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, reg, device_index=0, handle=os.urandom(64),
                            size=10, contains="cuIpcOpenMemHandle")
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, reg, device_index=0, handle=h,
                            offset=2 * MiB - 5, size=10, contains="outside the allocation")
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, reg, device_index=0, handle=h, size=0,
                            contains="size must be > 0")
        if NDEV > 1:
            # The driver opens another GPU's handle through peer access (so does the stand-in):
            # the sidecar's own check of the pointer's device refuses it.
            self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, reg, device_index=1, handle=h, size=10,
                                contains="is memory of GPU 0")
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, reg, device_index=0, handle=h, size=10,
                            device_uuid="GPU-00000000-1111-2222-3333-444444444444", contains="no GPU with uuid")
        self.assertEqual(len(a.stub.ListRegions(pb.ListRegionsRequest(), timeout=10).regions), 0)
        cu.free(base)

    def test_gpudirect_capability_reported(self):
        # Item: cuMemCreate memory takes GPUDirect RDMA only when allocated with
        # allocFlags.gpuDirectRDMACapable; the region says what path its memory gets.
        a = self.gpu_sidecar("a")
        info = a.info()
        for g in info.gpus:
            self.assertEqual(g.vmm_gpudirect_rdma_supported, g.gpudirect_rdma_supported)
        cu.init(0)
        regions = []
        # The driver tells the importing sidecar neither the flag nor the pointer attribute (both
        # read 0 there on a real H200): the worker declares it, else the memory is staged.
        for gdr, declared in ((False, False), (True, False), (True, True)):
            dptr, fd, asize = cu.vmm_alloc(2 * MiB, gdr=gdr)
            r = a.stub.RegisterRegion(pb.RegisterRegionRequest(cuda_fd=pb.CudaFdSource(
                device_index=0, pid=os.getpid(), fd=fd, size=MiB, gpudirect_rdma_capable=declared)),
                timeout=30)
            regions.append((r, dptr, fd))
            print("cuMemCreate gdr=%s declared=%s: %s / %s" % (gdr, declared, r.gpudirect_rdma_capable,
                                                               r.gpu_path))
            if REAL and not (info.gpus[0].gpudirect_rdma_supported and info.gpus[0].vmm_gpudirect_rdma_supported):
                continue
            self.assertEqual(r.gpudirect_rdma_capable, declared)
            if declared:
                self.assertNotIn("allocFlags", r.gpu_path)
            else:
                self.assertIn("staged through pinned host memory", r.gpu_path)
                self.assertIn("allocFlags.gpuDirectRDMACapable = 1", r.gpu_path)
                self.assertIn("cuda_fd.gpudirect_rdma_capable", r.gpu_path)
        m = GpuMem(a, 4096)
        listed = {x.region_id: x for x in a.stub.ListRegions(pb.ListRegionsRequest(), timeout=10).regions}
        self.assertEqual(listed[m.region.region_id].gpudirect_rdma_capable, m.region.gpudirect_rdma_capable)
        self.assertEqual(listed[regions[0][0].region_id].gpu_path, regions[0][0].gpu_path)
        if not REAL or info.gpus[0].gpudirect_rdma_supported:
            # Memory opened from an IPC handle: not capable in the importer (a real H200 said 0
            # and exported no dma-buf for it).
            self.assertFalse(m.region.gpudirect_rdma_capable, m.region.gpu_path)
            self.assertIn("memory opened from a CUDA IPC handle", m.region.gpu_path)
        if not REAL:
            # A GPU without GPUDirect RDMA: nothing is capable, and the region says why.
            b = self.gpu_sidecar("b", env={"FAKE_CUDA_GDR": "0"})
            mb = GpuMem(b, 4096)
            self.assertFalse(mb.region.gpudirect_rdma_capable)
            self.assertIn("the GPU does not support GPUDirect RDMA", mb.region.gpu_path)
            self.assertFalse(b.info().gpus[0].vmm_gpudirect_rdma_supported)
        for r, dptr, fd in regions:
            a.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=r.region_id), timeout=10)
            cu.vmm_free(dptr, fd)

    def test_register_by_device_uuid(self):
        # The worker names the GPU by UUID; the index it sends is ignored (a worker that sees only
        # the sidecar's GPU 1 calls it 0, as CUDA_VISIBLE_DEVICES does).
        a = self.gpu_sidecar("a")
        uuids = [g.uuid for g in a.info().gpus]
        cu.init(DEV1)
        base = cu.alloc(2 * MiB)
        data = os.urandom(2 * MiB)
        cu.htod(base, data)
        r = a.stub.RegisterRegion(pb.RegisterRegionRequest(cuda_ipc=pb.CudaIpcSource(
            device_index=0, device_uuid=uuids[DEV1].upper()[4:], handle=cu.ipc_handle(base), offset=5, size=MiB)),
            timeout=30)
        self.assertEqual(r.device_index, DEV1)
        got = b"".join(x.data for x in a.stub.ReadRegion(
            pb.ReadRegionRequest(region_id=r.region_id, offset=0, length=MiB), timeout=30))
        self.assertEqual(got, data[5:5 + MiB])
        a.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=r.region_id), timeout=10)
        cu.free(base)
        c = a.stub.CreateRegion(pb.CreateRegionRequest(size=MiB, device_kind=pb.DEVICE_KIND_CUDA, device_index=0,
                                                       device_uuid=uuids[DEV1]), timeout=30)
        self.assertEqual(c.device_index, DEV1)
        a.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=c.region_id), timeout=10)
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, a.stub.CreateRegion,
                            pb.CreateRegionRequest(size=MiB, device_kind=pb.DEVICE_KIND_CUDA, device_uuid="GPU-nope"),
                            contains="no GPU with uuid GPU-nope here (this sidecar sees 0=GPU-", timeout=10)

    def test_register_pytorch_shareable_handle(self):
        # PyTorch >= 2.5: untyped_storage()._share_cuda_()[1] is a version byte, a type byte 'c',
        # then the 64-byte cudaIpcMemHandle of the caching allocator's block.
        a = self.gpu_sidecar("a")
        cu.init(0)
        base = cu.alloc(4 * MiB)
        secret = os.urandom(4 * MiB)
        cu.htod(base, secret)
        h = cu.ipc_handle(base)
        for version, off, size in ((2, 777, MiB + 3), (1, 2 * MiB + 1, 5000)):
            r = a.stub.RegisterRegion(pb.RegisterRegionRequest(cuda_ipc=pb.CudaIpcSource(
                device_index=0, handle=bytes([version]) + b"c" + h, offset=off, size=size)), timeout=30)
            self.assertEqual(r.size, size)
            got = b"".join(x.data for x in a.stub.ReadRegion(
                pb.ReadRegionRequest(region_id=r.region_id, offset=0, length=size), timeout=30))
            self.assertEqual(got, secret[off:off + size])
            a.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=r.region_id), timeout=10)

        def reg(handle):
            return a.stub.RegisterRegion(pb.RegisterRegionRequest(cuda_ipc=pb.CudaIpcSource(
                device_index=0, handle=handle, size=10)), timeout=10)
        # An expandable segment's handle holds fds of cuMemCreate memory, not an IPC handle.
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, reg, b"\x02e" + os.urandom(40),
                            contains="expandable_segments:False")
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, reg, b"\x07c" + h, contains="unknown version 7")
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, reg, b"\x02x" + h, contains="66-byte")
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, reg, b"\x02c" + h + b"!", contains="got 67")
        self.assertEqual(len(a.stub.ListRegions(pb.ListRegionsRequest(), timeout=10).regions), 0)
        cu.free(base)

    def test_register_cuda_fd_through_pidfd(self):
        a, b = self.pair()
        cu.init(0)
        dptr, fd, asize = cu.vmm_alloc(3 * MiB)
        data = os.urandom(asize)
        cu.htod(dptr, data)
        r = a.stub.RegisterRegion(pb.RegisterRegionRequest(cuda_fd=pb.CudaFdSource(
            device_index=0, pid=os.getpid(), fd=fd, offset=4096, size=2 * MiB + 1)), timeout=30)
        got = b"".join(x.data for x in a.stub.ReadRegion(
            pb.ReadRegionRequest(region_id=r.region_id, offset=0, length=r.size), timeout=30))
        self.assertEqual(got, data[4096:4096 + 2 * MiB + 1])
        # Not an fd of that process: a clear error.
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, a.stub.RegisterRegion,
                            pb.RegisterRegionRequest(cuda_fd=pb.CudaFdSource(
                                device_index=0, pid=os.getpid(), fd=987654, size=10)),
                            contains="pidfd_getfd", timeout=10)
        a.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=r.region_id), timeout=10)
        cu.vmm_free(dptr, fd)

    # ---- transfers ----

    def test_tcp_gpu_to_gpu_read_and_write_staged(self):
        # Small TCP chunks on 3 streams: many pieces in flight, each staged through 4 MiB buffers.
        a, b = self.pair(extra=["--tcp-chunk-size", "1048576", "--tcp-streams", "3"])
        for direction in ("read", "write"):
            lengths = [9 * MiB + 4097, 1, 4095]
            src = [GpuMem(a, 10 * MiB), GpuMem(a, 5000, device=DEV1), GpuMem(a, 9000)]
            dst = [GpuMem(b, 9 * MiB + 9999, device=DEV1), GpuMem(b, 3), GpuMem(b, 4096)]
            done, pdone = self.transfer(a, src, b, dst, lengths, direction)
            self.assertEqual(done.backend, pb.BACKEND_TCP)
            self.assertIn("GPU memory staged through pinned host buffers on both sides", done.backend_reason)
            self.assertEqual(done.bytes_done, sum(lengths))

    def test_tcp_mixed_host_and_gpu(self):
        a, b = self.pair()
        lengths = [5 * MiB + 3, 77777, 123]
        # READ: GPU + host + GPU(dev 1) at the passive side into host + GPU + host.
        done, _ = self.transfer(a, [GpuMem(a, 6 * MiB), HostMem(a, 80000), GpuMem(a, 200, device=DEV1)],
                                b, [HostMem(b, 6 * MiB), GpuMem(b, 90000, device=DEV1), HostMem(b, 999)],
                                lengths, "read")
        self.assertIn("on both sides", done.backend_reason)
        # WRITE: host memory into a GPU writable only.
        done, pdone = self.transfer(a, [GpuMem(a, 6 * MiB), GpuMem(a, 80000), GpuMem(a, 200)],
                                    b, [HostMem(b, 6 * MiB), HostMem(b, 80000), HostMem(b, 999)],
                                    lengths, "write")
        self.assertIn("at the peer", done.backend_reason)
        self.assertIn("GPU memory", pdone.backend_reason)

    def kv_round(self, a, b, layers, per, blk, stride, host_side=False):
        """vLLM's layout over TCP: `layers` GPU layer tensors on a, the same `per` block ids (random
        order, odd block size) in each, against one strided run on b (GPU, or host memory with
        host_side); READ then WRITE, every byte of every region compared."""
        nblocks = per + 40
        ids = self.rnd.sample(range(nblocks), per)
        n = layers * per
        for direction in ("read", "write"):
            src = [GpuMem(a, nblocks * stride + 7) for _ in range(layers)]
            dst = HostMem(b, n * blk + 5) if host_side else GpuMem(b, n * blk + 5)
            noise = {}
            for m in src + [dst]:
                noise[id(m)] = bytearray(os.urandom(m.size))
                m.write(0, bytes(noise[id(m)]))
            payload = os.urandom(n * blk)
            src_ranges = [(m, 7 + i * stride) for m in src for i in ids]
            dst_ranges = [(dst, 5 + k * blk) for k in range(n)]
            holder = src_ranges if direction == "read" else dst_ranges
            for k, (m, off) in enumerate(holder):
                noise[id(m)][off:off + blk] = payload[k * blk:(k + 1) * blk]
            for m in set(m for m, _ in holder):
                m.write(0, bytes(noise[id(m)]))
            receiver = dst_ranges if direction == "read" else src_ranges
            for k, (m, off) in enumerate(receiver):
                noise[id(m)][off:off + blk] = payload[k * blk:(k + 1) * blk]
            bl = pb.BlockList(region_ids=[m.region.region_id for m in src], block_length=blk,
                              block_ids=ids, block_stride=stride, base_offset=7)
            passive = (a.stub.CreateReadable if direction == "read" else a.stub.CreateWritable)(
                pb.CreatePassiveRequest(descriptor_sets=[pb.DescriptorSet(block_list=bl)],
                                        timeout_ms=60000), timeout=30)
            self.assertEqual(passive.descriptor_count, n)
            run = pb.StridedRun(region_id=dst.region.region_id, offset=5, stride=blk, count=n,
                                length=blk)
            begin = b.stub.BeginRead if direction == "read" else b.stub.BeginWrite
            op = begin(pb.BeginTransferRequest(metadata=passive.metadata,
                                               descriptor_sets=[pb.DescriptorSet(strided_run=run)],
                                               timeout_ms=60000), timeout=30)
            done = b.wait(op.operation_id, 60000)
            self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
            self.assertEqual(done.backend, pb.BACKEND_TCP, done.backend_reason)
            self.assertEqual(a.wait(passive.operation_id, 10000).status, pb.OPERATION_STATUS_COMPLETE)
            for m in src + [dst]:
                got = m.read(0, m.size)
                if got != bytes(noise[id(m)]):
                    first = next(i for i in range(m.size) if got[i] != noise[id(m)][i])
                    self.fail("%s %s: first wrong byte at %d of %d"
                              % (direction, m.region.region_id, first, m.size))

    @stand_in_only
    def test_tcp_kv_blocks_packed_into_few_driver_calls(self):
        """8 GPU layer tensors x 128 shared block ids of 4,099 bytes (1,024 pieces) in one READ
        and one WRITE against one GPU strided run: the pieces travel many per request and many
        per pinned buffer, so both sidecars make a handful of cuMemcpyBatchAsync calls, not one
        copy call per piece. Then the same with a driver that has no batched copy (one async copy
        per piece, still one synchronisation per buffer) and with host memory on one side."""
        stats = {}
        for tag, env in (("batched", {}), ("unbatched", {"FAKE_CUDA_NO_BATCH": "1"})):
            sa, sb = (os.path.join(self.workdir, "%s-%s.stats" % (tag, side)) for side in "ab")
            keys = self.key_file("keys-" + tag)
            a = self.gpu_sidecar("a-" + tag, keys, env=dict(env, FAKE_CUDA_STATS=sa))
            b = self.gpu_sidecar("b-" + tag, keys, env=dict(env, FAKE_CUDA_STATS=sb))
            self.kv_round(a, b, layers=8, per=128, blk=4099, stride=4352)
            for sc in (a, b):
                self.assertEqual(sc.stop(), 0)
            stats[tag] = []
            for path in (sa, sb):
                with open(path) as f:
                    stats[tag].append(dict(kv.split("=") for kv in f.read().split()))
        pieces = 2 * 8 * 128  # per sidecar: a READ and a WRITE
        calls = [int(s["batch_calls"]) + int(s["copy_calls"]) for s in stats["batched"]]
        # a's pieces are scattered: batched; b's are back to back: one copy per pinned buffer
        self.assertGreater(int(stats["batched"][0]["batch_calls"]), 0, stats)
        self.assertLess(max(calls), pieces // 16, stats)
        self.assertEqual([s["batch_calls"] for s in stats["unbatched"]], ["0", "0"], stats)
        self.assertGreaterEqual(int(stats["unbatched"][0]["copy_calls"]), pieces, stats)
        print("driver calls for %d pieces per sidecar: batched a=%d b=%d, without "
              "cuMemcpyBatchAsync a=%s b=%s" % (pieces, calls[0], calls[1],
                                                stats["unbatched"][0]["copy_calls"],
                                                stats["unbatched"][1]["copy_calls"]))
        a, b = self.pair(suffix="-host")
        self.kv_round(a, b, layers=3, per=50, blk=777, stride=800, host_side=True)

    def test_tcp_kv_prompt_16384_gpu_blocks_one_operation(self):
        """A 4K-token prompt's shape in GPU memory: 64 GPU layer tensors x the same 256 block ids
        (16,384 descriptors, 1,031-byte blocks to keep it to 17 MiB) as ONE READ and ONE WRITE
        against one GPU strided run, staged over TCP, every byte of every region compared."""
        a, b = self.pair()
        self.kv_round(a, b, layers=64, per=256, blk=1031, stride=1040)

    def test_local_device_copies(self):
        keys = self.key_file()
        a = self.gpu_sidecar("a", keys)
        lengths = [3 * MiB + 1, 4099, 5 * MiB]
        for direction in ("read", "write"):
            # same GPU, across GPUs, GPU <-> host, all in one operation
            done, _ = self.transfer(a, [GpuMem(a, 4 * MiB), GpuMem(a, 5000, device=DEV1), HostMem(a, 6 * MiB)],
                                    a, [GpuMem(a, 4 * MiB), GpuMem(a, 5000), GpuMem(a, 6 * MiB, device=DEV1)],
                                    lengths, direction)
            self.assertEqual(done.backend, pb.BACKEND_LOCAL)
            self.assertIn("GPU copies by the CUDA driver", done.backend_reason)

    @stand_in_only
    def test_async_copies_are_waited_for(self):
        # Every stand-in async copy is delayed: a sidecar that reads a pinned buffer before its
        # copy finished, or reports COMPLETE before the last copy into GPU memory, sends or
        # leaves stale bytes, and the comparison fails.
        slow = {"FAKE_CUDA_COPY_DELAY_US": "3000"}
        keys = self.key_file()
        a = self.gpu_sidecar("a", keys, env=slow)
        b = self.gpu_sidecar("b", keys, env=slow)
        for direction in ("read", "write"):
            self.transfer(a, [GpuMem(a, 13 * MiB)], b, [GpuMem(b, 13 * MiB)], [13 * MiB - 5], direction)

    @stand_in_only
    def test_copy_failure_mid_transfer_errors_both_sides(self):
        # The active sidecar's 3rd driver copy fails: a piece in the middle of the transfer (the
        # stand-in counts copies per process, so each direction gets a fresh pair).
        # A failure that does not poison the context (CUDA_ERROR_UNKNOWN; test_sticky_error_* has
        # the sticky kind).
        for direction in ("read", "write"):
            a, b = self.pair(env_b={"FAKE_CUDA_FAIL_COPY_AT": "3", "FAKE_CUDA_FAIL_COPY_ERROR": "999"},
                             suffix=direction[0])
            done, pdone = self.transfer(a, [GpuMem(a, 20 * MiB)], b, [GpuMem(b, 20 * MiB)], [20 * MiB],
                                        direction, expect=pb.OPERATION_STATUS_ERRORED)
            self.assertIn("CUDA_ERROR_UNKNOWN", done.error.message)
            self.assertIn("CUDA_ERROR_UNKNOWN", pdone.error.message)
            self.assertTrue(all(g.healthy for g in b.info().gpus))
            # Both sidecars keep serving: GPU and host transfers still work.
            self.transfer(a, [GpuMem(a, 3 * MiB)], b, [GpuMem(b, 3 * MiB)], [3 * MiB - 1], direction)
            self.transfer(a, [HostMem(a, 5000)], b, [HostMem(b, 5000)], [4321], direction)

    @stand_in_only
    def test_staging_waits_sleep(self):
        # Every copy into b's GPU takes 250 ms: b's stagers spend the transfer waiting on their
        # events. The stand-in spins a waiting thread as the driver does unless the event has
        # CU_EVENT_BLOCKING_SYNC; b's CPU time over the transfer shows which.
        keys = self.key_file()
        a = self.gpu_sidecar("a", keys)
        b = self.gpu_sidecar("b", keys, env={"FAKE_CUDA_COPY_DELAY_US": "250000"})

        def cpu():
            with open("/proc/%d/stat" % b.proc.pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        src, dst = HostMem(a, 12 * MiB), GpuMem(b, 12 * MiB)
        c0, t0 = cpu(), time.monotonic()
        for local in (False, True):  # staged over TCP, then a LOCAL device-to-device copy
            if local:
                src = GpuMem(b, 12 * MiB)
            self.transfer(b if local else a, [src], b, [dst], [12 * MiB - 7], "read")
        used, wall = cpu() - c0, time.monotonic() - t0
        print("sidecar b: %.2f s CPU over %.2f s of transfers" % (used, wall))
        self.assertGreater(wall, 1.0)
        self.assertLess(used, 0.25 * wall, "b's GPU waits spin instead of sleeping")

    @stand_in_only
    def test_sticky_error_marks_the_gpu_unhealthy(self):
        # As on a real GPU, CUDA_ERROR_ILLEGAL_ADDRESS poisons the context: b says so in GetInfo and
        # metrics and refuses new work on that GPU with UNAVAILABLE; host memory and its other GPU
        # keep working.
        keys = self.key_file()
        a = self.gpu_sidecar("a", keys)
        port = free_port()
        b = self.sidecar("b", key_file=keys, extra=["--metrics-listen", "127.0.0.1:%d" % port],
                         env=dict(ENV, FAKE_CUDA_FAIL_COPY_AT="3"))
        self.assertTrue(all(g.healthy and not g.health_detail for g in b.info().gpus))

        def gpu_ready(sc):
            return sc.health.Check(health_pb2.HealthCheckRequest(service="rdma_sidecar.v1.Sidecar/gpu"),
                                   timeout=10).status == health_pb2.HealthCheckResponse.SERVING
        self.assertTrue(gpu_ready(b))
        done, pdone = self.transfer(a, [GpuMem(a, 20 * MiB)], b, [GpuMem(b, 20 * MiB)], [20 * MiB], "read",
                                    expect=pb.OPERATION_STATUS_ERRORED)
        self.assertIn("CUDA_ERROR_ILLEGAL_ADDRESS", done.error.message)
        gpus = b.info().gpus
        self.assertFalse(gpus[0].healthy)
        self.assertIn("CUDA_ERROR_ILLEGAL_ADDRESS", gpus[0].health_detail)
        self.assertIn("restarts", gpus[0].health_detail)
        self.assertTrue(all(g.healthy for g in gpus[1:]))
        self.assertFalse(gpu_ready(b))  # readiness for GPU work fails; the server as a whole serves
        self.assertEqual(b.health.Check(health_pb2.HealthCheckRequest(), timeout=10).status,
                         health_pb2.HealthCheckResponse.SERVING)
        self.assertTrue(gpu_ready(a))
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10 * SLOW) as r:
            metrics = r.read().decode()
        self.assertIn('rdma_sidecar_gpu_healthy{gpu="0",uuid="%s"} 0\n' % gpus[0].uuid, metrics)
        self.assertIn('rdma_sidecar_gpu_healthy{gpu="1",uuid="%s"} 1\n' % gpus[1].uuid, metrics)
        self.assertRpcError(grpc.StatusCode.UNAVAILABLE, GpuMem, b, MiB, contains="GPU 0 is unhealthy")
        self.assertRpcError(grpc.StatusCode.UNAVAILABLE, b.stub.CreateRegion,
                            pb.CreateRegionRequest(size=MiB, device_kind=pb.DEVICE_KIND_CUDA, device_index=0),
                            contains="restart the sidecar", timeout=10)
        self.transfer(a, [HostMem(a, 5000)], b, [HostMem(b, 5000)], [4321], "read")
        if NDEV > 1:
            self.transfer(a, [GpuMem(a, MiB)], b, [GpuMem(b, MiB, device=1)], [MiB - 3], "write")

    @stand_in_only
    def test_cancel_answers_when_the_memory_is_quiet(self):
        # Every copy into b's GPU memory takes 40 ms: when CancelOperation answers CANCELLED, the
        # staged copies already queued must have landed, not land afterwards (a worker reuses
        # its memory the moment the operation is terminal).
        keys = self.key_file()
        a = self.gpu_sidecar("a", keys)
        b = self.gpu_sidecar("b", keys, env={"FAKE_CUDA_COPY_DELAY_US": "40000"})
        size = 48 * MiB
        src, dst = HostMem(a, size), GpuMem(b, size)
        src.write(0, os.urandom(size))
        dst.write(0, bytes(size))
        ro = a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(src.region, 0, size)],
                                                           timeout_ms=60000), timeout=30)
        op = b.stub.BeginRead(pb.BeginTransferRequest(metadata=ro.metadata, descriptors=[desc(dst.region, 0, size)],
                                                      timeout_ms=60000), timeout=30)
        wait_until(lambda: b.stub.GetOperation(pb.GetOperationRequest(operation_id=op.operation_id),
                                               timeout=10).bytes_done > 0, 30, "the READ moving")
        c = b.stub.CancelOperation(pb.CancelOperationRequest(operation_id=op.operation_id), timeout=60)
        self.assertEqual(c.status, pb.OPERATION_STATUS_CANCELLED, c.error.message)
        self.assertLess(c.bytes_done, size)
        first = dst.read(0, size)
        time.sleep(0.5)
        later = dst.read(0, size)
        if later != first:
            at = next(i for i in range(size) if later[i] != first[i])
            self.fail("bytes landed at offset %d after CancelOperation answered CANCELLED" % at)
        self.assertEqual(a.wait(ro.operation_id, 10000).status, pb.OPERATION_STATUS_CANCELLED)

    def test_deregister_while_in_use(self):
        a, b = self.pair()
        src = GpuMem(a, MiB)
        passive = a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(src.region, 0, MiB)],
                                                                timeout_ms=60000), timeout=10)
        self.assertRpcError(grpc.StatusCode.FAILED_PRECONDITION, a.stub.DeregisterRegion,
                            pb.DeregisterRegionRequest(region_id=src.region.region_id),
                            contains="live operation", timeout=10)
        a.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=src.region.region_id, force=True),
                                timeout=10)
        op = a.stub.GetOperation(pb.GetOperationRequest(operation_id=passive.operation_id), timeout=10)
        self.assertEqual(op.status, pb.OPERATION_STATUS_CANCELLED)
        # The worker's memory is untouched and still its own.
        cu.set_current(0)
        cu.htod(src.base, b"still mine")
        self.assertEqual(cu.dtoh(src.base, 10), b"still mine")

    @stand_in_only
    def test_device_pointer_never_dereferenced_by_host_code(self):
        # Sanity check of the stand-in itself: a host read of a device address crashes, so the
        # transfers above prove the sidecar went through the driver.
        examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
        code = ("import os,sys,ctypes; sys.path.insert(0,%r); os.environ['SC_TEST_CUDA_DRIVER']=%r\n"
                "import cudadrv as cu; cu.init(0); p=cu.alloc(4096); ctypes.string_at(p, 1)"
                % (examples, FAKE))
        rc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30 * SLOW).returncode
        self.assertEqual(rc, -11)


if __name__ == "__main__":
    main()
