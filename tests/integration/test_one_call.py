# SPDX-License-Identifier: Apache-2.0
"""One-call transfers: BeginRead/BeginWrite with `wait` answer with the operation's final state, in
one round trip. Random bytes compared, TCP and LOCAL; a failed transfer is an OK call whose
Operation says ERRORED; a call whose client deadline comes first ends without stopping the
operation; a client that goes away mid-wait leaves the operation to finish."""
import os
import time

import grpc
from harness import SLOW, SidecarTest, desc, main, pb


class OneCallTest(SidecarTest):
    def pair(self):
        keys = self.key_file()
        return self.sidecar("a", key_file=keys), self.sidecar("b", key_file=keys)

    def readable(self, s, size, data=None):
        r = s.create_region(size + 8192)
        data = data or os.urandom(size)
        s.fill(r, 4097, data)
        op = s.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(r, 4097, size)], timeout_ms=30000),
                                   timeout=10)
        return op, data

    def test_read_and_write_in_one_call(self):
        a, b = self.pair()
        for size in (1, 4095, (5 << 20) + 3):
            for src, dst, backend in ((a, b, pb.BACKEND_TCP), (a, a, pb.BACKEND_LOCAL)):
                op, data = self.readable(src, size)
                r = dst.create_region(size + 100)
                done = dst.stub.BeginRead(pb.BeginTransferRequest(metadata=op.metadata,
                                                                  descriptors=[desc(r, 33, size)],
                                                                  timeout_ms=30000, wait=True), timeout=60)
                self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
                self.assertEqual(done.backend, backend)
                self.assertEqual(done.bytes_done, size)
                self.assertEqual(dst.peek(r, 33, size), data)
                # WRITE into a writable, one call too.
                w = src.create_region(size + 50)
                wop = src.stub.CreateWritable(pb.CreatePassiveRequest(descriptors=[desc(w, 7, size)],
                                                                      timeout_ms=30000), timeout=10)
                payload = os.urandom(size)
                dst.fill(r, 33, payload)
                done = dst.stub.BeginWrite(pb.BeginTransferRequest(metadata=wop.metadata,
                                                                   descriptors=[desc(r, 33, size)],
                                                                   timeout_ms=30000, wait=True), timeout=60)
                self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
                self.assertEqual(src.peek(w, 7, size), payload)

    def test_failed_transfer_is_an_ok_call_saying_errored(self):
        a, b = self.pair()
        op, _ = self.readable(a, 4096)
        r = b.create_region(4096)
        req = pb.BeginTransferRequest(metadata=op.metadata, descriptors=[desc(r, 0, 4096)], timeout_ms=30000,
                                      wait=True)
        first = b.stub.BeginRead(req, timeout=30)
        self.assertEqual(first.status, pb.OPERATION_STATUS_COMPLETE)
        b.fill(r, 0, b"\x55" * 4096)
        replay = b.stub.BeginRead(req, timeout=30)  # the single use is spent
        self.assertEqual(replay.status, pb.OPERATION_STATUS_ERRORED)
        self.assertEqual(replay.error.code, grpc.StatusCode.FAILED_PRECONDITION.value[0], replay.error.message)
        self.assertIn("already used", replay.error.message)
        self.assertEqual(b.peek(r, 0, 4096), b"\x55" * 4096)
        # Errors found before an operation exists stay the call's status.
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, b.stub.BeginRead,
                            pb.BeginTransferRequest(metadata="rsm1.garbage", descriptors=[desc(r, 0, 1)], wait=True),
                            timeout=10)

    def test_client_deadline_first_leaves_the_operation_running(self):
        a, b = self.pair()
        op, data = self.readable(a, 70000)
        r = b.create_region(70000)
        req = pb.BeginTransferRequest(metadata=op.metadata, descriptors=[desc(r, 0, 70000)], timeout_ms=30000,
                                      wait=True, requirement=pb.TransferRequirement(request_id="req-1", iteration=3))
        t = time.monotonic()
        try:
            got = b.stub.BeginRead(req, timeout=1.0 * SLOW)
            self.assertEqual(got.status, pb.OPERATION_STATUS_SCHEDULED)
            op_id = got.operation_id
        except grpc.RpcError as e:
            self.assertEqual(e.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
            op_id = None
        self.assertLess(time.monotonic() - t, 5 * SLOW)
        ops = b.stub.ListOperations(pb.ListOperationsRequest(), timeout=10).operations
        active = [o for o in ops if o.kind == pb.OPERATION_KIND_READ]
        self.assertEqual(len(active), 1)
        if op_id:
            self.assertEqual(active[0].operation_id, op_id)
        self.assertEqual(active[0].status, pb.OPERATION_STATUS_SCHEDULED)
        b.stub.ReportProgress(pb.ReportProgressRequest(request_id="req-1", iteration=3, iteration_complete=True),
                              timeout=10)
        done = b.wait(active[0].operation_id, 30000)
        self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
        self.assertEqual(b.peek(r, 0, 70000), data)

    def test_client_gone_mid_wait(self):
        a, b = self.pair()
        futures = []
        regions = []
        for i in range(20):
            op, data = self.readable(a, 3000 + i)
            r = b.create_region(4000)
            regions.append((r, data))
            req = pb.BeginTransferRequest(metadata=op.metadata, descriptors=[desc(r, 0, len(data))],
                                          timeout_ms=30000, wait=True,
                                          requirement=pb.TransferRequirement(request_id="gone", iteration=1))
            futures.append(b.stub.BeginRead.future(req, timeout=30))
        time.sleep(0.3 * SLOW)
        for f in futures:
            f.cancel()
        b.stub.ReportProgress(pb.ReportProgressRequest(request_id="gone", iteration=1, iteration_complete=True),
                              timeout=10)
        deadline = time.monotonic() + 20 * SLOW
        while time.monotonic() < deadline:
            ops = b.stub.ListOperations(pb.ListOperationsRequest(), timeout=10).operations
            if all(o.status == pb.OPERATION_STATUS_COMPLETE for o in ops if o.kind == pb.OPERATION_KIND_READ):
                break
            time.sleep(0.05)
        reads = [o for o in b.stub.ListOperations(pb.ListOperationsRequest(), timeout=10).operations
                 if o.kind == pb.OPERATION_KIND_READ]
        self.assertEqual(len(reads), 20)
        self.assertTrue(all(o.status == pb.OPERATION_STATUS_COMPLETE for o in reads))
        for r, data in regions:
            self.assertEqual(b.peek(r, 0, len(data)), data)


if __name__ == "__main__":
    main()
