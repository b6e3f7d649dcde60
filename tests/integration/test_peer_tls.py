# SPDX-License-Identifier: Apache-2.0
"""Issue 8 finding 3: TLS 1.3 on the peer data channel (--peer-tls-cert/-key/-ca).

Two real sidecars with certificates made at test time by the openssl CLI move random data both
ways with every byte compared; a sidecar without TLS, or with a certificate from another CA, is
refused on both sides with UNAVAILABLE and a message that says what to configure, and nothing is
read or written; garbage sent to a TLS data port disturbs nothing."""
import os
import socket
import struct
import time

import grpc
from harness import SLOW, SidecarTest, desc, main, pb, wait_until
from tlsutil import CA

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]


class PeerTlsTest(SidecarTest):
    def setUp(self):
        super().setUp()
        self.ca = CA(self.workdir, "cluster")
        self.keys = self.key_file()

    def tls_sidecar(self, name, ca=None, trust=None, extra=()):
        ca = ca or self.ca
        return self.sidecar(name, key_file=self.keys,
                            extra=ca.peer_flags(name, trust=trust) + list(extra))

    def transfer(self, passive, active, size, direction, timeout_ms=60000):
        """Returns (active op, passive op, passive region bytes before, active region, passive
        region, payload)."""
        rp, ra = passive.create_region(size + 10), active.create_region(size + 10)
        noise_p, noise_a = os.urandom(size + 10), os.urandom(size + 10)
        passive.fill(rp, 0, noise_p)
        active.fill(ra, 0, noise_a)
        create = passive.stub.CreateReadable if direction == "read" else passive.stub.CreateWritable
        po = create(pb.CreatePassiveRequest(descriptors=[desc(rp, 3, size)], timeout_ms=timeout_ms),
                    timeout=10 * SLOW)
        begin = active.stub.BeginRead if direction == "read" else active.stub.BeginWrite
        op = begin(pb.BeginTransferRequest(metadata=po.metadata, descriptors=[desc(ra, 7, size)],
                                           timeout_ms=timeout_ms), timeout=10 * SLOW)
        done = active.wait(op.operation_id, timeout_ms)
        return done, po, rp, ra, noise_p, noise_a

    def check_moved(self, passive, active, size, direction):
        done, po, rp, ra, noise_p, noise_a = self.transfer(passive, active, size, direction)
        self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
        self.assertEqual(done.bytes_done, size)
        if direction == "read":
            expect = bytearray(noise_a)
            expect[7:7 + size] = noise_p[3:3 + size]
            self.assertTrue(active.peek(ra, 0, size + 10) == bytes(expect), "READ bytes differ")
            self.assertTrue(passive.peek(rp, 0, size + 10) == noise_p, "source changed")
        else:
            expect = bytearray(noise_p)
            expect[3:3 + size] = noise_a[7:7 + size]
            self.assertTrue(passive.peek(rp, 0, size + 10) == bytes(expect), "WRITE bytes differ")
            self.assertTrue(active.peek(ra, 0, size + 10) == noise_a, "source changed")
        self.assertEqual(passive.wait(po.operation_id, 20000).status, pb.OPERATION_STATUS_COMPLETE)

    def check_refused(self, passive, active, direction, contains):
        """The transfer fails with UNAVAILABLE and a message containing `contains`; the
        receiving region is untouched."""
        t0 = time.monotonic()
        done, po, rp, ra, noise_p, noise_a = self.transfer(passive, active, 1 << 20, direction,
                                                           timeout_ms=30000)
        self.assertEqual(done.status, pb.OPERATION_STATUS_ERRORED)
        self.assertEqual(done.error.code, UNAVAILABLE, done.error.message)
        self.assertIn(contains, done.error.message)
        # refused at once, not after retrying until the operation's deadline
        self.assertLess(time.monotonic() - t0, 15 * SLOW, done.error.message)
        self.assertTrue(passive.peek(rp, 0, (1 << 20) + 10) == noise_p, "passive region changed")
        self.assertTrue(active.peek(ra, 0, (1 << 20) + 10) == noise_a, "active region changed")
        return done

    def test_read_and_write_over_tls(self):
        a, b = self.tls_sidecar("a"), self.tls_sidecar("b")
        for size in (1, 4097, (8 << 20) + 5):
            for direction in ("read", "write"):
                with self.subTest(size=size, direction=direction):
                    self.check_moved(a, b, size, direction)
        # several streams and small chunks: many TLS connections, pooled and reused
        c = self.tls_sidecar("c", extra=["--tcp-streams", "4", "--tcp-chunk-size", "64KiB"])
        self.check_moved(a, c, (3 << 20) + 1, "read")
        self.check_moved(c, a, (3 << 20) + 1, "write")
        # GetInfo and the log say how the channel is protected
        detail = [r.detail for r in b.info().backends if r.backend == pb.BACKEND_TCP][0]
        self.assertIn("peer TLS: ", detail)
        self.assertTrue("kTLS" in detail or "userspace" in detail, detail)
        self.assertIn("peer TLS: ", b.read_log())

    def test_plain_peer_refused_by_tls_port(self):
        a = self.tls_sidecar("a")
        plain = self.sidecar("plain", key_file=self.keys)
        for direction in ("read", "write"):
            with self.subTest(direction=direction):
                self.check_refused(a, plain, direction, "requires TLS")
        wait_until(lambda: "speaks plain TCP but this data port requires TLS" in a.read_log(), 10,
                   "the TLS side to log the refusal")

    def test_tls_peer_refused_by_plain_port(self):
        a = self.tls_sidecar("a")
        plain = self.sidecar("plain", key_file=self.keys)
        for direction in ("read", "write"):
            with self.subTest(direction=direction):
                self.check_refused(plain, a, direction, "TLS handshake")
        wait_until(lambda: "a TLS handshake: the peer uses --peer-tls-*" in plain.read_log(), 10,
                   "the plain side to log the refusal")

    def test_certificate_from_another_ca_refused(self):
        a = self.tls_sidecar("a")
        other = CA(self.workdir, "other")
        # b trusts the cluster CA but presents a certificate from another CA: a refuses it
        b = self.tls_sidecar("b", ca=other, trust=self.ca)
        done = self.check_refused(a, b, "read", "TLS")
        self.assertIn("unknown ca", done.error.message)
        wait_until(lambda: "does not verify against --peer-tls-ca" in a.read_log(), 10,
                   "a to log why it refused b's certificate")
        # c holds another CA's certificate and trusts only that CA: it refuses a's certificate
        c = self.tls_sidecar("c", ca=other)
        done = self.check_refused(a, c, "write", "does not verify against --peer-tls-ca")
        # the cluster pair still works
        d = self.tls_sidecar("d")
        self.check_moved(a, d, 100000, "read")

    def test_garbage_to_tls_data_port(self):
        a, b = self.tls_sidecar("a"), self.tls_sidecar("b")
        host, port = a.info().data_endpoints[0].rsplit(":", 1)
        port = int(port)
        # 1. a plain HELLO-looking frame: told in plain framing that TLS is required
        with socket.create_connection((host, port), timeout=5 * SLOW) as s:
            s.sendall(struct.pack("<BBHI", 1, 1, 0, 4) + b"RSMP")
            got = b""
            s.settimeout(5 * SLOW)
            while True:
                part = s.recv(4096)
                if not part:
                    break
                got += part
            self.assertEqual(got[0:2], bytes([1, 5]), got)  # version 1, ERROR frame
            self.assertIn(b"requires TLS", got)
        # 2. random bytes, 3. a fake TLS record, 4. a connection that says nothing
        junk = []
        for payload in (os.urandom(3000), b"\x16\x03\x01\x00\x05hello" + os.urandom(100), b""):
            s = socket.create_connection((host, port), timeout=5 * SLOW)
            if payload:
                s.sendall(payload)
            junk.append(s)
        self.check_moved(a, b, (2 << 20) + 3, "read")
        self.check_moved(a, b, (2 << 20) + 3, "write")
        for s in junk:
            s.close()
        self.assertIsNone(a.proc.poll())


if __name__ == "__main__":
    main()
