#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 8 finding 4: a worker cannot crash the daemon. CreateRegion larger than the shm file system
answers RESOURCE_EXHAUSTED with the free space; a region file truncated behind the sidecar's back
fails ReadRegion, WriteRegion and LOCAL and TCP transfers with a clear error, and the daemon keeps
serving (no SIGBUS)."""
import os
import shutil
import subprocess
import sys
import tempfile

import grpc

from harness import SidecarTest, desc, main, pb

MiB = 1 << 20


class ShmFullTest(SidecarTest):
    def setUp(self):
        super().setUp()
        self.mnt = tempfile.mkdtemp(prefix="sc-tmpfs-", dir="/tmp")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", self.mnt],
                           capture_output=True, timeout=30)
        if r.returncode != 0:
            os.rmdir(self.mnt)
            self.skipTest("cannot mount a tmpfs (needs root): %s" % r.stderr.decode().strip())
        self.addCleanup(shutil.rmtree, self.mnt, True)
        self.addCleanup(subprocess.run, ["umount", "-l", self.mnt], timeout=30)

    def test_create_larger_than_shm(self):
        s = self.sidecar("a", extra=["--shm-dir", self.mnt])
        e = self.assertRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, s.create_region, 128 * MiB,
                                contains="does not fit: the file system of --shm-dir " + self.mnt)
        self.assertIn("bytes free", e.details())
        first = s.create_region(40 * MiB)
        # 40 + 40 > 64: refused, whether by the free-space check or by posix_fallocate.
        self.assertRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, s.create_region, 40 * MiB,
                            contains="does not fit")
        self.assertEqual(sorted(os.listdir(self.mnt)), [os.path.basename(first.path)],
                         "a refused region must leave no file behind")
        # The region that fit is fully usable: every page can be read back (no SIGBUS).
        data = os.urandom(MiB)
        s.fill(first, 39 * MiB, data)
        got = b"".join(m.data for m in s.stub.ReadRegion(
            pb.ReadRegionRequest(region_id=first.region_id, offset=39 * MiB, length=MiB), timeout=30))
        self.assertEqual(got, data)
        self.assertEqual(s.info().sidecar_id, "a")
        self.assertEqual(s.stop(), 0)


class TruncatedRegionTest(SidecarTest):
    def truncated(self, s, size=4 * MiB, keep=MiB):
        r = s.create_region(size)
        s.fill(r, 0, os.urandom(size))
        os.truncate(r.path, keep)
        return r

    def assertAlive(self, s):
        self.assertIsNone(s.proc.poll(), "sidecar died:\n" + s.read_log()[-3000:])
        self.assertEqual(s.info().sidecar_id, s.name)

    def test_read_and_write_region(self):
        s = self.sidecar("a")
        r = self.truncated(s)
        # Inside what is left: still fine.
        got = b"".join(m.data for m in s.stub.ReadRegion(
            pb.ReadRegionRequest(region_id=r.region_id, offset=0, length=4096), timeout=10))
        self.assertEqual(len(got), 4096)
        self.assertRpcError(grpc.StatusCode.FAILED_PRECONDITION, lambda: list(s.stub.ReadRegion(
            pb.ReadRegionRequest(region_id=r.region_id, offset=0, length=4 * MiB), timeout=10)),
            contains="no longer backed (file truncated?)")
        self.assertAlive(s)
        self.assertRpcError(grpc.StatusCode.FAILED_PRECONDITION, s.stub.WriteRegion, iter([
            pb.WriteRegionRequest(region_id=r.region_id, offset=3 * MiB, data=b"x" * 4096)]),
            timeout=10, contains="no longer backed")
        self.assertEqual(os.path.getsize(r.path), MiB, "nothing may grow the truncated file")
        self.assertAlive(s)
        # Twice on the same threads: the guard is re-armed after a caught fault.
        for _ in range(3):
            self.assertRpcError(grpc.StatusCode.FAILED_PRECONDITION, lambda: list(s.stub.ReadRegion(
                pb.ReadRegionRequest(region_id=r.region_id, offset=2 * MiB, length=4096), timeout=10)))
        self.assertAlive(s)

    def check_transfer(self, src, dst, direction, backend):
        """src's region is truncated; the transfer must end ERRORED and both daemons live on."""
        rs = self.truncated(src)
        rd = dst.create_region(4 * MiB)
        before = dst.peek(rd, 0, 4 * MiB)
        if direction == "read":
            p = src.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(rs, 0, 4 * MiB)]),
                                        timeout=10)
            op = dst.stub.BeginRead(pb.BeginTransferRequest(metadata=p.metadata,
                                                            descriptors=[desc(rd, 0, 4 * MiB)]), timeout=10)
        else:
            p = src.stub.CreateWritable(pb.CreatePassiveRequest(descriptors=[desc(rs, 0, 4 * MiB)]),
                                        timeout=10)
            op = dst.stub.BeginWrite(pb.BeginTransferRequest(metadata=p.metadata,
                                                             descriptors=[desc(rd, 0, 4 * MiB)]), timeout=10)
        done = dst.wait(op.operation_id, timeout_ms=30000)
        self.assertEqual(done.status, pb.OPERATION_STATUS_ERRORED, done)
        self.assertEqual(done.backend, backend)
        passive = src.wait(p.operation_id, timeout_ms=30000)
        self.assertIn(passive.status, (pb.OPERATION_STATUS_ERRORED, pb.OPERATION_STATUS_CANCELLED), passive)
        self.assertAlive(src)
        self.assertAlive(dst)
        if direction == "write":
            self.assertEqual(os.path.getsize(rs.path), MiB, "nothing may grow the truncated file")
        return done

    def test_local_transfer(self):
        s = self.sidecar("a")
        for direction in ("read", "write"):
            done = self.check_transfer(s, s, direction, pb.BACKEND_LOCAL)
            self.assertIn("no longer backed", done.error.message)

    def test_tcp_transfer(self):
        keys = self.key_file()
        a, b = self.sidecar("a", key_file=keys), self.sidecar("b", key_file=keys)
        for direction in ("read", "write"):
            self.check_transfer(a, b, direction, pb.BACKEND_TCP)


if __name__ == "__main__":
    sys.exit(main())
