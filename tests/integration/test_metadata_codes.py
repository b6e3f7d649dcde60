# SPDX-License-Identifier: Apache-2.0
"""The codes the proto documents for metadata at each stage of its life, and the codes a client
really gets: first use, replay, a cancelled passive operation, an expired one (inside the clock-skew
allowance and past it), and a forgotten one; READ and WRITE; over TCP (two sidecars) and LOCAL
(one); in the two-call form (BeginRead/BeginWrite + WaitOperation) and the one-call form (`wait`).

| metadata                          | BeginRead/BeginWrite answers | the operation ends          |
| --------------------------------- | ---------------------------- | --------------------------- |
| fresh                             | OK                           | COMPLETE                    |
| used (replayed)                   | OK                           | ERRORED FAILED_PRECONDITION |
| of a cancelled passive operation  | OK                           | ERRORED FAILED_PRECONDITION |
| passive operation past deadline   | OK (within 5 s skew)         | ERRORED FAILED_PRECONDITION |
| past its expiry + 5 s skew        | FAILED_PRECONDITION          | (no operation)              |
| passive operation released        | OK                           | ERRORED NOT_FOUND           |

Every refused use leaves the destination bytes as they were (random noise compared)."""
import os
import time

import grpc
from harness import SidecarTest, desc, main, pb

SIZE = 5000
FP = grpc.StatusCode.FAILED_PRECONDITION.value[0]
NF = grpc.StatusCode.NOT_FOUND.value[0]


class MetadataCodesTest(SidecarTest):
    def setUp(self):
        super().setUp()
        keys = self.key_file()
        self.a = self.sidecar("a", key_file=keys)
        self.b = self.sidecar("b", key_file=keys)

    def passive(self, side, kind, timeout_ms=30000):
        """A readable (kind READ) or writable (WRITE) of SIZE random bytes at an odd offset."""
        r = side.create_region(SIZE + 100)
        data = os.urandom(SIZE)
        side.fill(r, 17, data)
        create = side.stub.CreateReadable if kind == "read" else side.stub.CreateWritable
        op = create(pb.CreatePassiveRequest(descriptors=[desc(r, 17, SIZE)], timeout_ms=timeout_ms), timeout=10)
        return op, r, data

    def active(self, side, kind, metadata, one_call):
        """Begins the transfer into/from a region of fresh noise; returns (final Operation, region, noise)."""
        r = side.create_region(SIZE + 50)
        noise = os.urandom(SIZE)
        side.fill(r, 3, noise)
        begin = side.stub.BeginRead if kind == "read" else side.stub.BeginWrite
        req = pb.BeginTransferRequest(metadata=metadata, descriptors=[desc(r, 3, SIZE)], timeout_ms=20000,
                                      wait=one_call)
        op = begin(req, timeout=30)
        if not one_call:
            op = side.stub.WaitOperation(pb.WaitOperationRequest(operation_id=op.operation_id, timeout_ms=20000),
                                         timeout=30)
        return op, r, noise

    def assert_refused(self, op, code, contains, side, region, noise):
        self.assertEqual(op.status, pb.OPERATION_STATUS_ERRORED, "%s: %s" % (
            pb.OperationStatus.Name(op.status), op.error.message))
        self.assertEqual(op.error.code, code, op.error.message)
        self.assertIn(contains, op.error.message)
        self.assertIn("fresh metadata", op.error.message)
        self.assertEqual(op.bytes_done, 0)
        if op.kind == pb.OPERATION_KIND_READ:
            self.assertEqual(side.peek(region, 3, SIZE), noise, "a refused read moved bytes")

    def cases(self):
        for kind in ("read", "write"):
            for src, dst, backend in ((self.a, self.b, pb.BACKEND_TCP), (self.a, self.a, pb.BACKEND_LOCAL)):
                for one_call in (False, True):
                    with self.subTest(kind=kind, backend=pb.Backend.Name(backend), one_call=one_call):
                        yield kind, src, dst, backend, one_call

    def test_first_use_then_replay(self):
        for kind, src, dst, backend, one_call in self.cases():
            po, pr, pdata = self.passive(src, kind)
            op, r, noise = self.active(dst, kind, po.metadata, one_call)
            self.assertEqual(op.status, pb.OPERATION_STATUS_COMPLETE, op.error.message)
            self.assertEqual(op.backend, backend)
            if kind == "read":
                self.assertEqual(dst.peek(r, 3, SIZE), pdata)
            else:
                self.assertEqual(src.peek(pr, 17, SIZE), noise)
            written = src.peek(pr, 17, SIZE)
            op, r, noise = self.active(dst, kind, po.metadata, one_call)
            self.assert_refused(op, FP, "already used", dst, r, noise)
            self.assertEqual(src.peek(pr, 17, SIZE), written, "a refused write moved bytes")

    def ended_then_used(self, end, code, contains):
        """The passive operation ended by end(src, operation_id) before anyone used its metadata:
        the use is refused with code, saying `contains`, and moves no byte either way."""
        for kind, src, dst, _, one_call in self.cases():
            po, pr, pdata = self.passive(src, kind)
            end(src, po.operation_id)
            op, r, noise = self.active(dst, kind, po.metadata, one_call)
            self.assert_refused(op, code, contains, dst, r, noise)
            self.assertEqual(src.peek(pr, 17, SIZE), pdata, "a refused write moved bytes")

    def test_cancelled(self):
        def cancel(side, op_id):
            c = side.stub.CancelOperation(pb.CancelOperationRequest(operation_id=op_id), timeout=10)
            self.assertEqual(c.status, pb.OPERATION_STATUS_CANCELLED)
        self.ended_then_used(cancel, FP, "cancelled")

    def test_released_is_not_found(self):
        def release(side, op_id):
            side.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=op_id), timeout=10)
        self.ended_then_used(release, NF, "live operation")

    def test_expired(self):
        # Passive operations with a short deadline; used inside the 5 s skew allowance, then after it.
        made = []
        for kind, src, dst, _, one_call in self.cases():
            po, pr, pdata = self.passive(src, kind, timeout_ms=300)
            w = src.stub.WaitOperation(pb.WaitOperationRequest(operation_id=po.operation_id, timeout_ms=5000),
                                       timeout=10)
            self.assertEqual(w.status, pb.OPERATION_STATUS_ERRORED)
            self.assertEqual(w.error.code, grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
            op, r, noise = self.active(dst, kind, po.metadata, one_call)
            self.assert_refused(op, FP, "expired", dst, r, noise)
            made.append((kind, dst, po.metadata, one_call))
        time.sleep(5.5)  # the metadata's expiry plus the skew allowance (SC_METADATA_SKEW_MS) is past
        for kind, dst, md, one_call in made:
            with self.subTest(kind=kind, one_call=one_call, past_skew=True):
                r = dst.create_region(SIZE)
                begin = dst.stub.BeginRead if kind == "read" else dst.stub.BeginWrite
                self.assertRpcError(grpc.StatusCode.FAILED_PRECONDITION, begin,
                                    pb.BeginTransferRequest(metadata=md, descriptors=[desc(r, 0, SIZE)],
                                                            wait=one_call),
                                    contains="expired", timeout=10)


if __name__ == "__main__":
    main()
