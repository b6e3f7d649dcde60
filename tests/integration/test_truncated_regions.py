#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 32 items 5 and 6: a worker that truncates its own region file never kills the daemon.

The worker (this test) shrinks a region file behind the sidecar's back, then a transfer touches
the lost pages. The 4 x 2 matrix, READ and WRITE x the truncated region on the active or the
passive side, on every path where the CPU or the kernel copies region memory:

- plain TCP, 4 KiB (the passive side takes a small WRITE's bytes from its read-ahead buffer) and
  1 MiB (straight from the socket into region memory, EFAULT half way);
- peer TLS without kernel offload (SSL_read / SSL_write through the bounce buffer), both sizes;
- LOCAL (both ends in one sidecar: the guarded copy);
- the fast path (the Python client's rings), against a TCP peer and LOCAL;
- GPU staging: LOCAL between a GPU region (the stand-in CUDA driver) and the truncated host region
  (the pinned buffer filled and drained by the guarded copy).

Every case: the transfer ends ERRORED with a message that names the truncated region, both
daemons still answer GetInfo, nothing grew the truncated file, and a following honest transfer of
the same kind and size on fresh regions moves random bytes correctly. Before the fix the passive
side of a small plain WRITE and every TLS direction died of SIGBUS."""
import os
import shutil
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.environ.get("SC_SOURCE_DIR", os.path.join(HERE, "..", "..")))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from harness import SLOW, SidecarTest, desc, main, pb  # noqa: E402
from tlsutil import CA  # noqa: E402

FAKE_CUDA = os.environ.get("SC_FAKE_CUDA", "")  # ctest sets it where the stand-in driver was built
KiB, MiB = 1 << 10, 1 << 20
ERRORED = pb.OPERATION_STATUS_ERRORED
TIMEOUT_MS = int(30000 * SLOW)

# transfer size -> (region size, what is left of the file after the worker truncates it): the
# 4 KiB transfer loses every byte, the 1 MiB one its second half (the copy faults half way).
SHAPES = {4 * KiB: (64 * KiB, 0), MiB: (2 * MiB, MiB // 2)}


class Matrix(SidecarTest):
    maxDiff = None

    # ---- sidecars ---------------------------------------------------------------------------------

    def alive(self, *sidecars):
        for s in sidecars:
            if s.proc.poll() is not None:
                self.fail("sidecar %s died (exit %s):\n%s" % (s.name, s.proc.returncode, s.read_log()[-3000:]))
            self.assertEqual(s.info().sidecar_id, s.name)

    def revive(self, pair, start):
        """A pair whose sidecars all live: a dead one (the old SIGBUS) fails its case, and the
        next case starts on fresh sidecars, so that one run reports every case."""
        if all(s.proc.poll() is None for s in pair):
            return pair
        for s in pair:
            s.expect_nonzero = True  # already reported by the case it died in
            s.kill()
        return start()

    def op(self, s, op_id):
        return s.stub.GetOperation(pb.GetOperationRequest(operation_id=op_id), timeout=10 * SLOW)

    # ---- one transfer ----------------------------------------------------------------------------

    # Truncate the region file after the passive operation exists (and before the Begin) rather
    # than before it is created: ibverbs registers a passive operation's memory at creation, and
    # memory already gone cannot be registered (the metadata then offers tcp only).
    TRUNCATE_AFTER_CREATE = False

    def begin(self, passive, active, kind, rp, ra, offset, size, between=None):
        create = passive.stub.CreateReadable if kind == "read" else passive.stub.CreateWritable
        po = create(pb.CreatePassiveRequest(descriptors=[desc(rp, offset, size)], timeout_ms=TIMEOUT_MS),
                    timeout=10 * SLOW)
        if between:
            between()
        begin = active.stub.BeginRead if kind == "read" else active.stub.BeginWrite
        op = begin(pb.BeginTransferRequest(metadata=po.metadata, descriptors=[desc(ra, offset, size)],
                                           timeout_ms=TIMEOUT_MS), timeout=10 * SLOW)
        return po, op

    def region(self, s, size, gpu=False):
        if not gpu:
            return s.create_region(size)
        return s.stub.CreateRegion(pb.CreateRegionRequest(size=size, device_kind=pb.DEVICE_KIND_CUDA),
                                   timeout=30 * SLOW)

    def put(self, s, r, data):
        if r.device_kind == pb.DEVICE_KIND_CUDA:
            s.stub.WriteRegion(iter([pb.WriteRegionRequest(region_id=r.region_id, offset=0, data=data)]),
                               timeout=30 * SLOW)
        else:
            s.fill(r, 0, data)

    def get(self, s, r, n):
        if r.device_kind == pb.DEVICE_KIND_CUDA:
            return b"".join(m.data for m in s.stub.ReadRegion(
                pb.ReadRegionRequest(region_id=r.region_id, offset=0, length=n), timeout=30 * SLOW))
        return s.peek(r, 0, n)

    def truncated(self, s, size, now=True):
        region_size, keep = SHAPES[size]
        r = s.create_region(region_size)
        s.fill(r, 0, os.urandom(region_size))
        if now:
            os.truncate(r.path, keep)  # the worker shrinks its own file
        return r, keep

    def honest(self, passive, active, kind, size, backend, gpu_side=None):
        """Fresh regions (the one on gpu_side in GPU memory), random bytes, compared."""
        rp, ra = self.region(passive, size, gpu_side == "passive"), self.region(active, size, gpu_side == "active")
        payload, noise = os.urandom(size), os.urandom(size)
        src, dst = (passive, rp), (active, ra)
        if kind == "write":
            src, dst = dst, src
        self.put(src[0], src[1], payload)
        self.put(dst[0], dst[1], noise)
        po, op = self.begin(passive, active, kind, rp, ra, 0, size)
        done = active.wait(op.operation_id, TIMEOUT_MS)
        self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
        self.assertEqual(done.backend, backend)
        self.assertTrue(self.get(dst[0], dst[1], size) == payload,
                        "the honest %s of %d bytes after the truncation moved wrong bytes" % (kind, size))
        for s, r in ((passive, rp), (active, ra)):
            s.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=r.region_id, force=True),
                                    timeout=10 * SLOW)

    def check(self, passive, active, kind, side, size, backend, gpu=False):
        """One case of the matrix: the region of `side` ("active" or "passive") is truncated; the
        other one is in GPU memory when gpu."""
        owner = active if side == "active" else passive
        late = self.TRUNCATE_AFTER_CREATE
        bad, keep = self.truncated(owner, size, now=not late)
        good = self.region(passive if side == "active" else active, SHAPES[size][0], gpu)
        rp, ra = (good, bad) if side == "active" else (bad, good)
        po, op = self.begin(passive, active, kind, rp, ra, 0, size,
                            between=(lambda: os.truncate(bad.path, keep)) if late else None)
        done = active.wait(op.operation_id, TIMEOUT_MS)
        self.alive(passive, active)
        self.assertEqual(done.status, ERRORED, done)
        self.assertEqual(done.backend, backend, done)
        self.assertIn('region "%s" was truncated by its owner' % bad.region_id, done.error.message)
        if side == "passive":
            pdone = passive.wait(po.operation_id, TIMEOUT_MS)
            self.assertEqual(pdone.status, ERRORED, pdone)
            self.assertIn('region "%s" was truncated by its owner' % bad.region_id, pdone.error.message)
        else:
            # The active side probes its ranges before it asks the peer: nothing moved, and the
            # passive operation is not used up.
            self.assertEqual(done.bytes_done, 0, done)
            self.assertEqual(self.op(passive, po.operation_id).status, pb.OPERATION_STATUS_INITIALIZED)
        self.assertEqual(os.path.getsize(bad.path), keep, "nothing may grow the truncated file")
        self.alive(passive, active)
        self.honest(passive, active, kind, size, backend,
                    gpu_side=("passive" if side == "active" else "active") if gpu else None)
        self.alive(passive, active)

    def matrix(self, start, sizes, backend, gpu=False):
        pair = start()
        for size in sizes:
            for kind in ("read", "write"):
                for side in ("active", "passive"):
                    with self.subTest(size=size, kind=kind, truncated=side):
                        pair = self.revive(pair, start)
                        self.check(pair[0], pair[1], kind, side, size, backend, gpu)

    # ---- transports -------------------------------------------------------------------------------

    def test_tcp(self):
        keys = self.key_file()
        n = iter(range(1000))

        def start():
            i = next(n)
            return self.sidecar("a%d" % i, key_file=keys), self.sidecar("b%d" % i, key_file=keys)
        self.matrix(start, (4 * KiB, MiB), pb.BACKEND_TCP)

    def test_peer_tls(self):
        keys, ca = self.key_file(), CA(self.workdir, "cluster")
        n = iter(range(1000))

        def start():
            i = next(n)
            return tuple(self.sidecar("%s%d" % (x, i), key_file=keys, extra=ca.peer_flags("%s%d" % (x, i)))
                         for x in "ab")
        self.matrix(start, (4 * KiB, MiB), pb.BACKEND_TCP)

    def test_local(self):
        n = iter(range(1000))

        def start():
            s = self.sidecar("solo%d" % next(n))
            return s, s
        self.matrix(start, (4 * KiB, MiB), pb.BACKEND_LOCAL)

    def test_active_begin_truncated(self):
        """BeginRead/BeginWrite over many descriptors, spread round-robin over several local
        regions, one of which the worker truncated below the highest byte the operation uses
        there: the operation ends ERRORED at once naming that region (and no other), before the
        peer is asked, so the passive operation is not used up and its metadata then serves an
        honest transfer of random bytes. 3 regions, and 10 (past the probe's table on the
        stack). Plain TCP. Before: the transfer started, the passive side served or took bytes up
        to the fault, and the metadata was spent ("already used")."""
        keys = self.key_file()
        a, b = self.sidecar("a", key_file=keys), self.sidecar("b", key_file=keys)
        piece, n_desc = 64, 16384
        for n_regions in (3, 10):
            for kind in ("read", "write"):
                with self.subTest(regions=n_regions, kind=kind):
                    per = n_desc // n_regions + 1  # descriptors per region, at most
                    rp = a.create_region(n_desc * piece)
                    pdescs = [desc(rp, i * piece, piece) for i in range(n_desc)]
                    create = a.stub.CreateReadable if kind == "read" else a.stub.CreateWritable
                    po = create(pb.CreatePassiveRequest(descriptors=pdescs, timeout_ms=TIMEOUT_MS),
                                timeout=30 * SLOW)

                    def layout(regions):
                        # descriptor i: region i % n, slot i // n of it
                        return [desc(regions[i % n_regions], (i // n_regions) * piece, piece)
                                for i in range(n_desc)]
                    ras = [b.create_region(per * piece) for _ in range(n_regions)]
                    bad = ras[n_regions // 2]
                    keep = (per // 2) * piece  # its first half stays: the lowest byte is backed
                    os.truncate(bad.path, keep)
                    begin = b.stub.BeginRead if kind == "read" else b.stub.BeginWrite
                    op = begin(pb.BeginTransferRequest(metadata=po.metadata, descriptors=layout(ras),
                                                       timeout_ms=TIMEOUT_MS), timeout=30 * SLOW)
                    done = b.wait(op.operation_id, TIMEOUT_MS)
                    self.alive(a, b)
                    self.assertEqual(done.status, ERRORED, done.error)
                    self.assertIn('region "%s" was truncated by its owner' % bad.region_id, done.error.message)
                    for r in ras:
                        if r is not bad:
                            self.assertNotIn(r.region_id, done.error.message)
                    self.assertEqual(done.bytes_done, 0)
                    self.assertEqual(os.path.getsize(bad.path), keep, "nothing may grow the truncated file")
                    self.assertEqual(self.op(a, po.operation_id).status, pb.OPERATION_STATUS_INITIALIZED,
                                     "the passive operation was touched by a Begin that could not start")
                    # The same metadata, fresh local regions: the honest transfer.
                    good = [b.create_region(per * piece) for _ in range(n_regions)]
                    payload = os.urandom(n_desc * piece)
                    if kind == "read":
                        a.fill(rp, 0, payload)
                    else:
                        a.fill(rp, 0, os.urandom(len(payload)))
                        for k, r in enumerate(good):  # slot j of region k: descriptor j * n + k
                            b.fill(r, 0, b"".join(payload[(j * n_regions + k) * piece:
                                                          (j * n_regions + k + 1) * piece]
                                                  for j in range(per)))
                    op = begin(pb.BeginTransferRequest(metadata=po.metadata, descriptors=layout(good),
                                                       timeout_ms=TIMEOUT_MS), timeout=30 * SLOW)
                    done = b.wait(op.operation_id, TIMEOUT_MS)
                    self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error)
                    self.assertEqual(a.wait(po.operation_id, TIMEOUT_MS).status, pb.OPERATION_STATUS_COMPLETE)
                    if kind == "read":
                        got = b"".join(b.peek(good[i % n_regions], (i // n_regions) * piece, piece)
                                       for i in range(n_desc))
                    else:
                        got = a.peek(rp, 0, n_desc * piece)
                    self.assertTrue(got == payload, "the honest %s after the refusal moved wrong bytes" % kind)
                    self.alive(a, b)

    def test_truncated_mid_transfer(self):
        """The file shrinks while the bytes move (after the serving side's check of the range):
        the copy or the system call faults half way. No SIGBUS, the transfer ends (ERRORED, or
        COMPLETE when it won the race), and the next one works. Plain TCP and TLS."""
        keys, ca = self.key_file(), CA(self.workdir, "mid")
        size = 128 * MiB
        for tls in (False, True):
            flags = (lambda n: ca.peer_flags(n)) if tls else (lambda n: [])
            a = self.sidecar("mid-a%d" % tls, key_file=keys, extra=flags("mid-a%d" % tls))
            b = self.sidecar("mid-b%d" % tls, key_file=keys, extra=flags("mid-b%d" % tls))
            for kind in ("read", "write"):
                for side in ("active", "passive"):
                    with self.subTest(tls=tls, kind=kind, truncated=side):
                        rp, ra = a.create_region(size), b.create_region(size)
                        bad = ra if side == "active" else rp
                        po, op = self.begin(a, b, kind, rp, ra, 0, size)
                        time.sleep(0.005)
                        os.truncate(bad.path, MiB)
                        done = b.wait(op.operation_id, TIMEOUT_MS)
                        self.alive(a, b)
                        self.assertIn(done.status, (ERRORED, pb.OPERATION_STATUS_COMPLETE), done)
                        pdone = a.wait(po.operation_id, TIMEOUT_MS)
                        self.assertIn(pdone.status, (ERRORED, pb.OPERATION_STATUS_COMPLETE), pdone)
                        self.honest(a, b, kind, MiB, pb.BACKEND_TCP)
                        for s_, r in ((a, rp), (b, ra)):
                            s_.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=r.region_id,
                                                                                force=True), timeout=10 * SLOW)

    @unittest.skipUnless(FAKE_CUDA and os.path.exists(FAKE_CUDA),
                         "the stand-in CUDA driver was not built (no cuda.h at build time)")
    def test_gpu_staging_local(self):
        shm = tempfile.mkdtemp(prefix="sc-trunc-gpu-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.addCleanup(shutil.rmtree, shm, True)
        env = {"SC_TEST_CUDA_DRIVER": FAKE_CUDA, "FAKE_CUDA_SHM_DIR": shm}
        n = iter(range(1000))

        def start():
            s = self.sidecar("gpu%d" % next(n), env=env)
            return s, s
        self.matrix(start, (4 * KiB, MiB), pb.BACKEND_LOCAL, gpu=True)

    # ---- the fast path ----------------------------------------------------------------------------

    def fast_check(self, fp, passive, active, kind, side, size):
        import rdma_sidecar as rs
        rkind = rs.OperationKind.READ if kind == "read" else rs.OperationKind.WRITE
        owner = active if side == "active" else passive
        bad, keep = self.truncated(owner, size)
        good = (passive if side == "active" else active).create_region(SHAPES[size][0])
        rp, ra = (good, bad) if side == "active" else (bad, good)
        create = passive.stub.CreateReadable if kind == "read" else passive.stub.CreateWritable
        po = create(pb.CreatePassiveRequest(descriptors=[desc(rp, 0, size)], timeout_ms=TIMEOUT_MS),
                    timeout=10 * SLOW)
        h = fp.prepare(rkind, po.metadata, [(ra.region_id, 0, size)])
        c = fp.run(h)
        fp.unprepare(h)
        self.alive(passive, active)
        self.assertEqual(c.status, ERRORED, c)
        self.assertNotEqual(c.code, 0, c)
        # The completion's message is short (fast_ring.h): the region's name comes first.
        self.assertIn(bad.region_id, c.message)
        self.assertEqual(os.path.getsize(bad.path), keep, "nothing may grow the truncated file")
        # An honest run on fresh regions.
        rp2, ra2 = passive.create_region(size), active.create_region(size)
        payload = os.urandom(size)
        src, dst = ((passive, rp2), (active, ra2)) if kind == "read" else ((active, ra2), (passive, rp2))
        src[0].fill(src[1], 0, payload)
        dst[0].fill(dst[1], 0, os.urandom(size))
        po2 = create(pb.CreatePassiveRequest(descriptors=[desc(rp2, 0, size)], timeout_ms=TIMEOUT_MS),
                     timeout=10 * SLOW)
        h = fp.prepare(rkind, po2.metadata, [(ra2.region_id, 0, size)])
        c = fp.run(h)
        fp.unprepare(h)
        self.assertEqual((c.code, c.status), (0, pb.OPERATION_STATUS_COMPLETE), c)
        self.assertTrue(dst[0].peek(dst[1], 0, size) == payload, "the honest fast-path %s moved wrong bytes" % kind)
        self.alive(passive, active)

    def fast_matrix(self, start):
        import rdma_sidecar as rs

        def session(pair):
            return rs.FastPath.open("unix:" + pair[1].sock, require_ring=True)
        pair = start()
        fp = session(pair)
        try:
            for size in (4 * KiB, MiB):
                for kind in ("read", "write"):
                    for side in ("active", "passive"):
                        with self.subTest(size=size, kind=kind, truncated=side):
                            if any(s.proc.poll() is not None for s in pair):
                                fp.close()
                                pair = self.revive(pair, start)
                                fp = session(pair)
                            self.fast_check(fp, pair[0], pair[1], kind, side, size)
        finally:
            fp.close()  # before the sidecars stop

    def test_fast_path_tcp(self):
        keys = self.key_file()
        n = iter(range(1000))

        def start():
            i = next(n)
            return self.sidecar("a%d" % i, key_file=keys), self.sidecar("b%d" % i, key_file=keys)
        self.fast_matrix(start)

    def test_fast_path_local(self):
        n = iter(range(1000))

        def start():
            s = self.sidecar("solo%d" % next(n))
            return s, s
        self.fast_matrix(start)


# ---- ibverbs (the Soft-RoCE VM: tests/vm/guest-test.sh runs this class) --------------------------

RXE_DEV = os.environ.get("RXE_DEV", "")  # set only inside the VM, which has the device


@unittest.skipUnless(RXE_DEV, "no RDMA device: runs in the Soft-RoCE VM (ctest vm.softroce)")
class IbverbsMatrix(Matrix):
    """The same matrix on real verbs (Soft-RoCE): the NIC moves region memory, the CPU never
    does, so nothing can fault; the MR pins the pages, so without a check a transfer on a
    truncated region would move the stale pages and COMPLETE. The active side probes its ranges
    when the transfer starts, the passive side at OPEN and again when the use completes (the
    completion notice or DONE): each ends ERRORED naming the region. The file shrinks after the
    passive operation is created (TRUNCATE_AFTER_CREATE): shrunk before, its memory cannot be
    registered, so the metadata offers tcp only and the tcp matrix covers it."""

    TRUNCATE_AFTER_CREATE = True

    def ib_start(self):
        keys = self.key_file()
        n = iter(range(1000))
        ip, gid = os.environ.get("RXE_IP", "10.99.0.1"), os.environ.get("RXE_GID_INDEX", "1")
        flags = ["--ib-device", RXE_DEV, "--ib-gid-index", gid, "--data-listen", ip + ":0",
                 "--advertise", ip, "--backends", "ibverbs,tcp"]

        def start():
            i = next(n)
            return (self.sidecar("a%d" % i, key_file=keys, extra=flags),
                    self.sidecar("b%d" % i, key_file=keys, extra=flags))
        return start

    # The matrix's transports do not apply here.
    test_tcp = test_peer_tls = test_local = test_truncated_mid_transfer = None
    test_active_begin_truncated = test_gpu_staging_local = None
    test_fast_path_tcp = test_fast_path_local = None

    def test_ibverbs(self):
        """READ and WRITE x truncated on the active or the passive side, before the Begin."""
        self.matrix(self.ib_start(), (4 * KiB, MiB), pb.BACKEND_IBVERBS)

    def test_ibverbs_truncated_during_transfer(self):
        """The file shrinks while the NIC moves the bytes (after the passive side's check at
        OPEN): the pinned old pages take them, nothing faults. A passive side still moving when
        its file shrank ends ERRORED naming the region (its check at completion) instead of
        COMPLETE; the active side ends either way. An active file that shrinks mid-transfer is
        the worker's own loss: no check, but no daemon dies. Then an honest transfer."""
        a, b = self.ib_start()()
        for kind in ("read", "write"):
            for side in ("passive", "active"):
                with self.subTest(kind=kind, truncated=side):
                    self.during(a, b, kind, side)
                    self.alive(a, b)
                    self.honest(a, b, kind, MiB, pb.BACKEND_IBVERBS)
                    self.alive(a, b)

    def during(self, a, b, kind, side):
        for size in (64 * MiB, 192 * MiB):  # a bigger one when the first ended before the cut
            rp, ra = a.create_region(size), b.create_region(size)
            bad = rp if side == "passive" else ra
            po, op = self.begin(a, b, kind, rp, ra, 0, size)
            watch = (a, po.operation_id) if side == "passive" else (b, op.operation_id)
            end = time.monotonic() + 60 * SLOW
            while self.op(*watch).status not in (pb.OPERATION_STATUS_IN_PROGRESS, ERRORED,
                                                 pb.OPERATION_STATUS_COMPLETE) and time.monotonic() < end:
                time.sleep(0.005)
            os.truncate(bad.path, MiB)
            moving = self.op(*watch).status == pb.OPERATION_STATUS_IN_PROGRESS
            done = b.wait(op.operation_id, TIMEOUT_MS * 4)
            pdone = a.wait(po.operation_id, TIMEOUT_MS * 4)
            self.alive(a, b)
            self.assertIn(done.status, (ERRORED, pb.OPERATION_STATUS_COMPLETE), done)
            self.assertEqual(os.path.getsize(bad.path), MiB, "nothing may grow the truncated file")
            for s_, r in ((a, rp), (b, ra)):
                s_.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=r.region_id, force=True),
                                         timeout=10 * SLOW)
            if side == "active":
                self.assertIn(pdone.status, (ERRORED, pb.OPERATION_STATUS_COMPLETE), pdone)
                return
            if moving:  # it completes after the cut: its check at completion sees it
                self.assertEqual(pdone.status, ERRORED, pdone)
                self.assertIn('region "%s" was truncated by its owner' % bad.region_id, pdone.error.message)
                if done.status == ERRORED:
                    self.assertIn(bad.region_id, done.error.message)
                return
        self.fail("a %s transfer of %d bytes ended before its passive file could be cut" % (kind, size))


if __name__ == "__main__":
    sys.exit(main())
