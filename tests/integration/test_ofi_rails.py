# SPDX-License-Identifier: Apache-2.0
"""libfabric rails: two network namespaces joined by two veth pairs (netns.Paths), every end shaped
with a tbf token bucket, so a transfer's time is set by construction, not by the machine. Each
sidecar runs the libfabric backend (tcp;ofi_rxm) with one rail (domain + endpoint) per interface.

  (a) a 24 MiB READ striped over both rails against the same READ from a sidecar with one rail:
      at least 1.5x faster, bytes on both rails (Operation.rails), GetInfo listing both rails with
      the provider; memory near one rail (GPU memory by the topology; here SC_TEST_OFI_HOST_RAILS)
      moved on that rail only, small and big, READ and WRITE;
  (c) the peer SIGSTOPped mid-transfer (RMA messages in flight on both rails): CancelOperation
      ends the transfer CANCELLED in bounded time, and after SIGCONT the pair moves bytes again;
  (d) the peer killed mid-transfer: the READ ends ERRORED (UNAVAILABLE) in bounded time, naming
      the peer, and b stays healthy;
  (b) one rail cut (iptables DROP) once the transfer shows progress: it completes on the other
      (--ofi-stall-timeout 1s), the cut rail reported cooling with its reason and a failover; and
      a WRITE the same way (into a fresh region: see test_all); a pair whose only libfabric rail
      goes down (connection reset) goes on over tcp (the engine's fall-back), READ and WRITE,
      and one whose only rail goes silent ends UNAVAILABLE in bounded time and exits cleanly;

Every byte compared. Needs root, ip netns and tc (skipped, 77, otherwise).
Figures printed (look for "figure:")."""
import os
import signal
import time

import grpc

from harness import SLOW, SidecarTest, desc, main, pb, wait_until
from netns import NeedsNetns, Paths

SIZE = 24 << 20
RATE = os.environ.get("SC_OFI_RAILS_RATE", "160mbit")  # 24 MiB: about 1.3 s on one rail
TERMINAL = (pb.OPERATION_STATUS_COMPLETE, pb.OPERATION_STATUS_ERRORED, pb.OPERATION_STATUS_CANCELLED)


class OfiRailsTest(NeedsNetns, SidecarTest):
    def setUp(self):
        super().setUp()
        self.net = Paths(2, RATE)
        self.addCleanup(self.net.close)
        keys = self.key_file()
        (a0, b0), (a1, b1) = self.net.addrs
        (da0, db0), (da1, db1) = self.net.devs
        ns_a, ns_b = self.net.ns

        def start(name, ns, listen, domains, env=None):
            return self.sidecar(name, key_file=keys, tcp=False, data_listen=listen + ":0", env=env,
                                extra=("--advertise", listen, "--backends", "tcp,libfabric",
                                       "--ofi-provider", "tcp;ofi_rxm", "--ofi-domains", domains,
                                       "--ofi-stall-timeout", "1s", "--ofi-stripe-min", "1MiB"),
                                prefix=("ip", "netns", "exec", ns))
        self.start = start
        # The control channel on pair 0 only: cutting pair 1 leaves OPEN/DONE alone.
        self.a = start("a", ns_a, a0, "%s,%s" % (da0, da1))
        self.a1 = start("a1", ns_a, a0, da0)
        self.b = start("b", ns_b, b0, "%s,%s" % (db0, db1))
        self.ra = self.a.create_region(SIZE)
        self.ra1 = self.a1.create_region(SIZE)
        self.rb = self.b.create_region(SIZE)

    def begin(self, passive, region, direction):
        data = os.urandom(SIZE)
        (passive.fill(region, 0, data) if direction == "read" else self.b.fill(self.rb, 0, data))
        create = passive.stub.CreateReadable if direction == "read" else passive.stub.CreateWritable
        po = create(pb.CreatePassiveRequest(descriptors=[desc(region, 0, SIZE)], timeout_ms=120000),
                    timeout=10 * SLOW)
        begin = self.b.stub.BeginRead if direction == "read" else self.b.stub.BeginWrite
        t0 = time.monotonic()
        ao = begin(pb.BeginTransferRequest(metadata=po.metadata, descriptors=[desc(self.rb, 0, SIZE)],
                                           timeout_ms=60000, backend=pb.BACKEND_LIBFABRIC),
                   timeout=10 * SLOW)
        return po, ao, data, t0

    def finish(self, passive, region, direction, po, ao, data, t0):
        a = self.b.wait(ao.operation_id, 60000)
        took = time.monotonic() - t0
        p = passive.wait(po.operation_id, 30000)
        self.assertEqual(a.status, pb.OPERATION_STATUS_COMPLETE, a.error.message)
        self.assertEqual(p.status, pb.OPERATION_STATUS_COMPLETE, p.error.message)
        self.assertEqual(a.backend, pb.BACKEND_LIBFABRIC, a.backend_reason)
        got = self.b.peek(self.rb, 0, SIZE) if direction == "read" else passive.peek(region, 0, SIZE)
        self.assertTrue(got == data, "%s: bytes differ" % direction)
        return a, took

    def rails(self, side):
        return [r for r in side.info().rails if r.backend == pb.BACKEND_LIBFABRIC]

    def test_all(self):
        self.check_striping()
        self.check_nearest_rails()
        self.check_cut("read")
        # A fresh region for the WRITE: READ messages given up on at the cut may still land in
        # the first one once the link is back (see ofi/xfer.c, check_stalls).
        self.rb = self.b.create_region(SIZE)
        self.check_cut("write")
        self.check_tcp_takes_over()
        self.check_silent_last_rail()
        self.rb = self.b.create_region(SIZE)
        self.check_stopped_peer_mid_transfer()
        self.rb = self.b.create_region(SIZE)
        self.check_peer_death_mid_transfer()

    def check_striping(self):
        rails = self.rails(self.b)
        self.assertEqual(len(rails), 2, rails)
        for r, devs in zip(rails, self.net.devs):
            self.assertEqual(r.name, "tcp;ofi_rxm:" + devs[1])
            self.assertIn("tcp;ofi_rxm", r.detail)
        _, one = self.finish(self.a1, self.ra1, "read", *self.begin(self.a1, self.ra1, "read"))
        op, two = self.finish(self.a, self.ra, "read", *self.begin(self.a, self.ra, "read"))
        used = {u.rail: u.bytes for u in op.rails}
        print("figure: 24 MiB READ at %s per rail: one rail %.2f s, two rails %.2f s: %.2fx; "
              "bytes per rail %s" % (RATE, one, two, one / two, used))
        self.assertEqual(len(used), 2, used)
        for name, n in used.items():
            self.assertGreater(n, SIZE // 4, "rail %s carried too little: %s" % (name, used))
        self.assertGreaterEqual(one / two, 1.5)

    def check_nearest_rails(self):
        """Memory the topology puts nearer one rail (GPU memory on a real node; here host memory
        told so by SC_TEST_OFI_HOST_RAILS, as no topology places a veth) moves through that rail
        only, a small transfer (under --ofi-stripe-min) as well as big ones, READ and WRITE, every
        byte compared; the same pair's other transfers still start on the first rail."""
        (_, db0), (_, db1) = self.net.devs
        near = "tcp;ofi_rxm:" + db1
        bn = self.start("bn", self.net.ns[1], self.net.addrs[0][1], "%s,%s" % (db0, db1),
                        env={"SC_TEST_OFI_HOST_RAILS": near})
        rbn = bn.create_region(SIZE)
        for size, direction, off in ((4099, "read", 13), (12 << 20, "write", 7), ((3 << 20) + 5, "read", 0)):
            data = os.urandom(size)
            (self.a.fill(self.ra, off, data) if direction == "read" else bn.fill(rbn, off, data))
            create = self.a.stub.CreateReadable if direction == "read" else self.a.stub.CreateWritable
            po = create(pb.CreatePassiveRequest(descriptors=[desc(self.ra, off, size)], timeout_ms=60000),
                        timeout=10 * SLOW)
            begin = bn.stub.BeginRead if direction == "read" else bn.stub.BeginWrite
            done = begin(pb.BeginTransferRequest(metadata=po.metadata, descriptors=[desc(rbn, off, size)],
                                                 timeout_ms=60000, backend=pb.BACKEND_LIBFABRIC, wait=True),
                         timeout=70 * SLOW)
            self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
            got = bn.peek(rbn, off, size) if direction == "read" else self.a.peek(self.ra, off, size)
            self.assertTrue(got == data, "%s of %d bytes: bytes differ" % (direction, size))
            used = {u.rail: u.bytes for u in done.rails}
            self.assertEqual(set(used), {near}, "%s of %d bytes: %s" % (direction, size, used))
            self.assertGreaterEqual(used[near], size)
            print("figure: %s of %d bytes from memory near %s: bytes per rail %s" % (direction, size, near, used))
        # b, told nothing, starts a small transfer on its first rail as always.
        data = os.urandom(4099)
        self.a.fill(self.ra, 0, data)
        po = self.a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(self.ra, 0, 4099)],
                                                                timeout_ms=60000), timeout=10 * SLOW)
        done = self.b.stub.BeginRead(pb.BeginTransferRequest(metadata=po.metadata, descriptors=[desc(self.rb, 0, 4099)],
                                                             timeout_ms=60000, backend=pb.BACKEND_LIBFABRIC,
                                                             wait=True), timeout=70 * SLOW)
        self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
        self.assertEqual(self.b.peek(self.rb, 0, 4099), data)
        self.assertEqual({u.rail for u in done.rails}, {"tcp;ofi_rxm:" + db0}, done.rails)
        bn.stop()

    def check_cut(self, direction):
        po, ao, data, t0 = self.begin(self.a, self.ra, direction)

        def moved():
            o = self.b.stub.GetOperation(pb.GetOperationRequest(operation_id=ao.operation_id), timeout=5)
            if o.status in TERMINAL:
                self.fail("transfer ended before the cut: lower SC_OFI_RAILS_RATE")
            return o.bytes_done >= SIZE // 6
        wait_until(moved, 30 * SLOW, "a sixth of the bytes to move")
        self.net.cut(1)
        try:
            op, took = self.finish(self.a, self.ra, direction, po, ao, data, t0)
        finally:
            self.net.restore(1)
        used = {u.rail: u.bytes for u in op.rails}
        rail = self.rails(self.b)[1]
        print("figure: %s 24 MiB, rail 1 cut mid-transfer: COMPLETE in %.1f s, bytes per rail %s; "
              "rail 1 %s: %s" % (direction, took, used, rail.state, rail.detail))
        self.assertEqual(rail.state, "cooling", rail)
        self.assertIn("failed", rail.detail)
        self.assertGreaterEqual(rail.failovers, 1)


    def one_rail_pair(self, name):
        """A pair whose only libfabric rail is pair 1, with tcp and the control channel on pair 0."""
        a0, b0 = self.net.addrs[0]
        da1, db1 = self.net.devs[1]
        pa = self.start("a" + name, self.net.ns[0], a0, da1)
        pb_ = self.start("b" + name, self.net.ns[1], b0, db1)
        return pa, pb_

    def cut_mid_transfer(self, pa, pb_, direction, reset):
        """A 24 MiB transfer (pb_ active) over the only rail, pair 1 cut once a sixth has moved;
        returns both sides' final Operation, the bytes expected and where they went, and the
        seconds from the cut to the end."""
        ra, rb = pa.create_region(SIZE), pb_.create_region(SIZE)
        data = os.urandom(SIZE)
        (pa.fill(ra, 0, data) if direction == "read" else pb_.fill(rb, 0, data))
        create = pa.stub.CreateReadable if direction == "read" else pa.stub.CreateWritable
        po = create(pb.CreatePassiveRequest(descriptors=[desc(ra, 0, SIZE)], timeout_ms=120000),
                    timeout=10 * SLOW)
        begin = pb_.stub.BeginRead if direction == "read" else pb_.stub.BeginWrite
        ao = begin(pb.BeginTransferRequest(metadata=po.metadata, descriptors=[desc(rb, 0, SIZE)],
                                           timeout_ms=90000, backend=pb.BACKEND_LIBFABRIC),
                   timeout=10 * SLOW)

        def moved():
            o = pb_.stub.GetOperation(pb.GetOperationRequest(operation_id=ao.operation_id), timeout=5)
            if o.status in TERMINAL:
                self.fail("transfer ended before the cut: lower SC_OFI_RAILS_RATE")
            return o.bytes_done >= SIZE // 6
        wait_until(moved, 30 * SLOW, "a sixth of the bytes to move")
        self.net.cut(1, reset=reset)
        t_cut = time.monotonic()
        try:
            done = pb_.wait(ao.operation_id, 90000)
            p = pa.wait(po.operation_id, 30000)
        finally:
            self.net.restore(1)
        took = time.monotonic() - t_cut
        got = (lambda: pb_.peek(rb, 0, SIZE)) if direction == "read" else (lambda: pa.peek(ra, 0, SIZE))
        return done, p, data, got, took

    def check_tcp_takes_over(self):
        """The only libfabric rail goes down mid-transfer so that the provider hears of it (its
        TCP connection reset: a port gone down): every message fails, none is left out, and the
        same transfer goes on over tcp: every byte compared, both sides COMPLETE with backend tcp
        and the reason, the rail's failover counted, the log saying so. READ and WRITE."""
        pa, pb_ = self.one_rail_pair("2")
        for direction in ("read", "write"):
            done, p, data, got, took = self.cut_mid_transfer(pa, pb_, direction, reset=True)
            self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
            self.assertEqual(p.status, pb.OPERATION_STATUS_COMPLETE, p.error.message)
            self.assertTrue(got() == data, "%s: bytes differ after the move to tcp" % direction)
            self.assertEqual(done.backend, pb.BACKEND_TCP, done.backend_reason)
            self.assertIn("libfabric failed mid-transfer, moved to tcp", done.backend_reason)
            self.assertIn("moved the transfer to tcp", p.backend_reason)
            rail = self.rails(pb_)[0]
            self.assertGreaterEqual(rail.failovers, 1, rail)
            print("figure: %s 24 MiB, its only libfabric rail reset: COMPLETE over tcp %.1f s after "
                  "the cut; %s" % (direction, took, done.backend_reason))
        self.assertIn("going on over tcp", pb_.read_log())
        self.assertEqual(pa.stop(), 0)
        self.assertEqual(pb_.stop(), 0)

    def check_silent_last_rail(self):
        """The only libfabric rail goes silent mid-READ (iptables DROP): past --ofi-stall-timeout the
        transfer ends UNAVAILABLE saying the rail stalled, in bounded time, not at its deadline.
        On tcp;ofi_rxm the messages in flight are never accounted for (dropping the peer's
        address does not fail them), so tcp does not take over (a late READ reply could land
        after tcp's bytes), and the sidecar, which cannot close that endpoint, still exits 0."""
        pa, pb_ = self.one_rail_pair("3")
        done, p, _, _, took = self.cut_mid_transfer(pa, pb_, "read", reset=False)
        print("figure: READ 24 MiB, its only libfabric rail silent: %s in %.1f s: %s"
              % (pb.OperationStatus.Name(done.status), took, done.error.message))
        self.assertEqual(done.status, pb.OPERATION_STATUS_ERRORED, done.error.message)
        self.assertEqual(done.error.code, 14, done.error.message)  # UNAVAILABLE
        self.assertIn("stalled", done.error.message)
        self.assertLess(took, 30)
        self.assertEqual(pb_.stop(), 0)
        self.assertEqual(pa.stop(), 0)

    def check_stopped_peer_mid_transfer(self):
        po, ao, data, t0 = self.begin(self.a, self.ra, "read")

        def moved():
            o = self.b.stub.GetOperation(pb.GetOperationRequest(operation_id=ao.operation_id), timeout=5)
            if o.status in TERMINAL:
                self.fail("transfer ended before the stop: lower SC_OFI_RAILS_RATE")
            return o.bytes_done >= SIZE // 6
        wait_until(moved, 30 * SLOW, "a sixth of the bytes to move")
        self.a.pause()
        try:
            t1 = time.monotonic()
            try:
                self.b.stub.CancelOperation(pb.CancelOperationRequest(
                    operation_id=ao.operation_id), timeout=30)
            except grpc.RpcError as e:  # past --cancel-wait: the memory is not quiet yet
                self.assertEqual(e.code(), grpc.StatusCode.FAILED_PRECONDITION, e.details())
                self.assertIn("has not stopped touching the worker's memory yet", e.details())
            got = self.b.wait(ao.operation_id, 20000)
            took = time.monotonic() - t1
            print("figure: READ cancelled with its peer SIGSTOPped mid-transfer: %s in %.1f s"
                  % (pb.OperationStatus.Name(got.status), took))
            self.assertEqual(got.status, pb.OPERATION_STATUS_CANCELLED, got.error.message)
            self.assertLess(took, 10)
        finally:
            self.a.proc.send_signal(signal.SIGCONT)
        # the pair still moves bytes (a fresh region: the cancelled READ's messages may land late)
        self.rb = self.b.create_region(SIZE)
        self.finish(self.a, self.ra, "read", *self.begin(self.a, self.ra, "read"))

    def check_peer_death_mid_transfer(self):
        po, ao, data, t0 = self.begin(self.a, self.ra, "read")

        def moved():
            o = self.b.stub.GetOperation(pb.GetOperationRequest(operation_id=ao.operation_id), timeout=5)
            if o.status in TERMINAL:
                self.fail("transfer ended before the kill: lower SC_OFI_RAILS_RATE")
            return o.bytes_done >= SIZE // 6
        wait_until(moved, 30 * SLOW, "a sixth of the bytes to move")
        self.a.kill()
        self._procs.remove(self.a)
        t1 = time.monotonic()
        got = self.b.wait(ao.operation_id, 30000)
        took = time.monotonic() - t1
        print("figure: READ with its peer killed mid-transfer: %s (%s) in %.1f s: %s"
              % (pb.OperationStatus.Name(got.status), got.error.code, took, got.error.message))
        self.assertEqual(got.status, pb.OPERATION_STATUS_ERRORED)
        self.assertEqual(got.error.code, 14, got.error.message)  # UNAVAILABLE
        self.assertLess(took, 15)
        self.assertTrue(self.b.info().backends)


if __name__ == "__main__":
    main()
