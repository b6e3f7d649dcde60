# SPDX-License-Identifier: Apache-2.0
"""Network partitions between two real sidecars, each in its own network namespace.

The test builds two namespaces joined by a veth pair (10.77.0.1 <-> 10.77.0.2), starts one sidecar
in each (data plane on the veth address, gRPC on a unix socket so the test reaches both), shapes
the link with a token bucket (tbf; the host kernel has no netem) so that a big transfer lasts a few
seconds, and cuts the link with iptables DROP on INPUT in both namespaces (packets vanish both
ways, no RST, no ICMP: what a partition looks like to TCP). Checked: a 2 s partition in the middle
of a READ and of a WRITE with a 30 s deadline ends COMPLETE with every byte equal, or ERRORED with
a message, both sides agreeing; a partition that never heals ends both sides ERRORED within the
deadline plus a bounded margin; after healing a new transfer works (the pooled connections to the
peer are rebuilt). Needs root, `ip netns` and iptables: exits 77 (skipped) otherwise.

Figures printed (look for "figure:"): transfer times, time to detect a dead peer.
"""
import os
import threading
import time

import grpc
from harness import SLOW, SidecarTest, desc, main, pb, wait_until
from netns import NeedsNetns, Net, sh  # noqa: F401

SIZE = int(os.environ.get("SC_PARTITION_MIB", "256")) << 20
RATE = os.environ.get("SC_PARTITION_RATE", "600mbit")  # 256 MiB in about 3.6 s
DEADLINE_MS = 30000
# Past the deadline, how long both sides may take to report ERRORED (the passive side learns of a
# dead peer from its connection: TCP keepalive 5 s + 3 x 2 s, TCP_USER_TIMEOUT 12 s).
MARGIN_S = 15
CODE_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}
TERMINAL = (pb.OPERATION_STATUS_COMPLETE, pb.OPERATION_STATUS_ERRORED, pb.OPERATION_STATUS_CANCELLED)


class PartitionTest(NeedsNetns, SidecarTest):
    def setUp(self):
        super().setUp()
        self.net = Net(RATE)
        self.addCleanup(self.net.close)
        keys = self.key_file()
        self.a, self.b = [self.sidecar(n, key_file=keys, tcp=False, data_listen=addr + ":0",
                                       prefix=("ip", "netns", "exec", ns))
                          for n, ns, addr in zip("ab", self.net.ns, self.net.addr)]
        # One region pair reused by every transfer of a test: a's holds the source of a READ and
        # receives a WRITE, b's the other way round.
        self.ra, self.rb = self.a.create_region(SIZE), self.b.create_region(SIZE)

    def tearDown(self):
        self.net.heal()
        super().tearDown()

    # ---- helpers -----------------------------------------------------------------------------

    def start(self, direction, deadline_ms=DEADLINE_MS, passive_ms=120000):
        """b is the active side: READ pulls a's region into b's, WRITE pushes b's into a's.
        Returns (passive op, active op, source bytes, t0)."""
        data = os.urandom(SIZE)
        src_side, src_region = (self.a, self.ra) if direction == "read" else (self.b, self.rb)
        src_side.fill(src_region, 0, data)
        create = self.a.stub.CreateReadable if direction == "read" else self.a.stub.CreateWritable
        po = create(pb.CreatePassiveRequest(descriptors=[desc(self.ra, 0, SIZE)], timeout_ms=passive_ms),
                    timeout=10 * SLOW)
        begin = self.b.stub.BeginRead if direction == "read" else self.b.stub.BeginWrite
        t0 = time.monotonic()
        ao = begin(pb.BeginTransferRequest(metadata=po.metadata, descriptors=[desc(self.rb, 0, SIZE)],
                                           timeout_ms=deadline_ms), timeout=10 * SLOW)
        return po, ao, data, t0

    def dst_bytes(self, direction):
        return self.b.peek(self.rb, 0, SIZE) if direction == "read" else self.a.peek(self.ra, 0, SIZE)

    def wait_bytes(self, op_id, at_least):
        def moved():
            o = self.b.stub.GetOperation(pb.GetOperationRequest(operation_id=op_id), timeout=5)
            if o.status in TERMINAL:
                self.fail("transfer ended (%s) before the partition could start: raise the size or "
                          "lower SC_PARTITION_RATE" % pb.OperationStatus.Name(o.status))
            return o.bytes_done >= at_least and o
        return wait_until(moved, 30, "%d bytes to move" % at_least)

    def wait_both(self, po, ao, limit_s):
        """Wait for both sides to reach a terminal status; returns (passive, active, seconds)."""
        t0 = time.monotonic()
        res = {}

        def waiter(side, op, key):
            res[key] = side.wait(op.operation_id, int(limit_s * 1000 * SLOW))
            res[key + "_t"] = time.monotonic() - t0
        ts = [threading.Thread(target=waiter, args=(self.a, po, "p")),
              threading.Thread(target=waiter, args=(self.b, ao, "a"))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(limit_s * SLOW + 30)
        self.assertIn("p", res, "no answer from the passive side")
        self.assertIn("a", res, "no answer from the active side")
        return res["p"], res["a"], res["p_t"], res["a_t"]

    def roundtrip(self, direction, size=1 << 20):
        """A small transfer over the (healed) link must work: bytes compared."""
        data = os.urandom(size)
        src_side, src_region = (self.a, self.ra) if direction == "read" else (self.b, self.rb)
        src_side.fill(src_region, 0, data)
        create = self.a.stub.CreateReadable if direction == "read" else self.a.stub.CreateWritable
        po = create(pb.CreatePassiveRequest(descriptors=[desc(self.ra, 0, size)], timeout_ms=30000),
                    timeout=10 * SLOW)
        begin = self.b.stub.BeginRead if direction == "read" else self.b.stub.BeginWrite
        ao = begin(pb.BeginTransferRequest(metadata=po.metadata, descriptors=[desc(self.rb, 0, size)],
                                           timeout_ms=20000), timeout=10 * SLOW)
        p, a, _, _ = self.wait_both(po, ao, 25)
        self.assertEqual(a.status, pb.OPERATION_STATUS_COMPLETE, a.error.message)
        self.assertEqual(p.status, pb.OPERATION_STATUS_COMPLETE, p.error.message)
        got = self.b.peek(self.rb, 0, size) if direction == "read" else self.a.peek(self.ra, 0, size)
        self.assertEqual(got, data, "bytes differ after the partition healed")

    # ---- scenarios ---------------------------------------------------------------------------

    def short_partition(self, direction):
        po, ao, data, t0 = self.start(direction)
        self.wait_bytes(ao.operation_id, SIZE // 4)
        self.net.partition()
        cut_at = time.monotonic() - t0
        time.sleep(2.0)
        self.net.heal()
        p, a, _, _ = self.wait_both(po, ao, DEADLINE_MS / 1000 + MARGIN_S)
        took = time.monotonic() - t0
        print("figure: %s %d MiB at %s with a 2 s partition at %.1f s: active %s, passive %s, %.1f s"
              % (direction, SIZE >> 20, RATE, cut_at, pb.OperationStatus.Name(a.status),
                 pb.OperationStatus.Name(p.status), took))
        if a.status == pb.OPERATION_STATUS_COMPLETE:
            self.assertEqual(p.status, pb.OPERATION_STATUS_COMPLETE,
                             "active COMPLETE but passive %s: %s" % (pb.OperationStatus.Name(p.status),
                                                                    p.error.message))
            self.assertEqual(a.bytes_done, SIZE)
            self.assertEqual(self.dst_bytes(direction), data, "bytes differ after a healed partition")
        else:
            # Ended in error: both agree, each says why.
            self.assertEqual(a.status, pb.OPERATION_STATUS_ERRORED, a.error.message)
            self.assertEqual(p.status, pb.OPERATION_STATUS_ERRORED, p.error.message)
            self.assertTrue(a.error.message and p.error.message)
        self.assertLess(took, DEADLINE_MS / 1000 + MARGIN_S)
        self.roundtrip(direction)

    def test_short_partition_read(self):
        self.short_partition("read")

    def test_short_partition_write(self):
        self.short_partition("write")

    def endless_partition(self, direction, deadline_ms):
        po, ao, data, t0 = self.start(direction, deadline_ms=deadline_ms, passive_ms=120000)
        self.wait_bytes(ao.operation_id, SIZE // 8)
        self.net.partition()
        cut = time.monotonic()
        p, a, p_t, a_t = self.wait_both(po, ao, deadline_ms / 1000 + MARGIN_S + 5)
        print("figure: %s, partition never heals, deadline %d ms: active %s after %.1f s (%s: %s), "
              "passive %s after %.1f s (%s: %s)"
              % (direction, deadline_ms, pb.OperationStatus.Name(a.status), a_t,
                 CODE_NAMES.get(a.error.code, "-"), a.error.message,
                 pb.OperationStatus.Name(p.status), p_t,
                 CODE_NAMES.get(p.error.code, "-"), p.error.message))
        for side, o, t in (("active", a, a_t), ("passive", p, p_t)):
            self.assertEqual(o.status, pb.OPERATION_STATUS_ERRORED,
                             "%s side: %s %s" % (side, pb.OperationStatus.Name(o.status), o.error.message))
            self.assertIn(o.error.code, (grpc.StatusCode.UNAVAILABLE.value[0],
                                         grpc.StatusCode.DEADLINE_EXCEEDED.value[0]),
                          "%s side: %s" % (side, o.error.message))
            self.assertTrue(o.error.message)
            self.assertLess(t, deadline_ms / 1000 + MARGIN_S,
                            "%s side took %.1f s to give up" % (side, t))
        self.assertLess(a.bytes_done, SIZE)
        self.net.heal()
        heal = time.monotonic()
        self.roundtrip(direction)
        self.roundtrip("write" if direction == "read" else "read")
        print("figure: after healing, new transfers both ways completed in %.1f s (partition lasted %.1f s)"
              % (time.monotonic() - heal, heal - cut))

    def test_endless_partition_read(self):
        self.endless_partition("read", DEADLINE_MS)

    def test_endless_partition_write_detects_dead_peer(self):
        # A long deadline: what ends the transfer is the detection of the dead peer, not the deadline.
        self.endless_partition("write", 60000)

    def test_peer_restarted_behind_partition(self):
        """a dies and comes back on the same address and port while the link is cut, so b never
        sees the old connections close (the FIN is lost): b's pooled connections look alive but
        lead nowhere. The first transfer to the new a must still work (a pooled connection that
        fails its first request is replaced by a fresh one), not fail with UNAVAILABLE."""
        port = 7000 + os.getpid() % 1000
        keys = self.key_file("keys2")
        self.a.stop()
        self._procs.remove(self.a)
        start_a = lambda name: self.sidecar(name, key_file=keys, tcp=False,  # noqa: E731
                                            data_listen="%s:%d" % (self.net.addr[0], port),
                                            prefix=("ip", "netns", "exec", self.net.ns[0]))
        self.b.stop()
        self._procs.remove(self.b)
        self.b = self.sidecar("b2", key_file=keys, tcp=False, data_listen=self.net.addr[1] + ":0",
                              prefix=("ip", "netns", "exec", self.net.ns[1]))
        self.rb = self.b.create_region(SIZE)
        self.a = start_a("a")
        self.ra = self.a.create_region(SIZE)
        for d in ("read", "write", "read"):  # several pooled connections to a
            self.roundtrip(d)
        self.net.partition()
        self.a.kill()
        self._procs.remove(self.a)
        os.unlink(self.a.sock)  # the next start must not find the old socket file
        self.a = start_a("a")
        self.ra = self.a.create_region(SIZE)
        self.net.heal()
        t0 = time.monotonic()
        self.roundtrip("read")
        self.roundtrip("write")
        print("figure: first transfers to a peer restarted behind a partition completed in %.2f s"
              % (time.monotonic() - t0))

    def dial_into_partition(self, **kw):
        """b's first transfer to a, started while the link is cut: its dial hangs on a lost SYN."""
        self.net.partition()
        po = self.a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(self.ra, 0, 4096)],
                                                                timeout_ms=60000), timeout=10 * SLOW)
        ao = self.b.stub.BeginRead(pb.BeginTransferRequest(metadata=po.metadata,
                                                           descriptors=[desc(self.rb, 0, 4096)], **kw),
                                   timeout=10 * SLOW)
        return po, ao

    def test_cancel_while_dialling(self):
        po, ao = self.dial_into_partition(timeout_ms=DEADLINE_MS)
        time.sleep(0.5)  # the connect is under way, its SYNs lost
        o = self.b.stub.GetOperation(pb.GetOperationRequest(operation_id=ao.operation_id), timeout=5)
        self.assertNotIn(o.status, TERMINAL)
        t0 = time.monotonic()
        self.b.stub.CancelOperation(pb.CancelOperationRequest(operation_id=ao.operation_id), timeout=5)
        w = self.b.wait(ao.operation_id, 10000)
        took = time.monotonic() - t0
        self.assertEqual(w.status, pb.OPERATION_STATUS_CANCELLED, w.error.message)
        self.assertEqual(w.bytes_done, 0)
        self.assertLess(took, 2 * SLOW, "a cancel during the dial took %.1f s" % took)
        print("figure: cancel while dialling a partitioned peer: CANCELLED after %.2f s" % took)
        # a never heard of it: its readable is untouched and still usable once the link is back.
        self.assertEqual(self.a.wait(po.operation_id, 100).status, pb.OPERATION_STATUS_INITIALIZED)
        self.net.heal()
        self.roundtrip("read")

    def test_deadline_while_dialling(self):
        t0 = time.monotonic()
        po, ao = self.dial_into_partition(timeout_ms=2000)
        w = self.b.wait(ao.operation_id, 20000)
        took = time.monotonic() - t0
        self.assertEqual(w.status, pb.OPERATION_STATUS_ERRORED, w.error.message)
        self.assertEqual(w.error.code, grpc.StatusCode.DEADLINE_EXCEEDED.value[0], w.error.message)
        self.assertLess(took, 2 + 2 * SLOW, "a 2 s deadline during the dial ended after %.1f s" % took)
        print("figure: 2 s deadline while dialling a partitioned peer: ERRORED after %.2f s (%s)"
              % (took, w.error.message))
        self.net.heal()
        self.roundtrip("write")


if __name__ == "__main__":
    main()
