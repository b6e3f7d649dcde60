# SPDX-License-Identifier: Apache-2.0
"""A subset of the integration tests, run by scripts/test.sh with every sidecar under valgrind
(SC_WRAPPER="valgrind --error-exitcode=99 ..."): a sidecar that valgrind finds errors or definite
leaks in exits 99, which fails its test in tearDown. Not named test_*.py: ctest does not run it
bare."""
import os
import random

import sys

import grpc

# The Python package's source (test_fast_path's workers), ahead of the generated stubs' copy.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))
from harness import SidecarTest, desc, main, pb  # noqa: E402
import test_fast_path  # noqa: E402
import test_fast_path_c  # noqa: E402
import test_fast_hostile  # noqa: E402
import test_faults  # noqa: E402
import test_transfers  # noqa: E402
import test_truncated_regions  # noqa: E402

FaultTest = test_faults.FaultTest.__dict__
TransferTest = test_transfers.TransferTest.__dict__


class ValgrindSubset(SidecarTest):
    def test_gpu_regions_staged_and_local(self):
        # On the stand-in CUDA driver: the sidecar's GPU staging and driver copies under valgrind.
        fake = os.environ.get("SC_FAKE_CUDA", "")
        if not fake or not os.path.exists(fake):
            self.skipTest("the stand-in CUDA driver was not built")
        os.environ["SC_TEST_CUDA_DRIVER"] = fake
        import test_gpu_regions as g
        t = g.GpuRegionTest.__dict__
        keys = self.key_file()
        env = {"SC_TEST_CUDA_DRIVER": fake, "FAKE_CUDA_SHM_DIR": os.environ["FAKE_CUDA_SHM_DIR"]}
        a = self.sidecar("ga", key_file=keys, env=env)
        b = self.sidecar("gb", key_file=keys, env=env)
        self.rnd = random.Random(7)
        for direction in ("read", "write"):
            t["transfer"](self, a, [g.GpuMem(a, 5 << 20), g.HostMem(a, 5000)], b,
                          [g.GpuMem(b, 5 << 20), g.GpuMem(b, 4097)], [(5 << 20) - 3, 4097], direction)
            t["transfer"](self, a, [g.GpuMem(a, 3 << 20)], a, [g.GpuMem(a, 3 << 20)], [(3 << 20) - 1],
                          direction)

    def test_fast_path_ring(self):
        # The fast path's sessions, rings and runs under valgrind, driven by the C client
        # (sc-fast-path-test: every shape, 16 at once, the refusals).
        keys = self.key_file()
        a = self.sidecar("fa", key_file=keys)
        b = self.sidecar("fb", key_file=keys)
        test_fast_path_c.FastPathCTest.run_program(self, a, b, "ring")

    def test_service_basics(self):
        s = self.sidecar("v1")
        self.assertEqual(s.info().sidecar_id, "v1")
        self.assertRpcError(grpc.StatusCode.UNIMPLEMENTED, s.channel.unary_unary("/x.Y/Z"), b"", timeout=30)
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT,
                            s.channel.unary_unary("/rdma_sidecar.v1.Sidecar/CreateRegion"), b"\xff\xff", timeout=30)
        r = s.create_region(100000)
        data = os.urandom(99999)
        s.stub.WriteRegion(iter([pb.WriteRegionRequest(region_id=r.region_id, offset=1, data=data)]), timeout=30)
        got = b"".join(m.data for m in s.stub.ReadRegion(
            pb.ReadRegionRequest(region_id=r.region_id, offset=1, length=99999), timeout=30))
        self.assertEqual(got, data)

    def test_transfers_and_faults(self):
        keys = self.key_file()
        a, b = self.sidecar("a", key_file=keys), self.sidecar("b", key_file=keys)
        move = TransferTest["move"]
        for direction in ("read", "write"):
            move(self, a, b, (1 << 20) + 7, 3, direction, pb.BACKEND_TCP)
            move(self, a, a, 4095, 2, direction, pb.BACKEND_LOCAL)
        # replay, cancel, bad metadata, deregister with force
        r, _, ro = FaultTest["readable"](self, a, 4096)
        rb = b.create_region(4096)
        op = FaultTest["begin_read"](self, b, ro.metadata, rb, 4096)
        self.assertEqual(b.wait(op.operation_id).status, pb.OPERATION_STATUS_COMPLETE)
        again = FaultTest["begin_read"](self, b, ro.metadata, rb, 4096)
        self.assertEqual(b.wait(again.operation_id).status, pb.OPERATION_STATUS_ERRORED)
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, FaultTest["begin_read"], self, b, "rsm1.garbage", rb, 4096)
        _, _, ro2 = FaultTest["readable"](self, a, 4096)
        a.stub.CancelOperation(pb.CancelOperationRequest(operation_id=ro2.operation_id), timeout=30)
        _, _, ro3 = FaultTest["readable"](self, a, 4096)
        a.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=ro3.descriptors[0].region_id, force=True),
                                timeout=30)
        w = b.stub.WatchOperation(pb.WatchOperationRequest(operation_id=op.operation_id), timeout=30)
        self.assertEqual(list(w)[-1].status, pb.OPERATION_STATUS_COMPLETE)

    # state the borrowed helpers expect
    rnd = random.Random(11)


# Hostile workers against the fast path's session code (garbage entries and messages, a broken
# ring, a worker killed with runs in flight): its error paths under valgrind.
FAST_PATH_UNDER_VALGRIND = ("test_random_sqes_and_garbage_prepare", "test_impossible_sq_tail_ends_only_that_session",
                            "test_killed_worker_leaves_nothing", "test_cancel_and_deadline_of_a_small_run")


class FastPathHostile(test_fast_path.FastPathTest):
    pass


for _name in dir(test_fast_path.FastPathTest):
    if _name.startswith("test_") and _name not in FAST_PATH_UNDER_VALGRIND:
        setattr(FastPathHostile, _name, None)  # unittest runs only the callable ones


def only(cls, names):
    """A subclass of a test case that runs only the named tests (unittest runs callable ones)."""
    sub = type(cls.__name__ + "UnderValgrind", (cls,), {})
    for name in dir(cls):
        if name.startswith("test_") and name not in names:
            setattr(sub, name, None)
    return sub


# Issue 32's boundaries under valgrind: a worker that makes the doorbells blocking or steals their
# rings, and an impossible cq_head; regions truncated under TCP and LOCAL transfers (the fault guard's
# recovery from SIGBUS). Peer TLS's bounce buffer runs under ASan: under valgrind on a loaded machine
# its handshake outlasts the 3 s a data port gives a new connection.
FastHostileUnderValgrind = only(test_fast_hostile.FastHostileTest,
                                ("test_blocking_completion_doorbell", "test_stolen_submission_rings",
                                 "test_impossible_cq_head_ends_the_session"))
TruncatedUnderValgrind = only(test_truncated_regions.Matrix, ("test_tcp", "test_local"))

if __name__ == "__main__":
    main()
