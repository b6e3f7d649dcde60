# SPDX-License-Identifier: Apache-2.0
"""rdma_sidecar.ray, the Ray Direct Transport adapter, driven the way Ray's runtime calls it:
registration, extract_tensor_transport_metadata in the source actor's process (ray_source.py, a
second process beside its own sidecar), recv_multiple_tensors / fetch + wait_fetch_complete in the
destination's (this process, beside another sidecar), garbage_collect, abort_transport, a timeout.

Ray itself is not installable here: tests/integration/ray_standin/ is a STAND-IN for the only two
pieces of Ray the adapter touches (register_tensor_transport records the registration; an actor
handle whose __ray_call__ runs the probe here). Every byte moves through real sidecars, compared
(random bytes, several dtypes and shapes, an empty tensor, tensors in regions and copied in)."""
import base64
import hashlib
import json
import os
import pickle
import signal
import subprocess
import sys
import time

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("SC_SOURCE_DIR", os.path.join(HERE, "..", ".."))
STANDIN = os.path.join(HERE, "ray_standin")
# CUDA tensors run on the stand-in driver (tests/fake_cuda) when it was built: both sidecars, the
# source process and this one use it (Debian's torch has no CUDA).
FAKE = os.environ.get("SC_FAKE_CUDA", "")
if FAKE and os.path.exists(FAKE):
    import atexit
    import shutil
    import tempfile
    os.environ["SC_TEST_CUDA_DRIVER"] = FAKE
    os.environ["FAKE_CUDA_SHM_DIR"] = tempfile.mkdtemp(prefix="sc-ray-gpu-", dir="/dev/shm")
    atexit.register(shutil.rmtree, os.environ["FAKE_CUDA_SHM_DIR"], True)
# The package before harness (which imports the generated half from build/python), the stand-in first.
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, STANDIN)
import harness  # noqa: E402
from harness import SLOW, SidecarTest, main  # noqa: E402

try:
    import torch  # noqa: E402
except ImportError:  # pragma: no cover
    print("SKIP: the adapter moves torch tensors; python3-torch is not installed")
    sys.exit(77)
import rdma_sidecar  # noqa: E402
import rdma_sidecar.ray as rsr  # noqa: E402
from ray import StandInActor, experimental  # noqa: E402  (the STAND-IN, see the docstring)

SPEC = [[[3, 5, 7], "float32", False], [[257, 129], "float16", True], [[1], "int64", False],
        [[0, 4], "float32", False], [[33, 31], "bfloat16", True], [[4097], "uint8", False]]


def sha(t):
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


class Source:
    """The source actor's process (ray_source.py) beside sidecar `side`."""

    def __init__(self, side):
        env = dict(os.environ, RAY_SOURCE_SIDECAR="unix:" + side.sock, PYTHONDONTWRITEBYTECODE="1",
                   PYTHONPATH=os.pathsep.join([STANDIN, os.path.join(ROOT, "clients", "python"), harness.STUBS,
                                               HERE, os.path.join(ROOT, "examples")]))
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "ray_source.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)

    def ask(self, **req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError("the source process ended (exit %s)" % self.proc.wait(10))
        return json.loads(line)

    def extract(self, obj, spec=SPEC, seed=7):
        ans = self.ask(cmd="extract", obj=obj, tensors=spec, seed=seed)
        return pickle.loads(base64.b64decode(ans["meta"])), ans["sha"]

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
            self.proc.stdin.flush()
            try:
                self.proc.wait(30 * SLOW)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


class RayTransportTest(SidecarTest):
    def setUp(self):
        super().setUp()
        keys = self.key_file()
        self.src_side = self.sidecar("src", key_file=keys)
        self.dst_side = self.sidecar("dst", key_file=keys)
        self.src = Source(self.src_side)
        self.addCleanup(self.src.close)
        experimental.REGISTERED.clear()
        rsr.register(address="unix:" + self.dst_side.sock, timeout=30 * SLOW)
        devices, cls, data_type = experimental.REGISTERED[rsr.NAME]
        self.assertEqual((devices, cls, data_type), (["cpu", "cuda"], rsr.SidecarTensorTransport, torch.Tensor))
        self.dst = cls()  # as Ray makes it
        self.addCleanup(self.dst.close)

    def assert_same(self, tensors, meta, shas):
        self.assertEqual([(tuple(t.shape), t.dtype) for t in tensors], [(tuple(s), d) for s, d in meta.tensor_meta])
        self.assertEqual([sha(t) for t in tensors], shas)

    def test_interface_answers(self):
        self.assertTrue(self.dst.is_one_sided())
        self.assertTrue(self.dst.can_abort_transport())
        self.assertEqual(self.dst.tensor_transport_backend(), "RDMA_SIDECAR")
        self.assertIsInstance(self.dst.get_communicator_metadata(None, None), rsr.SidecarCommunicatorMetadata)
        with self.assertRaises(NotImplementedError):
            self.dst.send_multiple_tensors([], None, None)
        self.assertTrue(self.dst.actor_has_tensor_transport(StandInActor()))
        ok, why = rsr.probe("unix:/nonexistent/sidecar.sock")
        self.assertFalse(ok)
        self.assertIn("no usable sidecar", why)

    def test_cpu_tensors_of_several_dtypes(self):
        meta, shas = self.src.extract("obj-1")
        self.assertEqual(meta.tensor_device, "cpu")
        self.assertTrue(meta.metadata.startswith("rsm1."))
        self.assertLess(len(pickle.dumps(meta)), 4096, "the transport metadata should stay small")
        got = self.dst.recv_multiple_tensors("obj-1", meta, self.dst.get_communicator_metadata(None, None))
        self.assert_same(got, meta, shas)
        # zero copy: the received CPU tensors live in this sidecar's regions
        for t in got:
            if t.numel():
                self.dst.connector().region_of(t)
        # Ray may read an object again (max_uses): a second destination read of the same metadata
        again = self.dst.recv_multiple_tensors("obj-1", meta, None)
        self.assert_same(again, meta, shas)
        self.assertEqual(self.dst.connector().list_operations(), [], "the reads were not released")

    def test_target_buffers_and_async_fetch(self):
        meta, shas = self.src.extract("obj-2", seed=11)
        c = self.dst.connector()
        targets = [c.empty(tuple(s), d) for s, d in meta.tensor_meta]
        req = self.dst.fetch_multiple_tensors("obj-2", meta, None, target_buffers=targets)
        got = self.dst.wait_fetch_complete(req, 30 * SLOW)
        self.assertTrue(all(a is b for a, b in zip(got, targets)), "the target buffers were not used")
        self.assert_same(got, meta, shas)
        bad = [c.empty((2, 2), torch.float32)] * len(targets)
        with self.assertRaises(ValueError) as e:
            self.dst.fetch_multiple_tensors("obj-2", meta, None, target_buffers=bad)
        self.assertIn("target buffer 0", str(e.exception))

    def stop(self, side):
        self.addCleanup(side.proc.send_signal, signal.SIGCONT)
        side.pause()

    def tearDown(self):
        for s in (self.src_side, self.dst_side):
            if s.proc.poll() is None:
                s.proc.send_signal(signal.SIGCONT)  # a stopped process ignores the harness's SIGTERM
        super().tearDown()

    def test_timeout(self):
        meta, _ = self.src.extract("obj-3", spec=[[[1 << 20], "uint8", False]])
        self.stop(self.src_side)  # the source's sidecar never answers
        req = self.dst.fetch_multiple_tensors("obj-3", meta, None)
        t0 = time.monotonic()
        with self.assertRaises(TimeoutError) as e:
            self.dst.wait_fetch_complete(req, 1.0)
        took = time.monotonic() - t0
        self.assertIn("not received within 1.0s", str(e.exception))
        self.assertLess(took, 1.0 + 1.0 * SLOW + 2, "the timeout and its cancel took %.1f s" % took)
        self.assertEqual(self.dst.connector().list_operations(), [])

    def test_abort_from_destination(self):
        meta, _ = self.src.extract("obj-4", spec=[[[1 << 20], "uint8", False]])
        self.stop(self.src_side)
        req = self.dst.fetch_multiple_tensors("obj-4", meta, None)
        t0 = time.monotonic()
        self.dst.abort_transport("obj-4", None)
        self.assertLess(time.monotonic() - t0, 1.0 * SLOW + 2, "abort did not return promptly")
        with self.assertRaises(rdma_sidecar.SidecarError) as e:
            self.dst.wait_fetch_complete(req, 10 * SLOW)
        self.assertEqual(e.exception.code, grpc.StatusCode.CANCELLED, e.exception.message)

    def test_abort_from_source(self):
        meta, _ = self.src.extract("obj-5", spec=[[[1 << 20], "uint8", False]])
        self.stop(self.dst_side)  # the destination's read is begun but cannot move yet
        t0 = time.monotonic()
        self.assertLess(self.src.ask(cmd="abort", obj="obj-5")["seconds"], 1.0 * SLOW + 2)
        self.dst_side.proc.send_signal(signal.SIGCONT)
        req = self.dst.fetch_multiple_tensors("obj-5", meta, None)
        with self.assertRaises(rdma_sidecar.SidecarError) as e:
            self.dst.wait_fetch_complete(req, 10 * SLOW)
        self.assertEqual(e.exception.code, grpc.StatusCode.FAILED_PRECONDITION, e.exception.message)
        self.assertIn("cancelled", e.exception.message)
        self.assertLess(time.monotonic() - t0, 10 * SLOW)

    def test_garbage_collect_leaves_nothing(self):
        plain = [[s, d, False] for s, d, _ in SPEC]  # every tensor copied in by the transport
        meta, shas = self.src.extract("obj-6", spec=plain, seed=5)
        self.assert_same(self.dst.recv_multiple_tensors("obj-6", meta, None), meta, shas)
        left = self.src.ask(cmd="gc", obj="obj-6")
        self.assertEqual(left, {"regions": 0, "operations": 0})
        # the readable is gone: its metadata no longer reads
        req = self.dst.fetch_multiple_tensors("obj-6", meta, None)
        with self.assertRaises(rdma_sidecar.SidecarError) as e:
            self.dst.wait_fetch_complete(req, 10 * SLOW)
        self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND, e.exception.message)


    def test_cuda_tensors_on_the_stand_in_driver(self):
        if "SC_TEST_CUDA_DRIVER" not in os.environ:
            self.skipTest("the stand-in CUDA driver was not built (no cuda.h at build time)")
        sys.path.insert(0, os.path.join(ROOT, "examples"))
        import cudadrv as cu
        from standin_torch import StandInCudaTensor  # a LABELLED STAND-IN for a PyTorch CUDA tensor
        n = (1 << 20) + 4093
        ans = self.src.ask(cmd="extract_cuda", obj="obj-7", nbytes=n)
        meta = pickle.loads(base64.b64decode(ans["meta"]))
        self.assertEqual(meta.tensor_device, "cuda")
        cu.init(0)
        block = cu.alloc(n + 8192)
        self.addCleanup(cu.free, block)
        target = StandInCudaTensor(block, 777, n)
        got = self.dst.recv_multiple_tensors("obj-7", meta, None, target_buffers=[target])
        self.assertIs(got[0], target)
        self.assertEqual(hashlib.sha256(cu.dtoh(block + 777, n)).hexdigest(), ans["sha"][0])
        # garbage collection drops the source's IPC registration too: nothing is left there
        self.assertEqual(self.src.ask(cmd="gc", obj="obj-7"), {"regions": 0, "operations": 0})


if __name__ == "__main__":
    main()
