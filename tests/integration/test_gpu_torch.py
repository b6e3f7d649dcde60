# SPDX-License-Identifier: Apache-2.0
"""CUDA tensors through the rdma_sidecar package: shared by the driver's IPC handle of their
allocation block, never through PyTorch's `untyped_storage()._share_cuda_()`.

On the STAND-IN driver (tests/fake_cuda; no GPU, and Debian has no CUDA build of PyTorch) the
"tensors" are instances of `StandInCudaTensor`, a LABELLED STAND-IN for a PyTorch CUDA tensor:
a real `torch.Tensor` subclass on device "cuda:0" (Debian's CPU-only torch) whose memory is a raw stand-in allocation inside a larger block (as PyTorch's caching allocator
sub-allocates), and whose `_share_cuda_()` behaves as PyTorch >= 2.5's: it returns the 66-byte
shareable handle (version, 'c', 64-byte IPC handle) and pins the storage (a counter that only a
PyTorch receiver would ever decrement). The package must read and write such tensors, and 10,000
operations on them must leave nothing pinned.

With SC_GPU_REAL=1 (tests/gpu) the same tests run on real PyTorch CUDA tensors, and the pin check
is PyTorch's own: after the operations, freed tensors give their memory back to the caching
allocator (torch.cuda.memory_allocated() returns to where it started).
"""
import gc
import os
import random
import shutil
import subprocess
import sys
import tempfile
import types
import unittest

REAL = os.environ.get("SC_GPU_REAL") == "1"
FAKE = os.environ.get("SC_FAKE_CUDA", "")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
if REAL:
    os.environ.pop("SC_TEST_CUDA_DRIVER", None)
elif not FAKE or not os.path.exists(FAKE):
    print("SKIP: the stand-in CUDA driver was not built (no cuda.h at build time)")
    sys.exit(77)
else:
    os.environ["SC_TEST_CUDA_DRIVER"] = FAKE
    FAKE_SHM = tempfile.mkdtemp(prefix="sc-gpu-torch-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.environ["FAKE_CUDA_SHM_DIR"] = FAKE_SHM
    import atexit
    atexit.register(shutil.rmtree, FAKE_SHM, True)

from harness import SLOW, SidecarTest, main  # noqa: E402
import cudadrv as cu  # noqa: E402

MiB = 1 << 20
OPS = int(os.environ.get("SC_GPU_TORCH_OPS", "10000"))

if REAL:
    try:
        import torch
    except ImportError:
        print("SKIP: no PyTorch here")
        sys.exit(77)
    if not torch.cuda.is_available():
        print("SKIP: PyTorch sees no CUDA device")
        sys.exit(77)
    StandInCudaTensor = None
else:
    try:
        import torch
    except ImportError:
        print("SKIP: python3-torch is not installed (the stand-in CUDA tensor is a torch.Tensor subclass)")
        sys.exit(77)

    from standin_torch import StandInCudaTensor  # noqa: E402

import numpy as np  # noqa: E402
import rdma_sidecar as rs  # noqa: E402
import rdma_sidecar.sync  # noqa: E402,F401
from rdma_sidecar.connector import pb as rspb  # noqa: E402


class TorchTensorTest(SidecarTest):
    def setUp(self):
        super().setUp()
        self.rnd = random.Random(int.from_bytes(os.urandom(8), "little"))
        if not REAL:
            cu.init(0)
            StandInCudaTensor.pinned = 0

    def gpu_sidecar(self):
        env = {} if REAL else {"SC_TEST_CUDA_DRIVER": FAKE, "FAKE_CUDA_SHM_DIR": FAKE_SHM}
        return self.sidecar("a", env=env)

    def connector(self, sc):
        return rs.sync.Connector("unix:" + sc.sock)

    # Tensors: (tensor, write(bytes), read() -> bytes), the tensor inside a bigger block.
    def tensor(self, nbytes, offset):
        if REAL:
            block = torch.empty(offset + nbytes + 4096, dtype=torch.uint8, device="cuda:0")
            t = block[offset:offset + nbytes]

            def write(data):
                t.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
                torch.cuda.synchronize()

            return t, write, lambda: bytes(t.cpu().numpy().tobytes()), block
        size = (offset + nbytes + 2 * MiB - 1) // (2 * MiB) * (2 * MiB)
        base = cu.alloc(size)
        cu.htod(base, os.urandom(size))
        t = StandInCudaTensor(base, offset, nbytes)
        self.addCleanup(cu.free, base)
        return t, lambda data: cu.htod(base + offset, data), lambda: cu.dtoh(base + offset, nbytes), base

    def test_read_and_write_cuda_tensors_inside_a_block(self):
        a = self.gpu_sidecar()
        with self.connector(a) as c:
            self.assertTrue(c.info().cuda_available, c.info().cuda_detail)
            for nbytes, offset in ((MiB + 3, 12345), (4097, 2 * MiB + 1), (1, 77)):
                t, write, read, _ = self.tensor(nbytes, offset)
                payload = os.urandom(nbytes)
                write(payload)
                host = c.zeros(nbytes, np.uint8)
                with c.create_readable(rs.Descriptor(t)) as r, c.begin_read(r, rs.Descriptor(host)) as op:
                    op.wait_for_completion(60)
                self.assertEqual(host.tobytes(), payload)
                back = os.urandom(nbytes)
                host[:] = np.frombuffer(back, np.uint8)
                with c.create_writable(rs.Descriptor(t)) as w, c.begin_write(w, rs.Descriptor(host)) as op:
                    op.wait_for_completion(60)
                self.assertEqual(read(), back)
                regions = [r for r in c.list_regions() if r.device_kind == rspb.DEVICE_KIND_CUDA]
                self.assertEqual(len(regions), 1)
                self.assertEqual(regions[0].size, nbytes)
                c.free(t)
                self.assertEqual(len([r for r in c.list_regions() if r.device_kind == rspb.DEVICE_KIND_CUDA]), 0)
                c.free(host)
        if not REAL:
            self.assertEqual(StandInCudaTensor.pinned, 0, "the package called _share_cuda_(), which pins storage")

    def layer_tensor(self, nblocks, blk, stride):
        """A vLLM-style layer tensor on the GPU: nblocks rows of blk bytes, stride bytes apart;
        (tensor, write_all(bytes of nblocks * stride), read_all())."""
        if REAL:
            whole = torch.empty(nblocks * stride, dtype=torch.uint8, device="cuda:0")
            t = whole.view(nblocks, stride)[:, :blk]

            def write(data):
                whole.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
                torch.cuda.synchronize()

            return t, write, lambda: bytes(whole.cpu().numpy().tobytes())
        size = (nblocks * stride + 2 * MiB - 1) // (2 * MiB) * (2 * MiB)
        base = cu.alloc(size)
        self.addCleanup(cu.free, base)
        t = StandInCudaTensor(base, 0, blk, blocks=(nblocks, stride))
        return t, lambda data: cu.htod(base, data), lambda: cu.dtoh(base, nblocks * stride)

    def test_kv_blocks_of_cuda_layer_tensors(self):
        """vLLM's layout through the package: 6 CUDA layer tensors x the same 40 random block ids
        (odd block size, rows padded) on one sidecar, KVBlocks with other ids on another: ONE
        READ, then ONE WRITE back into other blocks; every byte of every tensor compared."""
        keys = self.key_file()
        env = {} if REAL else {"SC_TEST_CUDA_DRIVER": FAKE, "FAKE_CUDA_SHM_DIR": FAKE_SHM}
        a, b = self.sidecar("a", key_file=keys, env=env), self.sidecar("b", key_file=keys, env=env)
        nblocks, blk, stride, layers = 64, 4099, 4352, 6
        with self.connector(a) as ca, self.connector(b) as cb:
            src = [self.layer_tensor(nblocks, blk, stride) for _ in range(layers)]
            dst = [self.layer_tensor(nblocks, blk, stride) for _ in range(layers)]
            images = []
            for t, write, _ in src + dst:
                img = bytearray(os.urandom(nblocks * stride))
                write(bytes(img))
                images.append(img)
            ids, dst_ids = self.rnd.sample(range(nblocks), 40), self.rnd.sample(range(nblocks), 40)

            def move(images_from, ids_from, images_to, ids_to):
                for img_f, img_t in zip(images_from, images_to):
                    for i, j in zip(ids_from, ids_to):
                        img_t[j * stride:j * stride + blk] = img_f[i * stride:i * stride + blk]

            def check(what):
                for k, (_, _, read) in enumerate(src + dst):
                    got = read()
                    if got != bytes(images[k]):
                        at = next(i for i in range(len(got)) if got[i] != images[k][i])
                        self.fail("%s: tensor %d differs first at byte %d" % (what, k, at))

            with ca.create_readable(rs.KVBlocks([t for t, _, _ in src], ids)) as r:
                self.assertEqual(len(rs.metadata_descriptor_lengths(r.metadata)), layers * 40)
                with cb.begin_read(r, rs.KVBlocks([t for t, _, _ in dst], dst_ids)) as op:
                    op.wait_for_completion(60 * SLOW)
                    self.assertEqual(op.bytes_done, layers * 40 * blk)
            move(images[:layers], ids, images[layers:], dst_ids)
            check("read")
            back = self.rnd.sample(range(nblocks), 40)
            with ca.create_writable(rs.KVBlocks([t for t, _, _ in src], back)) as w:
                with cb.begin_write(w, rs.KVBlocks([t for t, _, _ in dst], dst_ids)) as op:
                    op.wait_for_completion(60 * SLOW)
                w.wait_for_completion(30 * SLOW)
            move(images[layers:], dst_ids, images[:layers], back)
            check("write")
            for t, _, _ in src:
                ca.free(t)
            for t, _, _ in dst:
                cb.free(t)
        if not REAL:
            self.assertEqual(StandInCudaTensor.pinned, 0, "the package called _share_cuda_(), which pins storage")

    def test_many_operations_pin_nothing(self):
        # OPS operations over a few tensors; each descriptor is resolved anew by the driver.
        a = self.gpu_sidecar()
        with self.connector(a) as c:
            if REAL:
                torch.cuda.synchronize()
                start = torch.cuda.memory_allocated()
            tensors = [self.tensor(n, o) for n, o in ((5000, 3), (333, 2 * MiB - 333), (MiB, 4096))]
            for i in range(OPS):
                t = tensors[i % len(tensors)][0]
                if REAL and i % 100 == 0:
                    # a fresh tensor from the caching allocator now and then, freed right after
                    fresh = torch.empty(1 << 16, dtype=torch.uint8, device="cuda:0")
                    with c.create_readable(rs.Descriptor(fresh)):
                        pass
                    c.free(fresh)
                    del fresh
                with c.create_readable(rs.Descriptor(t)):
                    pass
            # The last one still moves the right bytes.
            t, write, _, _ = tensors[0]
            payload = os.urandom(5000)
            write(payload)
            host = c.zeros(5000, np.uint8)
            with c.create_readable(rs.Descriptor(t)) as r, c.begin_read(r, rs.Descriptor(host)) as op:
                op.wait_for_completion(60)
            self.assertEqual(host.tobytes(), payload)
            self.assertEqual(len([r for r in c.list_regions() if r.device_kind == rspb.DEVICE_KIND_CUDA]),
                             len(tensors))
            for t in tensors:
                c.free(t[0])
            c.free(host)
            if REAL:
                # write's closure, _ (the block) and the last operations' descriptors hold tensors[0]
                del tensors, t, write, _, r, op
                gc.collect()
                torch.cuda.synchronize()
                self.assertEqual(torch.cuda.memory_allocated(), start,
                                 "freed tensors stayed allocated: storage pinned by _share_cuda_()")
        if not REAL:
            self.assertEqual(StandInCudaTensor.pinned, 0, "the package called _share_cuda_(), which pins storage")

    def test_worker_writes_land_before_the_sidecar_reads(self):
        # The worker's last write is a pageable cuMemcpyHtoD whose DMA lands 2 s after the call
        # returned (FAKE_CUDA_COPY_DELAY_US in the worker process only; the driver documents that
        # the DMA "may not have completed"). The package must synchronize the device before the
        # sidecar reads the tensor, or the reader gets the bytes from before the write.
        if REAL:
            self.skipTest("stand-in timing (late DMA) only")
        a = self.gpu_sidecar()
        code = r"""
import os, sys
import numpy as np
import cudadrv as cu
import rdma_sidecar as rs
import rdma_sidecar.sync
from standin_torch import StandInCudaTensor
cu.init(0)
base = cu.alloc(2 << 20)
t = StandInCudaTensor(base, 4096, 100003)
payload = os.urandom(100003)
cu.htod(base + 4096, payload, sync=False)
with rs.sync.Connector(sys.argv[1]) as c:
    host = c.zeros(100003, np.uint8)
    with c.create_readable(rs.Descriptor(t)) as r, c.begin_read(r, rs.Descriptor(host)) as op:
        op.wait_for_completion(60)
    print("same" if host.tobytes() == payload else "STALE")
    c.free(t)
    c.free(host)
cu.free(base)
"""
        path = os.pathsep.join([HERE, os.path.join(HERE, "..", "..", "clients", "python"),
                                os.path.join(HERE, "..", "..", "examples"), os.environ.get("SC_PYTHON_STUBS", "")])
        env = dict(os.environ, PYTHONPATH=path, FAKE_CUDA_COPY_DELAY_US="2000000")
        r = subprocess.run([sys.executable, "-c", code, "unix:" + a.sock], env=env, capture_output=True,
                           timeout=120 * SLOW)
        self.assertEqual(r.returncode, 0, r.stderr.decode()[-3000:])
        self.assertEqual(r.stdout.decode().strip(), "same")

    def test_wrong_device_and_foreign_memory_are_refused(self):
        if REAL:
            self.skipTest("stand-in shapes only")
        a = self.gpu_sidecar()
        with self.connector(a) as c:
            t, _, _, base = self.tensor(1000, 10)
            with self.assertRaisesRegex(ValueError, "lies on CUDA device 0, not device 1"):
                rs.Descriptor(StandInCudaTensor(base, 10, 1000, index=1))
            with self.assertRaisesRegex(ValueError, "runs past its allocation"):
                rs.Descriptor(StandInCudaTensor(base, 2 * MiB - 10, 100))
            with self.assertRaisesRegex(ValueError, "is not CUDA device memory of device 0"):
                rs.Descriptor(StandInCudaTensor(1 << 12, 0, 100))
            # PyTorch's expandable segments are cuMemCreate memory: no IPC handle, say what to do.
            dptr, fd, asize = cu.vmm_alloc(2 * MiB)
            with self.assertRaisesRegex(ValueError, "expandable_segments:True.*turn expandable segments off"):
                rs.Descriptor(StandInCudaTensor(dptr, 4096, 100))
            cu.vmm_free(dptr, fd)
            self.assertEqual(len(c.list_regions()), 0)


if __name__ == "__main__":
    main()
