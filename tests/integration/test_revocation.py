# SPDX-License-Identifier: Apache-2.0
"""Access ends when a passive operation ends, on TCP, against a peer that holds the cluster key and
trickles (tests/integration/peer_client.py speaks the peer protocol by hand):

- WRITE side: the peer OPENs a writable, sends a WRITEV header for the whole 1 MiB descriptor and
  4 KiB of it, then keeps sending 100 bytes at a time. The operation ends (CancelOperation,
  ReleaseOperation, its deadline, or DeregisterRegion with force) and the worker refills the
  region with its own data: not one byte the peer sends afterwards lands (bytes compared), and the
  peer's connection is closed within CUT_BOUND seconds.
- READ side: a 64 MiB readable; the peer asks for all of it in one READV and reads 64 KiB at a
  time. The operation ends (deadline, cancel, release); the worker writes a secret into the region;
  everything the peer can still drain is the original data, never a byte of the secret, and the
  connection ends within CUT_BOUND seconds.

The slowness is made by construction (the test's own peer decides when to send or read), never by
a size guessed to be slow."""
import os
import random
import socket
import time

from harness import SLOW, SidecarTest, desc, main, pb, wait_until
from peer_client import PEER_READ, PEER_WRITE, WRITEV, Peer, metadata_token

KiB, MiB = 1 << 10, 1 << 20
CUT_BOUND = 2.0 * SLOW + 1.0  # seconds from the operation's end to the peer seeing its connection end
KEY = os.urandom(32)


class RevocationTest(SidecarTest):
    def setUp(self):
        super().setUp()
        self.a = self.sidecar("a", key_file=self.key_file(keys=[("k1", KEY)]))
        host, port = self.a.info().data_endpoints[0].rsplit(":", 1)
        self.peer_addr = (host, int(port))

    def peer(self):
        return Peer(*self.peer_addr, "k1", KEY)

    def end_op(self, how, op, region):
        """End the passive operation the way `how` says; returns once the worker may reuse it."""
        a = self.a
        if how == "cancel":
            got = a.stub.CancelOperation(pb.CancelOperationRequest(operation_id=op.operation_id), timeout=10)
            self.assertEqual(got.status, pb.OPERATION_STATUS_CANCELLED, got)
            a.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=op.operation_id), timeout=10)
        elif how == "release":
            a.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=op.operation_id), timeout=10)
        elif how == "deadline":
            got = a.wait(op.operation_id, 30000)
            self.assertEqual(got.status, pb.OPERATION_STATUS_ERRORED, got)
            self.assertIn("deadline", got.error.message)
            a.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=op.operation_id), timeout=10)
        elif how == "deregister":
            a.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=region.region_id, force=True),
                                    timeout=10)
            got = a.wait(op.operation_id, 0)
            self.assertEqual(got.status, pb.OPERATION_STATUS_CANCELLED, got)
            self.assertIn("deregistered with force", got.error.message)
        else:
            raise ValueError(how)

    def exposed(self, kind, region_size, offset, size, timeout_ms):
        """A region of random bytes, the worker's own handle on its file (valid after a
        deregistration too), and a passive operation of `kind` over [offset, offset+size) that
        a hand-written peer has OPENed. Returns (region, fd, bytes, op, peer, token, xfer id)."""
        a = self.a
        r = a.create_region(region_size)
        fd = os.open(r.path, os.O_RDWR)
        self.addCleanup(os.close, fd)
        data = os.urandom(region_size)
        os.pwrite(fd, data, 0)
        create = a.stub.CreateReadable if kind == PEER_READ else a.stub.CreateWritable
        op = create(pb.CreatePassiveRequest(descriptors=[desc(r, offset, size)], timeout_ms=timeout_ms),
                    timeout=10)
        p = self.peer()
        self.addCleanup(p.sock.close)
        token, xid = metadata_token(op.metadata), random.getrandbits(64)
        p.open(token, xid, kind, size)
        return r, fd, data, op, p, token, xid

    def assert_cut_within(self, sock, since, bound):
        """The sidecar ends the connection: a read sees EOF or a reset within `bound` of `since`."""
        sock.settimeout(0.2)
        while True:
            try:
                if not sock.recv(1 << 20):
                    break
            except socket.timeout:
                pass
            except (ConnectionResetError, BrokenPipeError):
                break
            self.assertLess(time.monotonic() - since, bound, "the connection was not cut")
        took = time.monotonic() - since
        self.assertLess(took, bound)
        return took

    # ---- WRITE side -------------------------------------------------------------------------

    def trickle_write(self, how):
        size = 1 * MiB
        r, fd, _, op, p, token, xid = self.exposed(PEER_WRITE, size + 8 * KiB, 4096, size,
                                                   int(1500 * SLOW) if how == "deadline" else 60000)
        p.pieces_frame(WRITEV, token, xid, [(0, 0, size)])
        first = os.urandom(4 * KiB)
        p.sock.sendall(first)
        # The sidecar is receiving into the region: the first 4 KiB landed.
        wait_until(lambda: os.pread(fd, 4 * KiB, 4096) == first, 10 * SLOW, "the first 4 KiB to land")

        self.end_op(how, op, r)
        ended = time.monotonic()
        mine = os.urandom(size)
        os.pwrite(fd, mine, 4096)  # the worker reuses its memory
        sent = 0
        try:
            for _ in range(30):  # 3,000 bytes, slowly
                p.sock.sendall(os.urandom(100))
                sent += 100
                time.sleep(0.01)
        except (BrokenPipeError, ConnectionResetError):
            pass
        time.sleep(0.1)
        self.assertEqual(os.pread(fd, size, 4096), mine, "peer bytes landed after the operation ended")
        took = self.assert_cut_within(p.sock, ended, CUT_BOUND)
        print("  write, %s: %d bytes sent after the end, none landed; connection cut after %.3f s"
              % (how, sent, took))

    def test_write_after_cancel(self):
        self.trickle_write("cancel")

    def test_write_after_release(self):
        self.trickle_write("release")

    def test_write_after_deadline(self):
        self.trickle_write("deadline")

    def test_write_after_forced_deregistration(self):
        self.trickle_write("deregister")

    # ---- READ side --------------------------------------------------------------------------

    def trickle_read(self, how):
        a = self.a
        size = 64 * MiB
        r, fd, original, op, p, token, xid = self.exposed(PEER_READ, size, 0, size,
                                                          int(2000 * SLOW) if how == "deadline" else 60000)
        self.assertEqual(p.readv_start(token, xid, [(0, 0, size)]), size)
        got = bytearray()
        for _ in range(5):  # 64 KiB at a time, slowly
            got += p.recv_exact(64 * KiB)
            time.sleep(0.1)
        self.assertEqual(a.wait(op.operation_id, 0).status, pb.OPERATION_STATUS_IN_PROGRESS)

        self.end_op(how, op, r)
        ended = time.monotonic()
        secret = os.urandom(size)
        os.pwrite(fd, secret, 0)
        # Drain what the peer can still get: only what left the region before the end.
        p.sock.settimeout(0.2)
        cut = False
        while time.monotonic() - ended < CUT_BOUND:
            try:
                chunk = p.sock.recv(1 << 20)
            except socket.timeout:
                continue
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                cut = True
                break
            got += chunk
        took = time.monotonic() - ended
        self.assertEqual(bytes(got), original[:len(got)], "the peer read bytes written after the end")
        self.assertLess(len(got), size, "the whole readable was served after it ended")
        self.assertTrue(cut, "the connection was not cut within %.1f s" % CUT_BOUND)
        print("  read, %s: the peer got %d of %d bytes, all from before the end; cut after %.3f s"
              % (how, len(got), size, took))

    def test_read_after_deadline(self):
        self.trickle_read("deadline")

    def test_read_after_cancel(self):
        self.trickle_read("cancel")

    def test_read_after_release(self):
        self.trickle_read("release")


if __name__ == "__main__":
    main()
