# SPDX-License-Identifier: Apache-2.0
"""CancelOperation answers within about a second (--cancel-wait, 1 s) in every state of an active
TCP operation whose peer sidecar is stopped (SIGSTOP), so nothing it does can help:

| state when cancelled                                   | answer                          |
| ------------------------------------------------------ | ------------------------------- |
| queued (SCHEDULED, waiting for ReportProgress)          | CANCELLED                       |
| dialling (the stopped peer never answers the hello)     | CANCELLED                       |
| moving (OPEN and data requests out, no reply comes)     | CANCELLED, memory quiet         |
| committed (the pipelined DONE {OK} went out)            | CANCELLED, memory quiet         |

A committed transfer is cut too (the worker's memory must be quiet when CANCELLED is answered); the
passive side, told DONE {OK} before the cancel, may still report COMPLETE. Also: --cancel-wait 0
answers at once, and a bad --cancel-wait is refused at start-up with a clear message.
The slowness is made by construction (a stopped process), never by a size guessed to be slow."""
import os
import signal
import subprocess
import time

import grpc
from harness import BINARY, SLOW, SidecarTest, desc, main, pb, wait_until

MiB = 1 << 20
BOUND = 1.0 * SLOW + 1.5  # --cancel-wait (scaled by the harness when SLOW > 1) plus the call's own time


class CancelBoundTest(SidecarTest):
    def pair(self, tag="", extra=()):
        keys = self.key_file("keys" + tag)
        return (self.sidecar("a" + tag, key_file=keys, extra=extra),
                self.sidecar("b" + tag, key_file=keys, extra=extra))

    def setUp(self):
        super().setUp()
        self.stopped = []

    def tearDown(self):
        for side in self.stopped:  # before the harness stops them: a stopped process ignores SIGTERM
            self.resume(side)
        super().tearDown()

    def stop_peer(self, side):
        self.stopped.append(side)
        side.pause()

    def resume(self, side):
        if side.proc.poll() is None:
            side.proc.send_signal(signal.SIGCONT)

    def passive(self, side, kind, size):
        r = side.create_region(size + 4096)
        data = os.urandom(size)
        side.fill(r, 4095, data)
        create = side.stub.CreateReadable if kind == "read" else side.stub.CreateWritable
        op = create(pb.CreatePassiveRequest(descriptors=[desc(r, 4095, size)], timeout_ms=60000), timeout=10)
        return op, r, data

    def begin(self, side, kind, md, size, **kw):
        r = side.create_region(size + 100)
        data = os.urandom(size)
        side.fill(r, 99, data)
        fn = side.stub.BeginRead if kind == "read" else side.stub.BeginWrite
        op = fn(pb.BeginTransferRequest(metadata=md, descriptors=[desc(r, 99, size)], timeout_ms=60000, **kw),
                timeout=10 * SLOW)
        return op, r, data

    def cancel(self, side, op_id):
        """CancelOperation; returns (Operation or RpcError, seconds it took)."""
        t0 = time.monotonic()
        try:
            got = side.stub.CancelOperation(pb.CancelOperationRequest(operation_id=op_id), timeout=60)
        except grpc.RpcError as e:
            got = e
        took = time.monotonic() - t0
        self.assertLess(took, BOUND, "CancelOperation took %.2f s" % took)
        return got, took

    def warm(self, a, b):
        """A transfer a -> b, so b holds authenticated pooled connections to a."""
        po, _, data = self.passive(a, "read", 4096)
        op, r, _ = self.begin(b, "read", po.metadata, 4096, wait=True)
        self.assertEqual(op.status, pb.OPERATION_STATUS_COMPLETE, op.error.message)

    def assert_quiet(self, side, region, offset, size):
        """No byte of the region changes any more (the cancelled transfer left the memory alone)."""
        first = side.peek(region, offset, size)
        time.sleep(0.3)
        self.assertEqual(side.peek(region, offset, size), first, "bytes landed after CANCELLED")

    def test_queued(self):
        a, b = self.pair()
        po, _, _ = self.passive(a, "read", 4096)
        self.stop_peer(a)
        op, _, _ = self.begin(b, "read", po.metadata, 4096,
                              requirement=pb.TransferRequirement(request_id="r1", iteration=5))
        self.assertEqual(op.status, pb.OPERATION_STATUS_SCHEDULED)
        got, took = self.cancel(b, op.operation_id)
        self.assertEqual(got.status, pb.OPERATION_STATUS_CANCELLED, got)
        print("  queued: CANCELLED in %.3f s" % took)

    def test_dialling(self):
        for kind in ("read", "write"):
            with self.subTest(kind=kind):
                a, b = self.pair("-" + kind)
                po, pr, pdata = self.passive(a, kind, MiB)
                self.stop_peer(a)  # b has no connection to a yet: its hello is never answered
                op, r, data = self.begin(b, kind, po.metadata, MiB)
                time.sleep(0.3)
                self.assertEqual(b.wait(op.operation_id, 0).status, pb.OPERATION_STATUS_IN_PROGRESS)
                got, took = self.cancel(b, op.operation_id)
                self.assertEqual(got.status, pb.OPERATION_STATUS_CANCELLED, got)
                self.assertEqual(got.error.code, grpc.StatusCode.CANCELLED.value[0], got.error.message)
                self.resume(a)
                self.assertEqual(a.peek(pr, 4095, MiB), pdata)
                print("  dialling (%s): CANCELLED in %.3f s" % (kind, took))

    def test_moving(self):
        for kind, size in (("read", 64 * MiB), ("write", 256 * MiB)):
            with self.subTest(kind=kind):
                a, b = self.pair("-" + kind)
                self.warm(a, b)
                po, _, _ = self.passive(a, kind, size)
                self.stop_peer(a)
                op, r, data = self.begin(b, kind, po.metadata, size)
                time.sleep(0.3)
                now = b.wait(op.operation_id, 0)
                self.assertEqual(now.status, pb.OPERATION_STATUS_IN_PROGRESS, now.error.message)
                got, took = self.cancel(b, op.operation_id)
                self.assertEqual(got.status, pb.OPERATION_STATUS_CANCELLED, got)
                self.assertLess(got.bytes_done, size)
                self.assert_quiet(b, r, 99, size)
                print("  moving (%s, %d MiB): CANCELLED in %.3f s at %d bytes"
                      % (kind, size // MiB, took, got.bytes_done))

    def test_committed(self):
        a, b = self.pair()
        self.warm(a, b)
        po, pr, pdata = self.passive(a, "read", 4096)
        before = os.urandom(4096)
        self.stop_peer(a)
        op, r, _ = self.begin(b, "read", po.metadata, 4096)
        b.fill(r, 99, before)
        # One request of one stream: OPEN, READ and the pipelined DONE {OK} leave together, and
        # the operation says it is committed once they are out.
        wait_until(lambda: b.wait(op.operation_id, 0).committed, 10, "the transfer to commit")
        got, took = self.cancel(b, op.operation_id)
        # A cancel cuts even a committed transfer: the worker's memory is its own again.
        self.assertNotIsInstance(got, grpc.RpcError, "a committed transfer was answered %s" % got)
        self.assertEqual(got.status, pb.OPERATION_STATUS_CANCELLED, got)
        self.assertFalse(got.committed)
        self.assertLess(took, 1.0 * SLOW, "a committed cancel should answer within a second")
        print("  committed: CANCELLED in %.3f s" % took)
        self.resume(a)
        # The stopped peer was told DONE {OK} before the cancel: once it runs, it serves the READ
        # into a cut connection. Either it judges the DONE (COMPLETE: its bytes went out) or sees
        # the connection end first (ERRORED); both sides end, and the reader's bytes stay put.
        pa = a.wait(po.operation_id, 30000)
        self.assertIn(pa.status, (pb.OPERATION_STATUS_COMPLETE, pb.OPERATION_STATUS_ERRORED), pa)
        self.assertEqual(b.peek(r, 99, 4096), before, "bytes landed after CANCELLED")
        self.assertEqual(b.wait(op.operation_id, 0).status, pb.OPERATION_STATUS_CANCELLED)
        print("  committed: the passive side ended %s" % pb.OperationStatus.Name(pa.status))

    def test_cancel_wait_zero_and_bad_values(self):
        a, b = self.pair(extra=["--cancel-wait", "0"])
        self.warm(a, b)
        po, _, _ = self.passive(a, "read", 64 * MiB)
        self.stop_peer(a)
        op, _, _ = self.begin(b, "read", po.metadata, 64 * MiB)
        time.sleep(0.3)
        got, took = self.cancel(b, op.operation_id)
        if isinstance(got, grpc.RpcError):  # answered at once, before the backend stopped
            self.assertEqual(got.code(), grpc.StatusCode.FAILED_PRECONDITION, got.details())
            self.assertIn("being cancelled", got.details())
        self.assertEqual(b.wait(op.operation_id, 10000).status, pb.OPERATION_STATUS_CANCELLED)
        for bad in ("31s", "-1", "soon"):
            r = subprocess.run([BINARY, "--cancel-wait", bad, "--id", "x"], capture_output=True, text=True,
                               timeout=30 * SLOW)
            self.assertNotEqual(r.returncode, 0, bad)
            self.assertIn("--cancel-wait", r.stderr + r.stdout)
        h = subprocess.run([BINARY, "--help"], capture_output=True, text=True, timeout=30 * SLOW)
        self.assertIn("--cancel-wait", h.stdout)


if __name__ == "__main__":
    main()
