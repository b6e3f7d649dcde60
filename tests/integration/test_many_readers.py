# SPDX-License-Identifier: Apache-2.0
"""One readable, many readers (issue 25): a readable created for many uses, or for any number of
uses until its deadline, is read by many transfers at once from several sidecars, each use checked
and counted. Random bytes compared for every reader; Operation reports uses_done and bytes_served;
a counted readable completes with its last use and refuses the next; an any-uses readable goes on
when one reader fails or vanishes (a hand-written peer that OPENs and disconnects), completes at
its deadline, and refuses reads after it; max_uses above the limit is refused with the limit."""
import os
import random
import threading
import time

import grpc
from harness import SLOW, SidecarTest, desc, main, pb, wait_until
from peer_client import PEER_READ, Peer, metadata_token

KEY = os.urandom(32)
MiB = 1 << 20


class ManyReadersTest(SidecarTest):
    def setUp(self):
        super().setUp()
        keys = self.key_file(keys=[("k1", KEY)])
        self.src = self.sidecar("src", key_file=keys)
        self.readers = [self.sidecar("r%d" % i, key_file=keys) for i in range(4)]

    def readable(self, size, **kw):
        r = self.src.create_region(size + 4096)
        data = os.urandom(size)
        self.src.fill(r, 4095, data)
        op = self.src.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(r, 4095, size)], **kw),
                                          timeout=10 * SLOW)
        return op, data

    def read_all(self, metadata, size, per_sidecar):
        """per_sidecar concurrent reads on each reader sidecar; returns (final ops, failures)."""
        results, errors = [], []
        lock = threading.Lock()

        def one(s, region, off):
            try:
                done = s.stub.BeginRead(pb.BeginTransferRequest(metadata=metadata, descriptors=[desc(region, off, size)],
                                                                timeout_ms=120000, wait=True), timeout=180 * SLOW)
                got = s.peek(region, off, size) if done.status == pb.OPERATION_STATUS_COMPLETE else None
                with lock:
                    results.append((done, got))
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append(repr(e))
        threads = []
        for s in self.readers:
            region = s.create_region(per_sidecar * (size + 7))
            for k in range(per_sidecar):
                threads.append(threading.Thread(target=one, args=(s, region, k * (size + 7) + 3)))
        for t in threads:
            t.start()
        for t in threads:
            t.join(240 * SLOW)
        self.assertEqual(errors, [])
        return results

    def get(self, op):
        return self.src.stub.GetOperation(pb.GetOperationRequest(operation_id=op.operation_id), timeout=10 * SLOW)

    def test_256_counted_uses(self):
        size = MiB + 11
        op, data = self.readable(size, max_uses=256, timeout_ms=120000)
        self.assertEqual(op.uses_left, 256)
        results = self.read_all(op.metadata, size, 64)
        self.assertEqual(len(results), 256)
        bad = [d.error.message for d, got in results if d.status != pb.OPERATION_STATUS_COMPLETE or got != data]
        self.assertEqual(bad, [])
        end = self.src.wait(op.operation_id, 30000)
        self.assertEqual(end.status, pb.OPERATION_STATUS_COMPLETE, end.error.message)
        self.assertEqual((end.uses_done, end.uses_left, end.bytes_served), (256, 0, 256 * size))
        r = self.readers[0].create_region(size)
        late = self.readers[0].stub.BeginRead(pb.BeginTransferRequest(metadata=op.metadata, descriptors=[desc(r, 0, size)],
                                                                      timeout_ms=30000, wait=True), timeout=60)
        self.assertEqual(late.status, pb.OPERATION_STATUS_ERRORED)
        self.assertIn("already used", late.error.message)
        self.assertIn("(256 of 256 use(s))", late.error.message)

    def test_any_uses_until_the_deadline(self):
        size = 64 * MiB + 5
        op, data = self.readable(size, any_uses=True, timeout_ms=int(60000 * SLOW))
        self.assertEqual(op.uses_left, 4294967295)
        # A reader that OPENs and vanishes fails alone.
        host, port = self.src.info().data_endpoints[0].rsplit(":", 1)
        p = Peer(host, int(port), "k1", KEY, client_id="vanishing")
        p.open(metadata_token(op.metadata), random.getrandbits(64), PEER_READ, size)
        p.sock.close()
        wait_until(lambda: "failed (1 failed, 0 done so far; the operation goes on)" in self.src.read_log(),
                   15 * SLOW, "the vanished reader's use to fail")
        self.assertEqual(self.get(op).status, pb.OPERATION_STATUS_IN_PROGRESS)
        results = self.read_all(op.metadata, size, 4)
        self.assertEqual(len(results), 16)
        bad = [d.error.message for d, got in results if d.status != pb.OPERATION_STATUS_COMPLETE or got != data]
        self.assertEqual(bad, [])
        now = self.get(op)
        self.assertEqual(now.status, pb.OPERATION_STATUS_IN_PROGRESS, now.error.message)
        self.assertEqual((now.uses_done, now.bytes_served, now.uses_left), (16, 16 * size, 4294967295))
        end = self.src.wait(op.operation_id, int(90000 * SLOW))
        self.assertEqual(end.status, pb.OPERATION_STATUS_COMPLETE, end.error.message)
        r = self.readers[0].create_region(size)
        late = self.readers[0].stub.BeginRead(pb.BeginTransferRequest(metadata=op.metadata, descriptors=[desc(r, 0, size)],
                                                                      timeout_ms=30000, wait=True), timeout=60)
        self.assertEqual(late.status, pb.OPERATION_STATUS_ERRORED)

    def test_max_uses_limit(self):
        r = self.src.create_region(100)
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, self.src.stub.CreateReadable,
                            pb.CreatePassiveRequest(descriptors=[desc(r, 0, 10)], max_uses=(1 << 20) + 1),
                            timeout=10, contains="at most 1048576 (any_uses: any number until the deadline)")


if __name__ == "__main__":
    main()
