# SPDX-License-Identifier: Apache-2.0
"""Retention (--retention): a finished operation stays queryable for the retention period after it
ended, then GetOperation, WaitOperation and ReleaseOperation answer NOT_FOUND, and the sidecar says
so at debug level. Judged on the client's own clock so that a paused or busy host cannot make the
test fail: an answer is only required to be found while less than --retention has passed since the
request that ended the operation was sent, and to be gone once more than --retention has passed
since its answer came (polled, with a deadline, as the timer thread may run late on a busy host)."""
import time

import grpc

from harness import SidecarTest, desc, main, pb, wait_until

RETENTION_S = 3


class RetentionTest(SidecarTest):
    def test_queryable_until_retention_then_not_found(self):
        s = self.sidecar("r", extra=["--retention", "%ds" % RETENTION_S])
        region = s.create_region(4096)
        op = s.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(region, 0, 4096)],
                                                           timeout_ms=60000), timeout=10)
        sent = time.monotonic()
        s.stub.CancelOperation(pb.CancelOperationRequest(operation_id=op.operation_id), timeout=10)
        answered = time.monotonic()

        # Found while less than --retention has passed since the cancel was sent (the operation
        # ended after that instant, so its retention cannot have run out yet).
        checks = 0
        while time.monotonic() - sent < RETENTION_S - 0.5:
            try:
                got = s.stub.GetOperation(pb.GetOperationRequest(operation_id=op.operation_id), timeout=10)
            except grpc.RpcError as e:
                late = time.monotonic() - sent
                if late < RETENTION_S:
                    self.fail("GetOperation answered %s (%s) %.2f s after the cancel, within --retention %d s"
                              % (e.code(), e.details(), late, RETENTION_S))
                break
            self.assertEqual(got.status, pb.OPERATION_STATUS_CANCELLED)
            checks += 1
            time.sleep(0.2)
        # WaitOperation on a finished operation answers at once with its end state.
        if time.monotonic() - sent < RETENTION_S - 0.5:
            w = s.wait(op.operation_id, 1000)
            self.assertEqual(w.status, pb.OPERATION_STATUS_CANCELLED)

        # Gone once --retention has passed since the cancel's answer: every call says NOT_FOUND.
        time.sleep(max(0.0, answered + RETENTION_S - time.monotonic()))

        def gone():
            try:
                s.stub.GetOperation(pb.GetOperationRequest(operation_id=op.operation_id), timeout=10)
                return False
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.NOT_FOUND, e.details())
                return e.details()
        msg = wait_until(gone, 15, "the operation to be forgotten after --retention")
        self.assertIn('no operation "%s" (unknown, released, or forgotten after retention)' % op.operation_id, msg)
        for call in (lambda: s.wait(op.operation_id, 100),
                     lambda: s.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=op.operation_id),
                                                     timeout=10)):
            with self.assertRaises(grpc.RpcError) as cm:
                call()
            self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)
        wait_until(lambda: "operation %s forgotten: --retention (%d ms) passed" % (op.operation_id, RETENTION_S * 1000)
                   in s.read_log(), 5, "the debug line that says the operation was forgotten")
        # A released operation is gone at once, retention or not.
        op2 = s.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(region, 0, 4096)],
                                                            timeout_ms=60000), timeout=10)
        s.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=op2.operation_id), timeout=10)
        with self.assertRaises(grpc.RpcError) as cm:
            s.stub.GetOperation(pb.GetOperationRequest(operation_id=op2.operation_id), timeout=10)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)
        print("queried %d times within --retention %d s; NOT_FOUND after" % (checks, RETENTION_S))


if __name__ == "__main__":
    main()
