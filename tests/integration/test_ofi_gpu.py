# SPDX-License-Identifier: Apache-2.0
"""GPU memory and the libfabric backend, on the STAND-IN CUDA driver (tests/fake_cuda): the path is
chosen or refused with its reason. Debian's tcp;ofi_rxm offers no FI_HMEM, so GetInfo says GPU memory
is staged and why; a readable over GPU memory is not granted to libfabric peers (the reason in its
backend_reason), and a peer's read of it moves over tcp, staged, saying why, every byte compared.
Where a provider offers FI_HMEM (EFA, verbs with CUDA), the same checks see "FI_HMEM_CUDA
registration" instead. Skipped (77) without the stand-in driver."""
import os
import shutil
import sys
import tempfile
import atexit

FAKE = os.environ.get("SC_FAKE_CUDA", "")
if not FAKE or not os.path.exists(FAKE):
    print("SKIP: the stand-in CUDA driver was not built (no cuda.h at build time)")
    sys.exit(77)
os.environ["SC_TEST_CUDA_DRIVER"] = FAKE
FAKE_SHM = tempfile.mkdtemp(prefix="sc-ofi-gpu-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
os.environ["FAKE_CUDA_SHM_DIR"] = FAKE_SHM
atexit.register(shutil.rmtree, FAKE_SHM, True)

from harness import SidecarTest, desc, main, pb  # noqa: E402 (also puts examples/ on the path)
import cudadrv as cu  # noqa: E402

OFI = ["--backends", "tcp,libfabric", "--ofi-provider", "tcp;ofi_rxm", "--ofi-domains", "lo"]
ENV = {"SC_TEST_CUDA_DRIVER": FAKE, "FAKE_CUDA_SHM_DIR": FAKE_SHM}
MiB = 1 << 20


class OfiGpuTest(SidecarTest):
    def test_hmem_path_and_reason(self):
        cu.init(0)
        keys = self.key_file()
        a = self.sidecar("a", key_file=keys, extra=OFI, env=ENV)
        b = self.sidecar("b", key_file=keys, extra=OFI, env=ENV)
        be = next(x for x in a.info().backends if x.backend == pb.BACKEND_LIBFABRIC)
        self.assertTrue(be.available, be.detail)
        hmem = "FI_HMEM_CUDA registration" in be.detail
        if not hmem:
            self.assertIn("does not offer FI_HMEM", be.detail)
        print("libfabric GPU path: %s" % be.detail.split("GPU memory: ", 1)[1])

        # worker GPU memory on a, registered by IPC handle
        size = 2 * MiB
        base = cu.alloc(size)
        region = a.stub.RegisterRegion(pb.RegisterRegionRequest(cuda_ipc=pb.CudaIpcSource(
            device_index=0, handle=cu.ipc_handle(base), size=size), name="gpu"), timeout=30)
        data = os.urandom(300001)
        cu.set_current(0)
        cu.htod(base + 4097, data)
        op = a.stub.CreateReadable(pb.CreatePassiveRequest(
            descriptors=[desc(region, 4097, len(data))], timeout_ms=60000), timeout=30)
        rb = b.create_region(1 * MiB)
        done = b.stub.BeginRead(pb.BeginTransferRequest(
            metadata=op.metadata, descriptors=[desc(rb, 3, len(data))], timeout_ms=60000,
            wait=True), timeout=90)
        self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
        self.assertEqual(b.peek(rb, 3, len(data)), data)
        passive = a.wait(op.operation_id, 10000)
        if hmem:
            self.assertEqual(done.backend, pb.BACKEND_LIBFABRIC, done.backend_reason)
        else:
            # refused for libfabric, with the provider's reason, and staged over tcp
            self.assertIn("libfabric", passive.backend_reason)
            self.assertIn("FI_HMEM", passive.backend_reason)
            self.assertEqual(done.backend, pb.BACKEND_TCP, done.backend_reason)
            self.assertIn("staged", done.backend_reason)
        print("passive backend_reason: %s" % passive.backend_reason)
        print("active backend_reason: %s" % done.backend_reason)


if __name__ == "__main__":
    main()
