# SPDX-License-Identifier: Apache-2.0
"""A transfer that moves to another path (the active side's ibverbs path failed, the same transfer
goes on over tcp: DONE with status ABORTED, then OPEN again with the same transfer id), seen from
the passive side with a hand-written peer (peer_client.py): the operation stays IN_PROGRESS and
says who moved it and why, the same transfer id OPENs again on a new connection, its READV returns
the exposed bytes and its DONE completes the operation; another transfer id is still refused (the
metadata's single use is not given back), and an ABORTED for an operation that has ended changes
nothing."""
import os
import random

from harness import SidecarTest, desc, main, pb
from peer_client import DONE, OK, PEER_READ, Peer, PeerError, metadata_token
import struct

KEY = os.urandom(32)
ABORTED, FAILED_PRECONDITION = 10, 9


class PathMoveTest(SidecarTest):
    def setUp(self):
        super().setUp()
        self.a = self.sidecar("a", key_file=self.key_file(keys=[("k1", KEY)]))
        host, port = self.a.info().data_endpoints[0].rsplit(":", 1)
        self.addr = (host, int(port))

    def peer(self):
        return Peer(*self.addr, "k1", KEY, client_id="b")

    def done(self, p, token, xfer_id, code, text):
        t = text.encode()
        p.send(DONE, token + struct.pack("<QIH", xfer_id, code, len(t)) + t)
        return p.recv_frame()

    def readable(self, size):
        r = self.a.create_region(size + 1000)
        data = os.urandom(size)
        self.a.fill(r, 333, data)
        op = self.a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(r, 333, size)], timeout_ms=30000),
                                        timeout=10)
        return op, data

    def get(self, op):
        return self.a.stub.GetOperation(pb.GetOperationRequest(operation_id=op.operation_id), timeout=10)

    def test_aborted_attempt_then_the_same_transfer_completes(self):
        size = 100003
        op, data = self.readable(size)
        token = metadata_token(op.metadata)
        xid = random.getrandbits(64)
        first = self.peer()
        first.open(token, xid, PEER_READ, size)
        typ, body = self.done(first, token, xid, ABORTED, "ibverbs path stalled (test)")
        Peer.check(typ, body, OK)
        first.sock.close()
        got = self.get(op)
        self.assertEqual(got.status, pb.OPERATION_STATUS_IN_PROGRESS, got.error.message)
        self.assertIn("peer b moved the transfer to tcp: ibverbs path stalled (test)", got.backend_reason)
        self.assertEqual(got.backend, pb.BACKEND_TCP)
        # Another transfer id: the single use is taken.
        other = self.peer()
        with self.assertRaises(PeerError) as cm:
            other.open(token, xid ^ 1, PEER_READ, size)
        self.assertEqual(cm.exception.code, FAILED_PRECONDITION)
        self.assertIn("already used", cm.exception.text)
        # The same transfer on a fresh connection: OPEN, READV, DONE.
        second = self.peer()
        second.open(token, xid, PEER_READ, size)
        n = second.readv_start(token, xid, [(0, 0, size)])
        self.assertEqual(n, size)
        self.assertEqual(second.recv_exact(n), data)
        typ, body = self.done(second, token, xid, 0, "")
        Peer.check(typ, body, OK)
        got = self.get(op)
        self.assertEqual(got.status, pb.OPERATION_STATUS_COMPLETE, got.error.message)
        self.assertEqual(got.bytes_done, size)

    def test_aborted_after_the_end_changes_nothing(self):
        op, _ = self.readable(10)
        token = metadata_token(op.metadata)
        xid = random.getrandbits(64)
        p = self.peer()
        p.open(token, xid, PEER_READ, 10)
        self.a.stub.CancelOperation(pb.CancelOperationRequest(operation_id=op.operation_id), timeout=10)
        typ, body = self.done(self.peer(), token, xid, ABORTED, "late")
        with self.assertRaises(PeerError):
            Peer.check(typ, body, OK)
        self.assertEqual(self.get(op).status, pb.OPERATION_STATUS_CANCELLED)


if __name__ == "__main__":
    main()
