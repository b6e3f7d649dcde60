# SPDX-License-Identifier: Apache-2.0
"""The fast path (issue 26 part 2) through the Python package's own mapping of the rings
(rdma_sidecar.FastPath), against real sidecars:

- READ and WRITE of odd sizes and of 37 pieces, against a TCP peer and LOCAL, each handle run
  several times with fresh random data, every byte of the receiving region compared (targets hold
  the payload, the rest its noise).
- A sidecar with --fast-path-socket off: mode "grpc" and the same transfers; require_ring raises.
- Cancel and deadline of runs against a peer stopped by SIGSTOP (slow by construction), then a
  normal run once it is resumed.
- A worker killed (SIGKILL) with runs in flight: its operations and its session go.
- Hostile workers: random SQEs, a PREPARE of garbage, an impossible sq_tail, a worker that stops
  reading completions (only its own submissions stop), ftruncate of the sealed ring memory.
- --allowed-uids: a uid outside the list gets neither the fast path nor gRPC (the refusal comes as
  a RESULT in place of HELLO); --fast-path-max-sessions refuses one more, and admits it again once
  a session closed.
- PREPARE is refused at once, with the code BeginRead gives, for what BeginRead refuses.
- SIGTERM with a session open: the sidecar exits 0 and the worker sees the session end.
"""
import os
import random
import signal
import struct
import subprocess
import sys
import time
import urllib.request

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.environ.get("SC_SOURCE_DIR", os.path.join(HERE, "..", "..")))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from harness import SLOW, STUBS, SidecarTest, free_port, main, pb, wait_until  # noqa: E402

import rdma_sidecar as rs  # noqa: E402
import rdma_sidecar.sync  # noqa: E402,F401
from rdma_sidecar import fast  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
READ, WRITE = rs.OperationKind.READ, rs.OperationKind.WRITE
CANCELLED, ERRORED, COMPLETE = 4, 5, 3


def layout(total, n, rnd):
    """total split into n lengths >= 1."""
    if n == 1:
        return [total]
    cuts = sorted(rnd.sample(range(1, total), n - 1))
    return [b - a for a, b in zip([0] + cuts, cuts + [total])]


class Move:
    """One prepared transfer between two regions with gaps of noise: `passive` exposes the source
    ranges (READABLE for a READ, WRITABLE for a WRITE) for any number of uses; the worker's
    descriptors lie in `active`'s region. check() runs it with a fresh payload and compares every
    byte of the receiving region."""

    def __init__(self, test, passive, active, total, ndesc, kind, worker_region=None):
        self.t, self.passive, self.active, self.kind, self.total = test, passive, active, kind, total
        rnd = test.rnd
        lengths = layout(total, ndesc, rnd)
        slack = 4099
        size = total + slack * (ndesc + 1)
        self.rp = passive.create_region(size)
        self.ra = worker_region or active.create_region(size)
        self.pdescs, self.adescs = [], []
        op_, oa = 1, 3
        for ln in lengths:
            op_ += rnd.randrange(0, slack)
            oa += rnd.randrange(0, slack)
            self.pdescs.append((op_, ln))
            self.adescs.append((oa, ln))
            op_ += ln
            oa += ln
        create = passive.stub.CreateReadable if kind == READ else passive.stub.CreateWritable
        self.op = create(pb.CreatePassiveRequest(
            descriptors=[pb.Descriptor(region_id=self.rp.region_id, offset=o, length=n) for o, n in self.pdescs],
            timeout_ms=int(300000 * SLOW), any_uses=True), timeout=30)
        test.addCleanup(self.release)

    def release(self):
        try:
            self.passive.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=self.op.operation_id),
                                               timeout=10)
        except Exception:  # noqa: BLE001 (the sidecar may be gone already)
            pass

    def worker_descs(self):
        return [(self.ra.region_id, o, n) for o, n in self.adescs]

    def prepare(self, fp, **kw):
        return fp.prepare(self.kind, self.op.metadata, self.worker_descs(), **kw)

    def stage(self):
        """Fresh noise in both regions and a fresh payload in the sending ranges; returns what the
        receiving region must hold afterwards."""
        payload = os.urandom(self.total)
        noise_p, noise_a = os.urandom(self.rp.size), os.urandom(self.ra.size)
        self.passive.fill(self.rp, 0, noise_p)
        self.active.fill(self.ra, 0, noise_a)
        send_s, send_r, send_d = (self.passive, self.rp, self.pdescs) if self.kind == READ else \
            (self.active, self.ra, self.adescs)
        recv_d, recv_noise = (self.adescs, noise_a) if self.kind == READ else (self.pdescs, noise_p)
        pos = 0
        for o, n in send_d:
            send_s.fill(send_r, o, payload[pos:pos + n])
            pos += n
        expect, pos = bytearray(recv_noise), 0
        for o, n in recv_d:
            expect[o:o + n] = payload[pos:pos + n]
            pos += n
        return bytes(expect)

    def verify(self, expect, what):
        recv, region = (self.active, self.ra) if self.kind == READ else (self.passive, self.rp)
        got = recv.peek(region, 0, region.size)
        self.t.assertTrue(got == expect, "bytes differ after %s of %d bytes in %d pieces"
                          % (what, self.total, len(self.adescs)))

    def check(self, fp, handle, backend, what="a run", timeout_ms=0):
        expect = self.stage()
        c = fp.run(handle, timeout_ms)
        self.t.assertEqual((c.code, c.status), (0, COMPLETE), c)
        self.t.assertEqual(c.bytes, self.total, c)
        self.t.assertEqual(c.backend, backend, c)
        self.verify(expect, what)
        return c


class FastPathTest(SidecarTest):
    maxDiff = None
    def setUp(self):
        super().setUp()
        self.rnd = random.Random(int.from_bytes(os.urandom(8), "little"))
        self._fps = []

    def pair(self, extra_b=()):
        keys = self.key_file()
        return self.sidecar("a", key_file=keys), self.sidecar("b", key_file=keys, extra=list(extra_b))

    def tearDown(self):
        for fp in self._fps:  # before the sidecars stop
            fp.close()
        super().tearDown()

    def fast(self, s, **kw):
        fp = rs.FastPath.open("unix:" + s.sock, **kw)
        self._fps.append(fp)
        return fp

    def metrics_sidecar(self, name, **kw):
        port = free_port()
        s = self.sidecar(name, extra=["--metrics-listen", "127.0.0.1:%d" % port] + list(kw.pop("extra", [])), **kw)
        s.metrics_port = port
        return s

    def gauge(self, s, name):
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % s.metrics_port, timeout=10).read().decode()
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError("no %s in the metrics of %s" % (name, s.name))

    def reap_all(self, fp, want, timeout=30):
        """Completions until every user_data in want has one; returns {user_data: completion}."""
        got = {}
        end = time.monotonic() + timeout * SLOW
        while not set(want) <= set(got):
            left = end - time.monotonic()
            missing = sorted(set(want) - set(got))
            self.assertGreater(left, 0, "%d completions missing (%s...), %d came (%s...)"
                               % (len(missing), missing[:5], len(got), list(got.values())[:2]))
            for c in fp.reap(timeout_ms=int(left * 1000)):
                got[c.user_data] = c
        return got

    def moves(self, fp, passive, active, backend, runs=3):
        for kind in (READ, WRITE):
            for total, ndesc in ((1, 1), (4097, 1), (65 * KiB + 1, 3), (1 * MiB, 1), (1 * MiB, 37)):
                with self.subTest(kind=kind.name, total=total, ndesc=ndesc, mode=fp.mode):
                    m = Move(self, passive, active, total, ndesc, kind)
                    h = m.prepare(fp)
                    for i in range(runs):
                        m.check(fp, h, backend, "run %d of %s" % (i, kind.name))
                    fp.unprepare(h)

    # ---- transfers ----------------------------------------------------------------------------

    def test_tcp_reads_and_writes(self):
        a, b = self.pair()
        fp = self.fast(b, require_ring=True)
        self.assertEqual(fp.mode, "ring")
        self.assertEqual(fp.sidecar_id, "b")
        self.moves(fp, a, b, rs.Backend.TCP)

    def test_local_reads_and_writes(self):
        s = self.sidecar("solo")
        fp = self.fast(s, require_ring=True)
        self.moves(fp, s, s, rs.Backend.LOCAL)

    def test_descriptor_objects_of_a_connector(self):
        """Host descriptors (memoryview slices of the connector's region) are found by address."""
        s = self.sidecar("solo")
        with rs.sync.Connector("unix:" + s.sock) as c:
            region = c.create_region(3 * 4096)
            mv = region.memoryview()
            fp = c.fast_path(require_ring=True)
            self.addCleanup(fp.close)
            r = s.create_region(8192)
            data = os.urandom(8192)
            s.fill(r, 0, data)
            ro = s.stub.CreateReadable(pb.CreatePassiveRequest(
                descriptors=[pb.Descriptor(region_id=r.region_id, offset=0, length=4096),
                             pb.Descriptor(region_id=r.region_id, offset=4096, length=4096)], any_uses=True), timeout=10)
            h = fp.prepare(READ, ro.metadata, [rs.Descriptor(mv[5:4101]), rs.Descriptor(mv[8000:12096])])
            fp.run(h).raise_for_code()
            self.assertEqual(bytes(mv[5:4101]) + bytes(mv[8000:12096]), data)
            fp.close()
            s.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=ro.operation_id), timeout=10)

    def test_off_falls_back_to_grpc(self):
        a, b = self.pair(extra_b=["--fast-path-socket", "off"])
        self.assertFalse(os.path.exists(b.sock + ".fast"))
        with self.assertRaises(rs.UnavailableError):
            rs.FastPath.open("unix:" + b.sock, require_ring=True)
        fp = self.fast(b)
        self.assertEqual(fp.mode, "grpc")
        self.moves(fp, a, b, rs.Backend.TCP, runs=2)
        # submit/reap/cancel in grpc mode too
        m = Move(self, a, b, 4097, 2, READ)
        h = m.prepare(fp)
        expect = m.stage()
        fp.submit(h, 11)
        fp.cancel(999, 12)
        got = self.reap_all(fp, [11, 12])
        self.assertEqual((got[11].code, got[11].bytes), (0, 4097), got[11])
        self.assertEqual(got[12].code, 5, got[12])
        m.verify(expect, "a submitted run (grpc mode)")
        self.assertFalse([o for o in b.stub.ListOperations(pb.ListOperationsRequest(), timeout=10).operations
                          if o.kind in (pb.OPERATION_KIND_READ, pb.OPERATION_KIND_WRITE)],
                         "grpc mode left its runs' operations")

    # ---- cancel, deadline, a killed worker -----------------------------------------------------

    def test_cancel_and_deadline_against_a_stopped_peer(self):
        self.cancel_and_deadline(1 * MiB + 3)

    def test_cancel_and_deadline_of_a_small_run(self):
        """At most 256 KiB: the sidecar's TCP backend runs such a transfer on the thread that
        began it, here the session's; cancel and deadline must still work."""
        self.cancel_and_deadline(64 * KiB)

    def cancel_and_deadline(self, size):
        a, b = self.pair()
        fp = self.fast(b, require_ring=True)
        m = Move(self, a, b, size, 2, READ)
        h = m.prepare(fp)
        m.check(fp, h, rs.Backend.TCP, "the first run")  # the connection to a is warm
        a.pause()
        try:
            t0 = time.monotonic()
            fp.submit(h, 1, timeout_ms=int(60000 * SLOW))
            time.sleep(0.2)
            fp.cancel(1, 2)
            got = self.reap_all(fp, [1, 2], timeout=10)  # the run's deadline is 60 s away
            print("  cancel: both completions after %.3f s" % (time.monotonic() - t0))
            self.assertEqual((got[1].code, got[1].status), (1, CANCELLED), got[1])
            self.assertEqual(got[2].code, 0, got[2])
            with self.assertRaises(rs.CancelledError):
                got[1].raise_for_code()
            t0 = time.monotonic()
            c = fp.run(h, timeout_ms=500)
            self.assertEqual((c.code, c.status), (4, ERRORED), c)
            self.assertLess(time.monotonic() - t0, 10 * SLOW)
            with self.assertRaises(rs.DeadlineExceededError):
                c.raise_for_code()
            # a cancel of a run no longer in flight: NOT_FOUND in its own completion
            fp.cancel(1, 3)
            self.assertEqual(self.reap_all(fp, [3])[3].code, 5)
        finally:
            a.proc.send_signal(signal.SIGCONT)
        m.check(fp, h, rs.Backend.TCP, "a run after the peer resumed")

    WORKER = r"""
import sys, time
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import rdma_sidecar as rs
fp = rs.FastPath.open(sys.argv[3], require_ring=True)
h = fp.prepare(rs.OperationKind.READ, sys.argv[4], [(sys.argv[5], 0, int(sys.argv[6]))])
for i in range(4):
    fp.submit(h, i, timeout_ms=600000)
print("submitted", flush=True)
time.sleep(600)
"""

    def test_killed_worker_leaves_nothing(self):
        keys = self.key_file()
        a = self.sidecar("a", key_file=keys)
        b = self.metrics_sidecar("b", key_file=keys)
        self.assertEqual(self.gauge(b, "rdma_sidecar_fast_path_sessions"), 0)
        size = 256 * KiB
        ra, rb = a.create_region(size), b.create_region(size)
        ro = a.stub.CreateReadable(pb.CreatePassiveRequest(
            descriptors=[pb.Descriptor(region_id=ra.region_id, offset=0, length=size)], any_uses=True,
            timeout_ms=int(300000 * SLOW)), timeout=10)
        a.pause()
        try:
            self.kill_worker(a, b, ro, rb, size)
        finally:
            a.proc.send_signal(signal.SIGCONT)
        self.assertEqual(b.info().sidecar_id, "b")

    def kill_worker(self, a, b, ro, rb, size):
        w = subprocess.Popen([sys.executable, "-c", self.WORKER, os.path.join(ROOT, "clients", "python"),
                              os.path.abspath(STUBS), "unix:" + b.sock, ro.metadata, rb.region_id, str(size)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = w.stdout.readline()
            self.assertEqual(line.strip(), "submitted", w.stderr.read() if w.poll() is not None else line)

            def runs():
                return [o for o in b.stub.ListOperations(pb.ListOperationsRequest(), timeout=10).operations
                        if o.kind in (pb.OPERATION_KIND_READ, pb.OPERATION_KIND_WRITE)
                        and o.status not in (pb.OPERATION_STATUS_COMPLETE, pb.OPERATION_STATUS_CANCELLED,
                                             pb.OPERATION_STATUS_ERRORED)]
            wait_until(lambda: len(runs()) == 4, 10, "the worker's four runs in flight")
            self.assertEqual(self.gauge(b, "rdma_sidecar_fast_path_sessions"), 1)
        finally:
            w.kill()
            w.communicate()
        wait_until(lambda: not runs(), 20, "the killed worker's runs to end")
        wait_until(lambda: self.gauge(b, "rdma_sidecar_fast_path_sessions") == 0, 20, "its session to go")

    def test_prepare_errors_as_grpc(self):
        """PREPARE is checked as BeginRead is (the metadata, the descriptors against it, the
        regions): each bad one is refused at once with the code gRPC gives, and nothing runs."""
        s = self.sidecar("solo")
        fp = self.fast(s, require_ring=True)
        r = s.create_region(8192)
        ro = s.stub.CreateReadable(pb.CreatePassiveRequest(
            descriptors=[pb.Descriptor(region_id=r.region_id, offset=0, length=4096)], any_uses=True), timeout=10)
        self.addCleanup(lambda: s.proc.poll() is None and s.stub.ReleaseOperation(
            pb.ReleaseOperationRequest(operation_id=ro.operation_id), timeout=10))
        cases = {"descriptor count": (ro.metadata, [(r.region_id, 0, 2048), (r.region_id, 2048, 2048)]),
                 "descriptor length": (ro.metadata, [(r.region_id, 4096, 100)]),
                 "unknown region": (ro.metadata, [("rgn-nosuch", 0, 4096)]),
                 "outside the region": (ro.metadata, [(r.region_id, 8000, 4096)]),
                 "garbage metadata": ("rsm1.garbage", [(r.region_id, 4096, 4096)])}
        wrong = []
        for name, (meta, descs) in cases.items():
            with self.assertRaises(grpc.RpcError) as g:
                s.stub.BeginRead(pb.BeginTransferRequest(metadata=meta, descriptors=[
                    pb.Descriptor(region_id=a, offset=b, length=c) for a, b, c in descs]), timeout=10)
            want = g.exception.code().value[0]
            try:
                h = fp.prepare(READ, meta, descs)
            except rs.SidecarError as e:
                if e.code.value[0] != want:
                    wrong.append("%s: PREPARE answered %s (%s), BeginRead %s" % (
                        name, e.code.name, e.message, g.exception.code().name))
                continue
            c = fp.run(h)
            wrong.append("%s: PREPARE accepted it (handle %d), BeginRead %s; its RUN: code %d status %d (%s)"
                         % (name, h, g.exception.code().name, c.code, c.status, c.message))
        with self.assertRaises(rs.NotFoundError):
            fp.unprepare(987654)
        self.assertEqual(wrong, [])

    def test_max_sessions(self):
        s = self.sidecar("few", extra=["--fast-path-max-sessions", "2"])
        first, second = self.fast(s, require_ring=True), self.fast(s, require_ring=True)
        with self.assertRaises(rs.ResourceExhaustedError):
            rs.FastPath.open("unix:" + s.sock, require_ring=True)
        first.close()
        m = Move(self, s, s, 4097, 2, READ)
        wait_until(lambda: self.try_open(s), 10, "a session after one closed")
        m.check(second, m.prepare(second), rs.Backend.LOCAL, "a run of the second session")

    def try_open(self, s):
        try:
            self.fast(s, require_ring=True)
            return True
        except rs.ResourceExhaustedError:
            return False

    def test_sidecar_stops_with_a_session_open(self):
        """SIGTERM with a worker's session open (idle, a handle prepared): the sidecar exits 0
        and the worker's next wait says the session ended."""
        s = self.sidecar("solo")
        fp = self.fast(s, require_ring=True)
        m = Move(self, s, s, 4097, 2, READ)
        h = m.prepare(fp)
        m.check(fp, h, rs.Backend.LOCAL)
        self.assertEqual(s.stop(), 0)
        with self.assertRaises(rs.UnavailableError):
            fp.run(h)

    def test_sidecar_stops_with_a_small_run_on_the_session_thread(self):
        """SIGTERM while a small run (on the session's own thread) waits for a stopped peer: the
        grace period ends the wait, the run is cancelled, and the sidecar exits 0 long before the
        run's own deadline (600 s)."""
        keys = self.key_file()
        a = self.sidecar("a", key_file=keys)
        b = self.sidecar("b", key_file=keys, extra=["--grace-period", "1s"])
        fp = self.fast(b, require_ring=True)
        m = Move(self, a, b, 64 * KiB, 2, READ)
        h = m.prepare(fp)
        m.check(fp, h, rs.Backend.TCP, "the first run")  # warm: the next runs on the session thread
        a.pause()
        try:
            fp.submit(h, 1, timeout_ms=600000)
            time.sleep(0.2)
            t0 = time.monotonic()
            self.assertEqual(b.stop(timeout=30), 0)
            self.assertLess(time.monotonic() - t0, 30 * SLOW)
        finally:
            a.proc.send_signal(signal.SIGCONT)
        # the worker hears of the end: the run's completion (cancelled) or the session's end
        try:
            got = fp.reap(timeout_ms=5000)
            self.assertTrue(got and got[0].user_data == 1 and got[0].code != 0, got)
        except rs.UnavailableError:
            pass

    # ---- hostile workers ----------------------------------------------------------------------

    def test_random_sqes_and_garbage_prepare(self):
        s = self.sidecar("solo")
        fp = self.fast(s, require_ring=True)
        m = Move(self, s, s, 4097, 3, READ)
        h = m.prepare(fp)
        sent = []
        for _ in range(min(fp.sq_entries, 32)):
            e = bytearray(os.urandom(64))
            sent.append(struct.unpack_from("<Q", e)[0])
            fp._post(bytes(e))
        got = self.reap_all(fp, sent)
        for ud in sent:
            self.assertEqual((got[ud].code, got[ud].status), (3, 0), got[ud])
        # a well-formed RUN of a handle this session does not hold: NOT_FOUND
        fp._post(fast.pack_sqe(77, fast.OP_RUN, h + 1000))
        self.assertEqual(self.reap_all(fp, [77])[77].code, 5)
        # a PREPARE whose header is right and whose body is garbage: RESULT INVALID_ARGUMENT
        for body in (os.urandom(200), struct.pack("<IIQII", 3, 0, 0, 1 << 30, 1) + os.urandom(64)):
            msg = struct.pack("<IIQ", fast.MSG_PREPARE, 16 + len(body), 4242) + body
            token, code, _h, _n, message = fp._request(msg)
            self.assertEqual((token, code), (4242, 3), message)
        m.check(fp, h, rs.Backend.LOCAL, "a good run after the garbage")

    def test_impossible_sq_tail_ends_only_that_session(self):
        s = self.sidecar("solo")
        bad, good = self.fast(s, require_ring=True), self.fast(s, require_ring=True)
        m = Move(self, s, s, 4097, 2, WRITE)
        hb, hg = m.prepare(bad), m.prepare(good)
        bad._u32[fast.CTL_SQ_TAIL] = (bad._u32[fast.CTL_SQ_HEAD] + bad.sq_entries + 5) & 0xFFFFFFFF
        os.write(bad._sq_efd, (1).to_bytes(8, "little"))
        with self.assertRaises(rs.UnavailableError):
            bad.reap(timeout_ms=int(10000 * SLOW))
        wait_until(lambda: "ended: the worker broke its submission ring" in s.read_log(), 10, "the end in the log")
        self.assertRegex(s.read_log(), r"WARN  \[fast\] session of pid %d: .*; ending the session" % os.getpid())
        m.check(good, hg, rs.Backend.LOCAL, "the other session's run")
        del hb

    def test_a_worker_that_stops_reaping_stops_only_itself(self):
        s = self.sidecar("solo")
        lazy, other = self.fast(s, require_ring=True), self.fast(s, require_ring=True)
        m = Move(self, s, s, 4096, 1, READ)
        h = m.prepare(lazy)
        submitted, stuck_since = 0, None
        while True:  # until the submission ring stays full for half a second
            try:
                lazy.submit(h, submitted)
                submitted += 1
                stuck_since = None
            except rs.ResourceExhaustedError:
                stuck_since = stuck_since or time.monotonic()
                if time.monotonic() - stuck_since > 0.5 * SLOW:
                    break
                time.sleep(0.01)
            self.assertLess(submitted, 10 * (lazy.cq_entries + lazy.sq_entries), "the sidecar never stopped")
        taken = lazy._u32[fast.CTL_SQ_HEAD]
        self.assertEqual(taken, lazy.cq_entries, "taken while the completion ring is full")
        self.assertEqual(submitted, lazy.cq_entries + lazy.sq_entries)
        self.assertEqual(lazy._u32[fast.CTL_CQ_TAIL], lazy.cq_entries)
        # another session of this process is served meanwhile
        m2 = Move(self, s, s, 65 * KiB + 1, 5, WRITE)
        h2 = m2.prepare(other)
        for i in range(3):
            m2.check(other, h2, rs.Backend.LOCAL, "run %d of the other session" % i)
        self.assertEqual(lazy._u32[fast.CTL_SQ_HEAD], taken)
        # once it reads its completions the rest are served
        got = self.reap_all(lazy, range(taken), timeout=10)
        wait_until(lambda: lazy._u32[fast.CTL_SQ_HEAD] != taken, 10,
                   "the sidecar to take the submissions waiting behind the full completion ring, once the "
                   "worker read its completions")
        got.update(self.reap_all(lazy, range(taken, submitted), timeout=30))
        self.assertTrue(all(c.code == 0 and c.bytes == 4096 for c in got.values()),
                        [c for c in got.values() if c.code][:3])

    def test_sealed_ring_memory(self):
        s = self.sidecar("solo")
        fp = self.fast(s, require_ring=True)
        with self.assertRaises(PermissionError):
            os.ftruncate(fp._memfd, 0)
        with self.assertRaises(PermissionError):
            os.ftruncate(fp._memfd, fp.map_size * 2)
        m = Move(self, s, s, 4097, 1, WRITE)
        h = m.prepare(fp)
        m.check(fp, h, rs.Backend.LOCAL, "a run after the ftruncate")
        other = self.fast(s, require_ring=True)
        m.check(other, m.prepare(other), rs.Backend.LOCAL, "a run of a new session")

    # ---- access -------------------------------------------------------------------------------

    OUTSIDER = r"""
import sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import rdma_sidecar as rs, rdma_sidecar.sync
try:
    fp = rs.FastPath.open(sys.argv[3], require_ring=True)
    print("FAST", fp.mode)
except rs.SidecarError as e:
    print("FAST-ERR", type(e).__name__, e.message)
except OSError as e:
    print("FAST-OSERR", e)
try:
    print("GRPC", rs.sync.Connector(sys.argv[3]).info().sidecar_id)
except rs.SidecarError as e:
    print("GRPC-ERR", e.code.name)
"""

    def outsider(self, s, uid):
        def drop():
            os.setgid(uid)
            os.setuid(uid)
        r = subprocess.run([sys.executable, "-c", self.OUTSIDER, os.path.join(ROOT, "clients", "python"),
                            os.path.abspath(STUBS), "unix:" + s.sock], capture_output=True, text=True,
                           timeout=60 * SLOW, preexec_fn=drop)
        return r.stdout.strip().splitlines(), r.stderr

    def test_allowed_uids(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to run a worker as another uid")
        os.chmod(self.workdir, 0o755)
        s = self.sidecar("au", extra=["--allowed-uids", "0", "--unix-socket-mode", "0666"])
        os.chmod(os.path.dirname(s.sock), 0o755)
        self.assertEqual(os.stat(s.sock + ".fast").st_mode & 0o777, 0o666, "--unix-socket-mode on the fast socket")
        out, err = self.outsider(s, 65534)
        self.assertEqual(len(out), 2, err)
        self.assertEqual(out[0], "FAST-ERR PermissionDeniedError fast path %s.fast refused: uid 65534 may not use "
                         "this sidecar (--allowed-uids does not list it)" % s.sock, out)
        self.assertEqual(out[1], "GRPC-ERR PERMISSION_DENIED", out)
        # root (in the list) gets both; the sidecar still serves
        fp = self.fast(s, require_ring=True)
        self.assertEqual(fp.mode, "ring")
        # without the list the same outsider gets in: the refusal above was the uid check
        t = self.sidecar("open", extra=["--unix-socket-mode", "0666"])
        os.chmod(os.path.dirname(t.sock), 0o755)
        out, err = self.outsider(t, 65534)
        self.assertEqual(out, ["FAST ring", "GRPC open"], err)


if __name__ == "__main__":
    main()
