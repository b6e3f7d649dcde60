# SPDX-License-Identifier: Apache-2.0
"""Access ends with the operation on the libfabric backend (tcp;ofi_rxm on loopback, real
libfabric): a passive operation's remote key is closed (fi_close of its MR) when it completes, is
cancelled, passes its deadline, is released or its region is force-deregistered. A peer that kept
the metadata and uses the key directly, with no OPEN (tests/ofi/ofi_probe.c), reads the bytes while
the operation is live and is refused by the provider afterwards; a write with an old key changes
nothing. Then the active side against a SIGSTOPped peer (cancel and deadline end in bounded time)
and a dead one (UNAVAILABLE naming it), the sidecar staying healthy."""
import os
import signal
import subprocess
import time

import urllib.request

from harness import SidecarTest, desc, free_port, main, pb, wait_until

OFI = ["--backends", "tcp,libfabric", "--ofi-provider", "tcp;ofi_rxm", "--ofi-domains", "lo"]
PROBE = os.path.join(os.path.dirname(os.environ.get("SC_BINARY", "build/rdma-sidecar")),
                     "tests", "ofi-probe")


class OfiRevocationTest(SidecarTest):
    def setUp(self):
        super().setUp()
        self.keys = self.key_file()
        self.mport = free_port()
        self.a = self.sidecar("a", key_file=self.keys,
                              extra=OFI + ["--metrics-listen", "127.0.0.1:%d" % self.mport])
        self.b = self.sidecar("b", key_file=self.keys, extra=OFI)
        self.n = 0

    def probe(self, metadata, op="read", offset=0, length=32, fill=0x5a):
        self.n += 1
        path = os.path.join(self.workdir, "md%d" % self.n)
        with open(path, "w") as f:
            f.write(metadata)
        r = subprocess.run([PROBE, "--key-file", self.keys, "--metadata-file", path,
                            "--provider", "tcp;ofi_rxm", "--domain", "lo", "--op", op,
                            "--offset", str(offset), "--len", str(length), "--fill", str(fill),
                            "--timeout-ms", "3000"],
                           capture_output=True, text=True, timeout=30)
        return r.returncode, (r.stdout + r.stderr).strip()

    def readable(self, region, off, ln, timeout_ms=60000):
        return self.a.stub.CreateReadable(pb.CreatePassiveRequest(
            descriptors=[desc(region, off, ln)], timeout_ms=timeout_ms), timeout=30)

    def assertRefused(self, metadata, what, op="read"):
        code, out = self.probe(metadata, op=op)
        self.assertEqual(code, 3, "%s: the old key still works: %s" % (what, out))
        self.assertTrue(out.startswith("REFUSED "), out)
        print("figure: %s: the old key is refused: %s" % (what, out))

    def test_all(self):
        self.check_key_lifetimes()
        self.check_stopped_peer()
        self.check_dead_peer()

    def check_key_lifetimes(self):
        a, b = self.a, self.b
        ra = a.create_region(1 << 20)
        rb = b.create_region(1 << 20)
        data = os.urandom(1 << 20)
        a.fill(ra, 0, data)

        # live: the key reads the exposed bytes
        op = self.readable(ra, 4099, 8191)
        code, out = self.probe(op.metadata, offset=10, length=32)
        self.assertEqual(code, 0, out)
        self.assertEqual(out, "OK " + data[4109:4141].hex())

        # complete
        done = b.stub.BeginRead(pb.BeginTransferRequest(
            metadata=op.metadata, descriptors=[desc(rb, 1, 8191)], timeout_ms=30000, wait=True,
            backend=pb.BACKEND_LIBFABRIC), timeout=60)
        self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
        self.assertEqual(b.peek(rb, 1, 8191), data[4099:4099 + 8191])
        self.assertEqual(a.wait(op.operation_id, 10000).status, pb.OPERATION_STATUS_COMPLETE)
        self.assertRefused(op.metadata, "after COMPLETE")

        # cancel
        op = self.readable(ra, 0, 4096)
        self.assertEqual(self.probe(op.metadata)[0], 0)
        a.stub.CancelOperation(pb.CancelOperationRequest(operation_id=op.operation_id), timeout=10)
        self.assertRefused(op.metadata, "after CancelOperation")

        # deadline
        op = self.readable(ra, 0, 4096, timeout_ms=1000)
        self.assertEqual(self.probe(op.metadata)[0], 0)
        wait_until(lambda: a.stub.GetOperation(pb.GetOperationRequest(
            operation_id=op.operation_id), timeout=5).status == pb.OPERATION_STATUS_ERRORED,
            10, "the readable to expire")
        self.assertRefused(op.metadata, "after the deadline")

        # release
        op = self.readable(ra, 0, 4096)
        self.assertEqual(self.probe(op.metadata)[0], 0)
        a.stub.ReleaseOperation(pb.ReleaseOperationRequest(operation_id=op.operation_id), timeout=10)
        self.assertRefused(op.metadata, "after ReleaseOperation")

        # forced deregistration
        rd = a.create_region(64 << 10)
        a.fill(rd, 0, data[:64 << 10])
        op = self.readable(rd, 0, 4096)
        self.assertEqual(self.probe(op.metadata)[0], 0)
        a.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=rd.region_id, force=True),
                                timeout=10)
        self.assertRefused(op.metadata, "after a forced DeregisterRegion")

        # a writable's old key writes nothing
        wop = a.stub.CreateWritable(pb.CreatePassiveRequest(
            descriptors=[desc(ra, 65536, 4096)], timeout_ms=60000), timeout=30)
        a.stub.CancelOperation(pb.CancelOperationRequest(operation_id=wop.operation_id), timeout=10)
        before = a.peek(ra, 65536, 4096)
        self.assertRefused(wop.metadata, "a WRITE after CancelOperation", op="write")
        self.assertEqual(a.peek(ra, 65536, 4096), before)
        self.assertEqual(before, data[65536:65536 + 4096])
        # every key granted was closed: nothing left open once every operation ended
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.mport, timeout=5).read().decode()
        keys = {l.split('"')[1]: int(l.split()[-1]) for l in text.splitlines()
                if l.startswith("rdma_sidecar_ofi_keys_total{")}
        self.assertEqual(keys["granted"], 6, keys)  # 6 operations, one region span each, one rail
        self.assertEqual(keys["revoked"], keys["granted"], keys)

    def check_stopped_peer(self):
        """Cancel and the deadline end the active side in bounded time while its peer is
        SIGSTOPped; the peer, resumed, still serves."""
        a, b = self.a, self.b
        ra = a.create_region(4 << 20)
        rb = b.create_region(4 << 20)
        op1 = self.readable(ra, 0, 4 << 20)
        op2 = self.readable(ra, 0, 4 << 20)
        a.pause()
        try:
            t0 = time.monotonic()
            act = b.stub.BeginRead(pb.BeginTransferRequest(
                metadata=op1.metadata, descriptors=[desc(rb, 0, 4 << 20)], timeout_ms=60000,
                backend=pb.BACKEND_LIBFABRIC), timeout=30)
            time.sleep(0.3)
            b.stub.CancelOperation(pb.CancelOperationRequest(operation_id=act.operation_id),
                                   timeout=10)
            got = b.wait(act.operation_id, 10000)
            self.assertEqual(got.status, pb.OPERATION_STATUS_CANCELLED, got.error.message)
            self.assertLess(time.monotonic() - t0, 8)
            t0 = time.monotonic()
            got = b.stub.BeginRead(pb.BeginTransferRequest(
                metadata=op2.metadata, descriptors=[desc(rb, 0, 4 << 20)], timeout_ms=1500,
                wait=True, backend=pb.BACKEND_LIBFABRIC), timeout=30)
            self.assertEqual(got.status, pb.OPERATION_STATUS_ERRORED)
            self.assertEqual(got.error.code, 4, got.error.message)  # DEADLINE_EXCEEDED
            self.assertLess(time.monotonic() - t0, 8)
        finally:
            a.proc.send_signal(signal.SIGCONT)
        # b still moves bytes with a
        data = os.urandom(100000)
        a.fill(ra, 3, data)
        op = self.readable(ra, 3, 100000)
        done = b.stub.BeginRead(pb.BeginTransferRequest(
            metadata=op.metadata, descriptors=[desc(rb, 5, 100000)], timeout_ms=30000, wait=True,
            backend=pb.BACKEND_LIBFABRIC), timeout=60)
        self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
        self.assertEqual(b.peek(rb, 5, 100000), data)

    def check_dead_peer(self):
        """A dead issuer: the read keeps trying to reach it until its deadline (as over tcp), then
        ends UNAVAILABLE saying so; b stays healthy."""
        a, b = self.a, self.b
        ra = a.create_region(1 << 20)
        rb = b.create_region(1 << 20)
        op = self.readable(ra, 0, 1 << 20)
        a.kill()
        self._procs.remove(a)
        t0 = time.monotonic()
        got = b.stub.BeginRead(pb.BeginTransferRequest(
            metadata=op.metadata, descriptors=[desc(rb, 0, 1 << 20)], timeout_ms=3000, wait=True,
            backend=pb.BACKEND_LIBFABRIC), timeout=60)
        self.assertEqual(got.status, pb.OPERATION_STATUS_ERRORED)
        self.assertEqual(got.error.code, 14, got.error.message)  # UNAVAILABLE
        self.assertIn("cannot reach peer sidecar", got.error.message)
        self.assertLess(time.monotonic() - t0, 8)
        self.assertTrue(b.info().backends)


if __name__ == "__main__":
    main()
