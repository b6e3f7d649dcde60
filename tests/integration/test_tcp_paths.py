# SPDX-License-Identifier: Apache-2.0
"""The TCP data plane on several paths, between real sidecars in two network namespaces.

Two namespaces are joined by two veth pairs, one subnet each (netns.Paths), every end shaped with a
token bucket (tbf, SC_PATHS_RATE, 100 Mbit/s by default) so a 64 MiB transfer lasts seconds by
construction. Sidecar "a" serves two data endpoints (--data-listen 10.78.0.1:0,10.78.1.1:0), "a1"
(same namespace) serves only the first path; "b", the active side, has two endpoints as well.
Checked, every byte compared:
  (a) a 64 MiB READ and WRITE of random data over both paths runs at least 1.7x the same transfer
      over one path (a1's metadata names one endpoint), same run; GetInfo lists two TCP rails with
      their netdevs, and Operation.rails shows bytes on both;
  (b) one path cut (iptables DROP on its interfaces) once the transfer shows progress: the transfer
      completes on the other path; GetInfo shows the rail cooling with the reason, its failovers
      counted there and in rdma_sidecar_rail_failovers_total; once the path is back and the
      cool-down over, a new transfer moves bytes on that rail again;
  (c) both paths cut: the transfer fails (before its deadline, with an error that names both
      paths), never hangs;
  and a cancel on either side ends a two-path transfer at once without blaming a path.
Needs root, `ip netns`, tc and iptables: exits 77 (skipped) otherwise.

Figures printed (look for "figure:").
"""
import os
import re
import subprocess
import sys
import time

from harness import SLOW, SidecarTest, desc, main, pb, wait_until
from netns import NeedsNetns, Paths

SIZE = 64 << 20
RATE = os.environ.get("SC_PATHS_RATE", "100mbit")  # 64 MiB: about 5.4 s on one path
METRICS_PORT = 9464  # inside a's namespace: nothing else listens there
TERMINAL = (pb.OPERATION_STATUS_COMPLETE, pb.OPERATION_STATUS_ERRORED, pb.OPERATION_STATUS_CANCELLED)


class TcpPathsTest(NeedsNetns, SidecarTest):
    def setUp(self):
        super().setUp()
        self.net = Paths(2, RATE)
        self.addCleanup(self.net.close)
        keys = self.key_file()
        (a0, b0), (a1, b1) = self.net.addrs
        ns_a, ns_b = self.net.ns

        def start(name, ns, listen, extra=()):
            return self.sidecar(name, key_file=keys, tcp=False, data_listen=listen,
                                extra=("--advertise", ",".join(x.split(":")[0] for x in listen.split(",")))
                                + tuple(extra), prefix=("ip", "netns", "exec", ns))
        self.a = start("a", ns_a, "%s:0,%s:0" % (a0, a1))
        self.a1 = start("a1", ns_a, "%s:0" % a0)
        self.b = start("b", ns_b, "%s:0,%s:0" % (b0, b1),
                       extra=("--metrics-listen", "127.0.0.1:%d" % METRICS_PORT))
        self.ra = self.a.create_region(SIZE)
        self.ra1 = self.a1.create_region(SIZE)
        self.rb = self.b.create_region(SIZE)

    # ---- helpers -----------------------------------------------------------------------------

    def begin(self, passive, region, direction, deadline_ms=60000, size=SIZE):
        """b is active: a READ pulls passive's region into b's, a WRITE pushes b's into it.
        Returns (passive op, active op, source bytes, t0)."""
        data = os.urandom(size)
        if direction == "read":
            passive.fill(region, 0, data)
        else:
            self.b.fill(self.rb, 0, data)
        create = passive.stub.CreateReadable if direction == "read" else passive.stub.CreateWritable
        po = create(pb.CreatePassiveRequest(descriptors=[desc(region, 0, size)], timeout_ms=120000),
                    timeout=10 * SLOW)
        begin = self.b.stub.BeginRead if direction == "read" else self.b.stub.BeginWrite
        t0 = time.monotonic()
        ao = begin(pb.BeginTransferRequest(metadata=po.metadata, descriptors=[desc(self.rb, 0, size)],
                                           timeout_ms=deadline_ms), timeout=10 * SLOW)
        return po, ao, data, t0

    def finish(self, passive, region, direction, po, ao, data, t0, limit_s=90, size=SIZE):
        a = self.b.wait(ao.operation_id, int(limit_s * 1000))
        took = time.monotonic() - t0
        p = passive.wait(po.operation_id, 30000)
        self.assertEqual(a.status, pb.OPERATION_STATUS_COMPLETE, a.error.message)
        self.assertEqual(p.status, pb.OPERATION_STATUS_COMPLETE, p.error.message)
        got = self.b.peek(self.rb, 0, size) if direction == "read" else passive.peek(region, 0, size)
        self.assertTrue(got == data, "%s: bytes differ" % direction)
        return a, took

    def transfer(self, passive, region, direction):
        po, ao, data, t0 = self.begin(passive, region, direction)
        return self.finish(passive, region, direction, po, ao, data, t0)

    def rails(self, side):
        return [r for r in side.info().rails if r.backend == pb.BACKEND_TCP]

    def rail_bytes(self, op):
        return {u.rail: u.bytes for u in op.rails}

    def metrics(self):
        code = ("import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:%d/metrics',"
                "timeout=5).read().decode())" % METRICS_PORT)
        r = subprocess.run(["ip", "netns", "exec", self.net.ns[1], sys.executable, "-c", code],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20)
        self.assertEqual(r.returncode, 0, r.stdout.decode())
        return r.stdout.decode()

    def wait_progress(self, op_id, at_least):
        def moved():
            o = self.b.stub.GetOperation(pb.GetOperationRequest(operation_id=op_id), timeout=5)
            if o.status in TERMINAL:
                self.fail("transfer ended (%s) before the cut: lower SC_PATHS_RATE"
                          % pb.OperationStatus.Name(o.status))
            return o.bytes_done >= at_least and o
        return wait_until(moved, 30 * SLOW, "%d bytes to move" % at_least)

    # ---- (a) two paths against one -----------------------------------------------------------

    def test_two_paths_beat_one(self):
        rails = self.rails(self.b)
        self.assertEqual(len(rails), 2, rails)
        for r, (_, addr) in zip(rails, self.net.addrs):
            self.assertTrue(r.name.startswith(addr + ":"), r.name)
            self.assertEqual(r.state, "up")
            self.assertTrue(r.netdev.startswith("sq"), r.netdev)  # found from the address
        self.assertEqual(len(self.a.info().data_endpoints), 2)
        # ConnectPeer warms connections on both paths, as a transfer would spread its streams.
        po = self.a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(self.ra, 0, 4096)],
                                                                timeout_ms=30000), timeout=10 * SLOW)
        got = self.b.stub.ConnectPeer(pb.ConnectPeerRequest(metadata=po.metadata, timeout_ms=10000),
                                      timeout=30 * SLOW)
        tcp = [p for p in got.paths if p.backend == pb.BACKEND_TCP][0]
        self.assertTrue(tcp.ready, got)
        for addr, _ in self.net.addrs:
            self.assertIn(addr + ":", tcp.detail)
        self.a.stub.CancelOperation(pb.CancelOperationRequest(operation_id=po.operation_id), timeout=30)
        for direction in ("read", "write"):
            _, one = self.transfer(self.a1, self.ra1, direction)
            op, two = self.transfer(self.a, self.ra, direction)
            used = self.rail_bytes(op)
            print("figure: %s %d MiB at %s per path: one path %.2f s (%.1f MB/s), two paths %.2f s "
                  "(%.1f MB/s), %.2fx; bytes per rail %s"
                  % (direction, SIZE >> 20, RATE, one, SIZE / one / 1e6, two, SIZE / two / 1e6,
                     one / two, used))
            self.assertEqual(len(used), 2, "bytes on both rails: %s" % used)
            self.assertEqual(sum(used.values()), SIZE)
            for name, n in used.items():
                self.assertGreater(n, SIZE // 4, "rail %s carried too little: %s" % (name, used))
            self.assertGreaterEqual(one / two, 1.7, "two paths %.2f s, one path %.2f s" % (two, one))

    # ---- (b) one path cut mid-transfer ---------------------------------------------------------

    def cut_one(self, direction):
        po, ao, data, t0 = self.begin(self.a, self.ra, direction)
        self.wait_progress(ao.operation_id, SIZE // 8)
        self.net.cut(1)
        cut_at = time.monotonic() - t0
        op, took = self.finish(self.a, self.ra, direction, po, ao, data, t0)
        print("figure: %s %d MiB, path 1 cut at %.1f s: COMPLETE in %.1f s, bytes per rail %s"
              % (direction, SIZE >> 20, cut_at, took, self.rail_bytes(op)))
        return op

    def test_one_path_cut_mid_transfer(self):
        self.cut_one("read")
        rail = self.rails(self.b)[1]
        self.assertEqual(rail.state, "cooling", rail)
        self.assertIn("failed", rail.detail)
        self.assertIn(self.net.addrs[1][0], rail.detail)  # the path that failed
        self.assertGreaterEqual(rail.failovers, 1)
        self.assertGreaterEqual(rail.errors, 1)
        # The metrics name a rail by a stable label (its interface); rdma_sidecar_rail_info
        # joins it to the endpoint GetInfo names.
        text = self.metrics()
        info = [re.search(r'rail="([^"]+)"', line).group(1) for line in text.splitlines()
                if line.startswith("rdma_sidecar_rail_info{") and 'endpoint="%s"' % rail.name in line]
        self.assertEqual(len(info), 1, (rail.name, info))
        m = [line for line in text.splitlines()
             if line.startswith("rdma_sidecar_rail_failovers_total") and 'rail="%s"' % info[0] in line]
        self.assertTrue(m and float(m[0].split()[-1]) >= 1, m)
        self.assertIn("path to %s" % rail.detail.split()[2], self.b.read_log())  # the WARN line
        # Back, and its cool-down (2 s after the first failure) over: probed, used again, up.
        self.net.restore(1)
        time.sleep(2.5)
        before = self.rails(self.b)[1].bytes
        op, _ = self.transfer(self.a, self.ra, "write")
        after = self.rails(self.b)[1]
        print("figure: after restore: rail %s %s, bytes %d -> %d, operation rails %s"
              % (after.name, after.state, before, after.bytes, self.rail_bytes(op)))
        self.assertGreater(after.bytes, before, "the restored path carries bytes again")
        self.assertEqual(after.state, "up", after.detail)
        # And a WRITE survives the cut as well.
        self.cut_one("write")

    # ---- cancels on two paths --------------------------------------------------------------------

    def test_cancels_on_two_paths(self):
        """A cancel on either side ends a two-path transfer at once; no path is blamed for it."""
        for side in ("active", "passive"):
            po, ao, _, t0 = self.begin(self.a, self.ra, "read")
            self.wait_progress(ao.operation_id, SIZE // 8)
            op, who = (ao, self.b) if side == "active" else (po, self.a)
            who.stub.CancelOperation(pb.CancelOperationRequest(operation_id=op.operation_id),
                                     timeout=30)
            a = self.b.wait(ao.operation_id, 30000)
            took = time.monotonic() - t0
            print("figure: %s cancel of a two-path read: active %s after %.1f s: %s"
                  % (side, pb.OperationStatus.Name(a.status), took, a.error.message))
            self.assertIn(a.status, (pb.OPERATION_STATUS_CANCELLED, pb.OPERATION_STATUS_ERRORED))
            self.assertLess(took, 15)
            self.assertLess(a.bytes_done, SIZE)
        for r in self.rails(self.b):
            self.assertEqual(r.state, "up", "%s: %s" % (r.name, r.detail))
            self.assertEqual(r.failovers, 0, r.name)
        self.transfer(self.a, self.ra, "write")  # and the paths still work

    # ---- (c) every path cut --------------------------------------------------------------------

    def test_all_paths_cut(self):
        deadline_ms = 60000
        po, ao, data, t0 = self.begin(self.a, self.ra, "read", deadline_ms=deadline_ms)
        self.wait_progress(ao.operation_id, SIZE // 8)
        self.net.cut(0)
        self.net.cut(1)
        a = self.b.wait(ao.operation_id, int((deadline_ms + 30000)))
        took = time.monotonic() - t0
        print("figure: read, both paths cut: %s after %.1f s: %s"
              % (pb.OperationStatus.Name(a.status), took, a.error.message))
        self.assertEqual(a.status, pb.OPERATION_STATUS_ERRORED, a.error.message)
        self.assertLess(took, deadline_ms / 1000 + 15)
        for addr, _ in self.net.addrs:  # a's endpoints, as the metadata names them
            self.assertIn(addr + ":", a.error.message)


if __name__ == "__main__":
    main()
