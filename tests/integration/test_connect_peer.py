# SPDX-License-Identifier: Apache-2.0
"""ConnectPeer (issue 24's warm-up): a worker sets up the connections to a peer sidecar from
metadata it holds, before the first transfer. TCP: the authenticated data connections are dialled
and pooled (a second call finds them open), the metadata is not used up, and the transfer that
follows moves random bytes intact. Errors change nothing and say why: empty or forged metadata,
metadata signed with a key this sidecar does not hold, a peer that never answers (stopped: the
call ends at its timeout), a peer that is gone."""
import os
import threading
import time

import grpc
from harness import SLOW, SidecarTest, desc, main, pb, wait_until


class ConnectPeerTest(SidecarTest):
    def pair(self):
        keys = self.key_file()
        return self.sidecar("a", key_file=keys), self.sidecar("b", key_file=keys)

    def readable(self, s, size):
        r = s.create_region(size + 8192)
        data = os.urandom(size)
        s.fill(r, 4097, data)
        op = s.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(r, 4097, size)], timeout_ms=30000),
                                   timeout=10 * SLOW)
        return op, data

    def connect(self, s, metadata, timeout_ms=10000):
        return s.stub.ConnectPeer(pb.ConnectPeerRequest(metadata=metadata, timeout_ms=timeout_ms),
                                  timeout=30 * SLOW)

    def test_connections_ready_before_the_first_transfer(self):
        a, b = self.pair()
        op, data = self.readable(b, 70001)
        got = self.connect(a, op.metadata)
        self.assertEqual(got.peer, "b")
        self.assertEqual([(p.backend, p.ready) for p in got.paths], [(pb.BACKEND_TCP, True)], got)
        self.assertRegex(got.paths[0].detail, r"^\d+ connection\(s\) to b at 127\.0\.0\.1:\d+ \(0 were open already\)$")
        self.assertGreater(got.paths[0].elapsed_us, 0)
        again = self.connect(a, op.metadata)
        self.assertNotIn("(0 were open already)", again.paths[0].detail, again)
        # Not used up: the readable still has its use, and the read that follows moves the bytes.
        left = b.stub.GetOperation(pb.GetOperationRequest(operation_id=op.operation_id), timeout=10 * SLOW)
        self.assertEqual(left.uses_left, 1)
        r = a.create_region(70001 + 10)
        done = a.stub.BeginRead(pb.BeginTransferRequest(metadata=op.metadata, descriptors=[desc(r, 9, 70001)],
                                                        timeout_ms=30000, wait=True), timeout=60 * SLOW)
        self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
        self.assertEqual(a.peek(r, 9, 70001), data)

    def test_bad_metadata_is_refused(self):
        a, b = self.pair()
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, self.connect, a, "", contains="metadata is empty")
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, self.connect, a, "rsm1.garbage")
        other = self.sidecar("c", key_file=self.key_file("other", [("k9", os.urandom(32))]))
        op, _ = self.readable(other, 10)
        self.assertRpcError(grpc.StatusCode.UNAUTHENTICATED, self.connect, a, op.metadata)

    def test_unreachable_peers(self):
        a, b = self.pair()
        op, _ = self.readable(b, 10)
        b.pause()  # accepts the TCP connection in the kernel, never answers the hello
        t = time.monotonic()
        self.assertRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, self.connect, a, op.metadata, 500)
        self.assertLess(time.monotonic() - t, 5 * SLOW)
        b.kill()
        self._procs.remove(b)
        e = self.assertRpcError(grpc.StatusCode.UNAVAILABLE, self.connect, a, op.metadata, 2000)
        self.assertIn("cannot reach peer sidecar", e.details())

    def received(self, sub, pub, count):
        """pub publishes `count` readables on a subject sub subscribes to; returns their ops."""
        got, ops = [], []
        stream = sub.stub.SubscribeMetadata(pb.SubscribeMetadataRequest(subject="kv.>"), timeout=60 * SLOW)

        def read():
            for ev in stream:
                got.append(ev)
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        end = time.monotonic() + 15 * SLOW
        while len(got) < count and time.monotonic() < end:
            if len(ops) < count or not got:
                op, _ = self.readable(pub, 100)
                ops.append(op)
                pub.stub.PublishMetadata(pb.PublishMetadataRequest(subject="kv.%d" % len(ops),
                                                                   operation_id=op.operation_id), timeout=10 * SLOW)
            time.sleep(0.2)
        stream.cancel()
        self.assertGreaterEqual(len(got), count, "metadata did not arrive over NATS")
        return ops

    def test_metadata_over_nats_warms_the_issuer(self):
        n = self.nats()
        keys = self.key_file()
        a = self.sidecar("a", key_file=keys, nats_url=n.url)
        b = self.sidecar("b", key_file=keys, nats_url=n.url)
        c = self.sidecar("c", key_file=keys, nats_url=n.url, extra=["--no-warm-peers"])
        self.received(a, b, 3)
        line = "ConnectPeer b over tcp: "
        wait_until(lambda: line in a.read_log(), 10 * SLOW, "a to warm up its connections to b")
        time.sleep(0.5)
        self.assertEqual(a.read_log().count(line), 1, "warmed b more than once")
        self.received(c, b, 1)
        time.sleep(1.0)
        self.assertNotIn("ConnectPeer", c.read_log())

    def test_connections_the_peer_closed_do_not_linger(self):
        """The pool's reaper closes idle connections the peer closed, by a timer, not on the next
        dial: no socket of a's stays in CLOSE-WAIT towards b once b is gone (issue 25)."""
        a, b = self.pair()
        op, _ = self.readable(b, 100)
        got = self.connect(a, op.metadata)
        self.assertTrue(got.paths[0].ready, got)
        bport = int(b.info().data_endpoints[0].rsplit(":", 1)[1])

        def close_wait():
            n = 0
            for table in ("/proc/net/tcp", "/proc/net/tcp6"):
                with open(table) as f:
                    for line in f.readlines()[1:]:
                        fields = line.split()
                        if fields[3] == "08" and int(fields[2].rsplit(":", 1)[1], 16) == bport:
                            n += 1
            return n
        b.stop()
        self._procs.remove(b)
        time.sleep(0.3)
        wait_until(lambda: close_wait() == 0, 5 * SLOW, "a's pooled connections to the stopped b to close")


if __name__ == "__main__":
    main()
