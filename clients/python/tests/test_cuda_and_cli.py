# SPDX-License-Identifier: Apache-2.0
"""GPU memory and the command line.

Raw CUDA memory (Descriptor((dptr, size, device))) runs on the STAND-IN driver of tests/fake_cuda
(SC_FAKE_CUDA, set by ctest; no GPU needed): this process allocates "device memory" with
examples/cudadrv.py and the package registers it with the sidecar by its IPC handle. CUDA tensors
need torch with CUDA and a GPU: skipped here with the reason when there is none.
`python3 -m rdma_sidecar` runs as a subprocess against a real sidecar."""
import os
import subprocess
import sys

import numpy as np
import pytest

import rdma_sidecar as rs
import harness
from conftest import SLOW, addr

FAKE = os.environ.get("SC_FAKE_CUDA", "")
PKG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


@pytest.fixture(scope="module")
def gpu_sidecar(cluster):
    if not FAKE or not os.path.exists(FAKE):
        pytest.skip("the stand-in CUDA driver was not built (no cuda.h at build time): SC_FAKE_CUDA unset")
    os.environ["SC_TEST_CUDA_DRIVER"] = FAKE
    yield cluster.sidecar("g", env={"SC_TEST_CUDA_DRIVER": FAKE})


def test_raw_cuda_pointer_on_stand_in_driver(gpu_sidecar):
    import cudadrv as cu  # examples/cudadrv.py, on the path through the harness
    cu.init(0)
    block = 2 << 20
    base = cu.alloc(block)
    try:
        payload = os.urandom(100000)
        with rs.sync.Connector(addr(gpu_sidecar)) as c:
            assert c.info().cuda_available
            src = c.empty(len(payload), np.uint8)
            src[:] = np.frombuffer(payload, np.uint8)
            gpu = rs.Descriptor((base + 4096, len(payload), 0))  # inside the block, at an offset
            with c.create_writable(gpu) as w, c.begin_write(w, rs.Descriptor(src)) as op:
                op.wait_for_completion(30 * SLOW)
            regions = [r for r in c.list_regions() if r.device_kind == rs.connector.pb.DEVICE_KIND_CUDA]
            assert len(regions) == 1 and regions[0].size == len(payload)
            assert cu.dtoh(base + 4096, len(payload)) == payload
            assert cu.dtoh(base, 4096) == bytes(4096)  # nothing before the range was written
            # And back: GPU -> host.
            back = c.zeros(len(payload), np.uint8)
            with c.create_readable(gpu) as r, c.begin_read(r, rs.Descriptor(back)) as op:
                op.wait_for_completion(30 * SLOW)
            assert back.tobytes() == payload
            with pytest.raises(ValueError, match="size must be > 0"):
                rs.Descriptor((base, 0, 0))
            with pytest.raises(ValueError, match="runs past its allocation"):
                rs.Descriptor((base + block - 10, 100, 0))
    finally:
        cu.free(base)


def test_cuda_tensor_by_ipc_handle(cluster):
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device here (Debian's python3-torch is CPU-only); CUDA tensors "
                    "are registered by the IPC handle of their allocation block (from the driver) where one exists")
    with rs.sync.Connector(addr(cluster.a)) as c:
        if not c.info().cuda_available:
            pytest.skip("the sidecar has no CUDA driver")
        t = c.empty((1024, 3), torch.float16, device="cuda:0")
        t.copy_(torch.randn(1024, 3))
        host = c.zeros((1024, 3), torch.float16)
        with c.create_readable(rs.Descriptor(t[100:600])) as r, c.begin_read(r, rs.Descriptor(host[100:600])) as op:
            op.wait_for_completion(60)
        assert torch.equal(host[100:600], t[100:600].cpu())
        c.free(t)


def cli(*args, env=None):
    # The package's directory and, in a checkout, the build's generated half (harness.STUBS).
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([PKG, harness.STUBS]), **(env or {}))
    return subprocess.run([sys.executable, "-m", "rdma_sidecar", *args], capture_output=True, text=True,
                          timeout=60 * SLOW, env=e)


def test_cli(cluster):
    h = cli("--help")
    assert h.returncode == 0 and all(w in h.stdout for w in ("info", "regions", "ops", "RDMA_SIDECAR_ADDR"))
    info = cli("--address", addr(cluster.a), "info")
    assert info.returncode == 0, info.stderr
    assert "sidecar   a" in info.stdout and "health SERVING" in info.stdout and "nats      connected" in info.stdout
    with rs.sync.Connector(addr(cluster.b)) as c:
        src = c.empty(12345, np.uint8, name="cli-visible")
        with c.create_readable(rs.Descriptor(src)):
            regions = cli("regions", env={"RDMA_SIDECAR_ADDR": addr(cluster.b)})
            assert regions.returncode == 0 and "cli-visible" in regions.stdout and "12345" in regions.stdout
            ops = cli("--address", addr(cluster.b), "--json", "ops")
            assert ops.returncode == 0 and '"OPERATION_KIND_READABLE"' in ops.stdout
            assert "0/12345" in cli("--address", addr(cluster.b), "ops").stdout
    bad = cli("--address", "unix:/tmp/no-such-sidecar.sock", "--timeout", "2", "info")
    assert bad.returncode == 1 and "UNAVAILABLE" in bad.stderr
