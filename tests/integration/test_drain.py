# SPDX-License-Identifier: Apache-2.0
"""Issue 8, finding 7: SIGTERM and the grace period. Real sidecars, real gRPC clients.

- a passive sidecar SIGTERMed while a peer reads from it lets the read finish (every byte right)
  within --grace-period and exits 0; so does the active side of a read;
- a passive operation no peer has begun (INITIALIZED) does not hold shutdown;
- after a large answer the client refused (ListOperations over its message limit), SIGTERM still
  exits at once (gRPC's backup poller used to hold exit for 10 s)."""
import hashlib
import os
import signal
import time

import grpc
from harness import SLOW, SidecarTest, desc, main, pb, rpc
from netns import Net, can_run

BIG = int(os.environ.get("SC_DRAIN_BYTES", str(256 << 20)))
# The read between the two sidecars crosses a veth pair a token bucket holds to RATE: BIG then takes
# at least 7 s by construction (so SIGTERM finds it moving whatever this machine's speed), and
# finishes well within the 20 s grace period on anything that moves 15 MB/s.
RATE = os.environ.get("SC_DRAIN_RATE", "300mbit")


def sha_of(path, length):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        left = length
        while left:
            b = f.read(min(left, 8 << 20))
            if not b:
                break
            h.update(b)
            left -= len(b)
    return h.hexdigest()


class DrainTest(SidecarTest):
    def stop_timed(self, s):
        t0 = time.monotonic()
        code = s.stop(signal.SIGTERM, timeout=30)
        return code, time.monotonic() - t0

    def start_big_read(self, grace_side):
        """Sidecars pa (passive, a readable of BIG random-ish bytes) and pb (active, BeginRead into
        its own region); the one named grace_side gets --grace-period 20s. Returns once the read
        is in progress and not yet done."""
        keys = self.key_file()
        why = can_run(iptables=False)
        if why:
            self.skipTest(why)
        net = Net(RATE)
        self.addCleanup(net.close)
        grace = ["--grace-period", "20s"]
        a, b = [self.sidecar(n, key_file=keys, tcp=False, data_listen=addr + ":0", prefix=("ip", "netns", "exec", ns),
                             extra=grace if grace_side == n else [])
                for n, ns, addr in zip(("pa", "pb"), net.ns, net.addr)]
        ra, rb = a.create_region(BIG), b.create_region(BIG)
        # not zeros: a random block, each copy stamped with its index
        block = bytearray(os.urandom(8 << 20))
        with open(ra.path, "r+b") as f:
            for i in range(BIG // len(block)):
                block[:8] = i.to_bytes(8, "little")
                f.write(block)
        with open(rb.path, "r+b") as f:
            f.write(os.urandom(4096))  # the target starts different
        want = sha_of(ra.path, BIG)
        passive = a.stub.CreateReadable(pb.CreatePassiveRequest(
            descriptors=[desc(ra, 0, BIG)], timeout_ms=120000), timeout=30)
        op = b.stub.BeginRead(pb.BeginTransferRequest(
            metadata=passive.metadata, descriptors=[desc(rb, 0, BIG)], timeout_ms=120000), timeout=30)
        end = time.monotonic() + 30 * SLOW
        while time.monotonic() < end:
            st = a.stub.GetOperation(pb.GetOperationRequest(operation_id=passive.operation_id),
                                     timeout=5).status
            if st != pb.OPERATION_STATUS_INITIALIZED:
                break
            time.sleep(0.005)
        self.assertEqual(st, pb.OPERATION_STATUS_IN_PROGRESS, "the read did not start")
        cut = b.stub.GetOperation(pb.GetOperationRequest(operation_id=op.operation_id), timeout=5)
        self.assertLess(cut.bytes_done, BIG, "the throttled read ended before SIGTERM")
        return a, b, ra, rb, passive, op, want, cut.bytes_done

    def test_passive_read_finishes_within_grace(self):
        a, b, ra, rb, passive, op, want, at = self.start_big_read("pa")
        code, took = self.stop_timed(a)
        done = b.wait(op.operation_id, 60000)
        self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
        self.assertEqual(done.bytes_done, BIG)
        self.assertEqual(code, 0, a.read_log()[-3000:])
        self.assertLess(took, 20 * SLOW)
        self.assertIn("%s READABLE COMPLETE" % passive.operation_id, a.read_log())
        self.assertEqual(sha_of(rb.path, BIG), want, "bytes differ after the drained read")
        print("drained passive: SIGTERM at %d of %d bytes, passive exited after %.2fs"
              % (at, BIG, took))

    def test_active_read_finishes_within_grace(self):
        a, b, ra, rb, passive, op, want, at = self.start_big_read("pb")
        # b removes its region files when it exits: keep the target open to check it afterwards
        with open(rb.path, "rb") as target:
            code, took = self.stop_timed(b)
            self.assertEqual(code, 0, b.read_log()[-3000:])
            self.assertLess(took, 20 * SLOW)
            self.assertIn("%s READ COMPLETE" % op.operation_id, b.read_log())
            p = a.wait(passive.operation_id, 30000)
            self.assertEqual(p.status, pb.OPERATION_STATUS_COMPLETE, p.error.message)
            h = hashlib.sha256()
            for chunk in iter(lambda: target.read(8 << 20), b""):
                h.update(chunk)
            self.assertEqual(h.hexdigest(), want, "bytes differ after the drained read")
        print("drained active: SIGTERM at %d of %d bytes, active exited after %.2fs" % (at, BIG, took))

    def test_initialized_readable_does_not_hold_shutdown(self):
        a = self.sidecar("idle", key_file=self.key_file(), extra=["--grace-period", "30s"])
        r = a.create_region(1 << 20)
        p = a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(r, 0, 1 << 20)],
                                                          timeout_ms=600000), timeout=10)
        self.assertEqual(p.status, pb.OPERATION_STATUS_INITIALIZED)
        code, took = self.stop_timed(a)
        self.assertEqual(code, 0)
        # ~0.3 s here; the bound leaves room for a loaded machine and stays far below the 30 s
        # grace period an INITIALIZED readable used to be able to hold
        self.assertLess(took, 3 * SLOW, "an INITIALIZED readable held shutdown %.1fs" % took)
        print("idle INITIALIZED readable: exit after %.2fs" % took)

    def test_refused_oversized_answer_then_sigterm_exits_quickly(self):
        a = self.sidecar("big", key_file=self.key_file(), extra=["--grace-period", "30s"])
        r = a.create_region(1 << 20)
        for _ in range(2000):  # ~5 MB of ListOperations: far more than a socket buffer holds
            a.stub.CreateReadable(pb.CreatePassiveRequest(
                descriptors=[desc(r, j * 16, 16) for j in range(64)]), timeout=10)
        with grpc.insecure_channel("unix:" + a.sock,
                                   options=[("grpc.max_receive_message_length", 1000)]) as ch:
            err = self.assertRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                      rpc.SidecarStub(ch).ListOperations,
                                      pb.ListOperationsRequest(), timeout=30)
            self.assertIn("larger than max", err.details())
            code, took = self.stop_timed(a)
        self.assertEqual(code, 0)
        self.assertLess(took, 3 * SLOW, "shutdown after a refused large answer took %.1fs" % took)
        print("refused oversized answer: exit after %.2fs" % took)


if __name__ == "__main__":
    main()
