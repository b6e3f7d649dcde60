# SPDX-License-Identifier: Apache-2.0
"""Bad input and faults, each checked by status code and message: nothing hangs, no bytes move
where they must not, and the sidecars keep serving afterwards."""
import os
import signal
import socket
import struct
import threading
import time

import grpc
from harness import SLOW, SidecarTest, desc, main, pb, wait_until
from netns import Net, can_run

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND


def code(c):
    return c.value[0]


class FaultTest(SidecarTest):
    def pair(self, extra=()):
        keys = self.key_file()
        a = self.sidecar("a", key_file=keys, extra=extra)
        b = self.sidecar("b", key_file=keys, extra=extra)
        return a, b

    def readable(self, side, size=4096, **kw):
        r = side.create_region(size)
        data = os.urandom(size)
        side.fill(r, 0, data)
        op = side.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(r, 0, size)], **kw), timeout=10)
        return r, data, op

    def begin_read(self, side, md, region, size, **kw):
        return side.stub.BeginRead(pb.BeginTransferRequest(metadata=md, descriptors=[desc(region, 0, size)], **kw),
                                   timeout=10)

    def assert_still_serves(self, *sides):
        for s in sides:
            r, data, op = self.readable(s, 999)
            dst = s.create_region(999)
            act = self.begin_read(s, op.metadata, dst, 999)
            self.assertEqual(s.wait(act.operation_id).status, pb.OPERATION_STATUS_COMPLETE)
            self.assertEqual(s.peek(dst, 0, 999), data)

    # ---- malformed requests ------------------------------------------------------------------

    def test_descriptor_errors(self):
        a, b = self.pair()
        r = a.create_region(1000)
        cr = a.stub.CreateReadable
        self.assertRpcError(INVALID, cr, pb.CreatePassiveRequest(descriptors=[desc(r, 900, 101)]), timeout=5,
                            contains="outside region")
        self.assertRpcError(INVALID, cr, pb.CreatePassiveRequest(descriptors=[desc(r, 1001, 1)]), timeout=5)
        self.assertRpcError(INVALID, cr, pb.CreatePassiveRequest(
            descriptors=[pb.Descriptor(region_id=r.region_id, offset=2**64 - 1, length=2)]), timeout=5)
        self.assertRpcError(INVALID, cr, pb.CreatePassiveRequest(descriptors=[desc(r, 0, 0)]), timeout=5,
                            contains="length 0")
        self.assertRpcError(INVALID, cr, pb.CreatePassiveRequest(descriptors=[]), timeout=5,
                            contains="at least one descriptor")
        self.assertRpcError(NOT_FOUND, cr, pb.CreatePassiveRequest(
            descriptors=[pb.Descriptor(region_id="rgn-nope", offset=0, length=1)]), timeout=5, contains="rgn-nope")
        # active side: count and length mismatches, local bounds
        _, _, ro = self.readable(a, 4096)
        rb = b.create_region(8192)
        br = b.stub.BeginRead
        self.assertRpcError(INVALID, br, pb.BeginTransferRequest(
            metadata=ro.metadata, descriptors=[desc(rb, 0, 2048), desc(rb, 2048, 2048)]), timeout=5,
            contains="count mismatch")
        self.assertRpcError(INVALID, br, pb.BeginTransferRequest(
            metadata=ro.metadata, descriptors=[desc(rb, 0, 4095)]), timeout=5, contains="length mismatch")
        self.assertRpcError(INVALID, br, pb.BeginTransferRequest(
            metadata=ro.metadata, descriptors=[desc(rb, 8000, 4096)]), timeout=5, contains="outside region")
        self.assertRpcError(INVALID, b.stub.BeginWrite, pb.BeginTransferRequest(
            metadata=ro.metadata, descriptors=[desc(rb, 0, 4096)]), timeout=5, contains="CreateWritable")
        # none of that used the metadata: it still works
        op = self.begin_read(b, ro.metadata, rb, 4096)
        self.assertEqual(b.wait(op.operation_id).status, pb.OPERATION_STATUS_COMPLETE)

    def test_unknown_ids(self):
        s = self.sidecar("s")
        for fn, req in ((s.stub.GetOperation, pb.GetOperationRequest(operation_id="op-nope")),
                        (s.stub.CancelOperation, pb.CancelOperationRequest(operation_id="op-nope")),
                        (s.stub.ReleaseOperation, pb.ReleaseOperationRequest(operation_id="op-nope")),
                        (s.stub.WaitOperation, pb.WaitOperationRequest(operation_id="op-nope", timeout_ms=10)),
                        (s.stub.DeregisterRegion, pb.DeregisterRegionRequest(region_id="rgn-nope"))):
            self.assertRpcError(NOT_FOUND, fn, req, timeout=5)
        self.assertRpcError(NOT_FOUND, lambda: list(s.stub.WatchOperation(
            pb.WatchOperationRequest(operation_id="op-nope"), timeout=5)))
        self.assertRpcError(NOT_FOUND, lambda: list(s.stub.ReadRegion(
            pb.ReadRegionRequest(region_id="rgn-nope"), timeout=5)))

    def test_bad_metadata(self):
        a, b = self.pair()
        _, _, ro = self.readable(a, 4096)
        rb = b.create_region(4096)
        noise = os.urandom(4096)
        b.fill(rb, 0, noise)
        md = ro.metadata
        bad = {
            "garbage": "hello world",
            "empty": "",
            "wrong prefix": "rsm2." + md[5:],
            "truncated": md[:len(md) // 2],
            "one char short": md[:-1],
            "oversized": "rsm1." + "A" * (300 * 1024),
            "bad base64": md[:20] + "!!!!" + md[24:],
        }
        for i in (10, len(md) // 3, len(md) // 2, len(md) - 3):
            c = md[i]
            bad["flipped %d" % i] = md[:i] + ("B" if c != "B" else "C") + md[i + 1:]
        for what, text in bad.items():
            with self.subTest(what=what):
                with self.assertRaises(grpc.RpcError) as cm:
                    self.begin_read(b, text, rb, 4096)
                self.assertIn(cm.exception.code(), (grpc.StatusCode.INVALID_ARGUMENT,
                                                    grpc.StatusCode.UNAUTHENTICATED), cm.exception.details())
                self.assertTrue(cm.exception.details())
        self.assertEqual(b.peek(rb, 0, 4096), noise, "bad metadata moved bytes")
        # the real metadata still works
        op = self.begin_read(b, md, rb, 4096)
        self.assertEqual(b.wait(op.operation_id).status, pb.OPERATION_STATUS_COMPLETE)

    def test_unknown_key(self):
        a = self.sidecar("a", key_file=self.key_file("ka", keys=[("alpha", os.urandom(32))]))
        c = self.sidecar("c", key_file=self.key_file("kc", keys=[("gamma", os.urandom(32))]))
        _, _, ro = self.readable(a)
        rc = c.create_region(4096)
        self.assertRpcError(grpc.StatusCode.UNAUTHENTICATED, self.begin_read, c, ro.metadata, rc, 4096,
                            contains="alpha")

    def test_same_key_id_different_secret(self):
        a = self.sidecar("a", key_file=self.key_file("ka", keys=[("k", os.urandom(32))]))
        c = self.sidecar("c", key_file=self.key_file("kc", keys=[("k", os.urandom(32))]))
        _, _, ro = self.readable(a)
        rc = c.create_region(4096)
        self.assertRpcError(grpc.StatusCode.UNAUTHENTICATED, self.begin_read, c, ro.metadata, rc, 4096)

    def test_no_key_file_is_local_only(self):
        a = self.sidecar("a")
        b = self.sidecar("b")
        _, _, ro = self.readable(a)
        rb = b.create_region(4096)
        self.assertRpcError(grpc.StatusCode.UNAUTHENTICATED, self.begin_read, b, ro.metadata, rb, 4096,
                            contains="--key-file")

    def test_audience(self):
        keys = self.key_file()
        a, b, c = (self.sidecar(n, key_file=keys) for n in ("a", "b", "c"))
        r, data, ro = self.readable(a, 4096, audience="c")
        rb = b.create_region(4096)
        self.assertRpcError(grpc.StatusCode.PERMISSION_DENIED, self.begin_read, b, ro.metadata, rb, 4096,
                            contains="'c'")
        rc = c.create_region(4096)
        op = self.begin_read(c, ro.metadata, rc, 4096)
        self.assertEqual(c.wait(op.operation_id).status, pb.OPERATION_STATUS_COMPLETE)
        self.assertEqual(c.peek(rc, 0, 4096), data)

    # ---- expiry and replay -------------------------------------------------------------------

    def test_expired_metadata(self):
        a, b = self.pair()
        _, _, ro = self.readable(a, 4096, timeout_ms=300)
        rb = b.create_region(4096)
        noise = os.urandom(4096)
        b.fill(rb, 0, noise)
        # the passive operation ends at its deadline
        p = a.wait(ro.operation_id, 5000)
        self.assertEqual(p.status, pb.OPERATION_STATUS_ERRORED)
        self.assertEqual(p.error.code, code(grpc.StatusCode.DEADLINE_EXCEEDED))
        # within the clock-skew allowance the metadata verifies; its issuer says it expired
        op = self.begin_read(b, ro.metadata, rb, 4096)
        w = b.wait(op.operation_id)
        self.assertEqual(w.status, pb.OPERATION_STATUS_ERRORED)
        self.assertEqual(w.error.code, code(grpc.StatusCode.FAILED_PRECONDITION), w.error.message)
        self.assertIn("expired", w.error.message)
        # past the allowance it is refused at once
        time.sleep(5.5)
        self.assertRpcError(grpc.StatusCode.FAILED_PRECONDITION, self.begin_read, b, ro.metadata, rb, 4096,
                            contains="expired")
        self.assertEqual(b.peek(rb, 0, 4096), noise)

    def test_metadata_used_twice(self):
        a, b = self.pair()
        _, data, ro = self.readable(a, 4096)
        rb1, rb2 = b.create_region(4096), b.create_region(4096)
        noise = os.urandom(4096)
        b.fill(rb2, 0, noise)
        op = self.begin_read(b, ro.metadata, rb1, 4096)
        self.assertEqual(b.wait(op.operation_id).status, pb.OPERATION_STATUS_COMPLETE)
        again = self.begin_read(b, ro.metadata, rb2, 4096)
        w = b.wait(again.operation_id)
        self.assertEqual(w.status, pb.OPERATION_STATUS_ERRORED)
        self.assertEqual(w.error.code, code(grpc.StatusCode.FAILED_PRECONDITION), w.error.message)
        self.assertIn("already used", w.error.message)
        self.assertEqual(w.bytes_done, 0)
        self.assertEqual(b.peek(rb2, 0, 4096), noise, "the replay moved bytes")

    def test_concurrent_double_use(self):
        a, b = self.pair()
        _, data, ro = self.readable(a, 1 << 20)
        regions = [b.create_region(1 << 20) for _ in range(4)]
        ops = [self.begin_read(b, ro.metadata, r, 1 << 20) for r in regions]
        results = [b.wait(o.operation_id) for o in ops]
        ok = [r for r in results if r.status == pb.OPERATION_STATUS_COMPLETE]
        self.assertEqual(len(ok), 1, [pb.OperationStatus.Name(r.status) for r in results])
        for r in results:
            if r.status != pb.OPERATION_STATUS_COMPLETE:
                self.assertEqual(r.status, pb.OPERATION_STATUS_ERRORED)
                self.assertEqual(r.error.code, code(grpc.StatusCode.FAILED_PRECONDITION), r.error.message)
                self.assertIn("already used", r.error.message)

    # ---- cancellation and deadlines mid-transfer ----------------------------------------------

    # A big transfer between two sidecars in two network namespaces whose veth link a token bucket
    # holds to RATE: BIG then takes over 20 s by construction, whatever this machine's speed, so a
    # fault injected once bytes move always finds the transfer moving.
    BIG = 256 << 20
    RATE = "100mbit"

    def throttled_pair(self):
        why = can_run(iptables=False)
        if why:
            self.skipTest(why)
        net = Net(self.RATE)
        self.addCleanup(net.close)
        keys = self.key_file()
        return [self.sidecar(n, key_file=keys, tcp=False, data_listen=addr + ":0", prefix=("ip", "netns", "exec", ns))
                for n, ns, addr in zip("ab", net.ns, net.addr)]

    def big_transfer(self, a, b, **kw):
        ra, rb = a.create_region(self.BIG), b.create_region(self.BIG)
        ro = a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(ra, 0, self.BIG)],
                                                           timeout_ms=120000), timeout=30)
        op = self.begin_read(b, ro.metadata, rb, self.BIG, **kw)
        return ro, op

    def wait_moving(self, side, op_id):
        def moving():
            o = side.stub.GetOperation(pb.GetOperationRequest(operation_id=op_id), timeout=5)
            return o.bytes_done > 0 or o.status != pb.OPERATION_STATUS_IN_PROGRESS and o
        o = wait_until(moving, 20, "bytes to move")
        self.assertIs(o, True, "the throttled transfer ended before the fault: %s" % o)

    def test_passive_cancelled_before(self):
        a, b = self.pair()
        _, _, ro = self.readable(a)
        c = a.stub.CancelOperation(pb.CancelOperationRequest(operation_id=ro.operation_id), timeout=5)
        self.assertEqual(c.status, pb.OPERATION_STATUS_CANCELLED)
        rb = b.create_region(4096)
        op = self.begin_read(b, ro.metadata, rb, 4096)
        w = b.wait(op.operation_id)
        self.assertEqual(w.status, pb.OPERATION_STATUS_ERRORED)
        self.assertEqual(w.error.code, code(grpc.StatusCode.FAILED_PRECONDITION), w.error.message)
        self.assertIn("cancelled", w.error.message)
        self.assertEqual(w.bytes_done, 0)

    def test_passive_cancelled_during(self):
        a, b = self.throttled_pair()
        ro, op = self.big_transfer(a, b)
        self.wait_moving(b, op.operation_id)
        a.stub.CancelOperation(pb.CancelOperationRequest(operation_id=ro.operation_id), timeout=5)
        w = b.wait(op.operation_id, 10000)
        self.assertIn(w.status, (pb.OPERATION_STATUS_ERRORED, pb.OPERATION_STATUS_CANCELLED))
        self.assertLess(w.bytes_done, self.BIG)
        self.assertEqual(a.wait(ro.operation_id, 1000).status, pb.OPERATION_STATUS_CANCELLED)
        self.assert_still_serves(a, b)

    def test_active_cancelled_during(self):
        a, b = self.throttled_pair()
        ro, op = self.big_transfer(a, b)
        self.wait_moving(b, op.operation_id)
        t0 = time.monotonic()
        c = b.stub.CancelOperation(pb.CancelOperationRequest(operation_id=op.operation_id), timeout=5)
        self.assertEqual(c.status, pb.OPERATION_STATUS_CANCELLED)
        # the passive side is told and ends too
        p = a.wait(ro.operation_id, 10000)
        self.assertEqual(p.status, pb.OPERATION_STATUS_CANCELLED, p.error.message)
        self.assertLess(time.monotonic() - t0, 5 * SLOW)
        self.assert_still_serves(a, b)

    def test_deadline_mid_transfer(self):
        a, b = self.throttled_pair()
        ro, op = self.big_transfer(a, b, timeout_ms=300)
        w = b.wait(op.operation_id, 10000)
        self.assertEqual(w.status, pb.OPERATION_STATUS_ERRORED)
        self.assertEqual(w.error.code, code(grpc.StatusCode.DEADLINE_EXCEEDED), w.error.message)
        p = a.wait(ro.operation_id, 10000)
        self.assertEqual(p.status, pb.OPERATION_STATUS_ERRORED, p.error.message)
        self.assert_still_serves(a, b)

    def test_passive_peer_killed(self):
        a, b = self.throttled_pair()
        a.expect_nonzero = True
        ro, op = self.big_transfer(a, b)
        self.wait_moving(b, op.operation_id)
        t0 = time.monotonic()
        a.proc.send_signal(signal.SIGKILL)
        w = b.wait(op.operation_id, 30000)
        self.assertEqual(w.status, pb.OPERATION_STATUS_ERRORED)
        self.assertEqual(w.error.code, code(grpc.StatusCode.UNAVAILABLE), w.error.message)
        self.assertLess(time.monotonic() - t0, 5 * SLOW, "the survivor noticed too late")
        self.assert_still_serves(b)

    def test_active_peer_killed(self):
        a, b = self.throttled_pair()
        b.expect_nonzero = True
        ro, op = self.big_transfer(a, b)
        self.wait_moving(b, op.operation_id)
        t0 = time.monotonic()
        b.proc.send_signal(signal.SIGKILL)
        p = a.wait(ro.operation_id, 30000)
        self.assertEqual(p.status, pb.OPERATION_STATUS_ERRORED)
        self.assertEqual(p.error.code, code(grpc.StatusCode.UNAVAILABLE), p.error.message)
        self.assertLess(time.monotonic() - t0, 10 * SLOW, "the survivor noticed too late")
        self.assert_still_serves(a)

    # ---- regions busy --------------------------------------------------------------------------

    def test_deregister_busy_region(self):
        s = self.sidecar("s")
        r, _, ro = self.readable(s)
        self.assertRpcError(grpc.StatusCode.FAILED_PRECONDITION, s.stub.DeregisterRegion,
                            pb.DeregisterRegionRequest(region_id=r.region_id), timeout=5, contains="force")
        s.stub.DeregisterRegion(pb.DeregisterRegionRequest(region_id=r.region_id, force=True), timeout=5)
        o = s.stub.GetOperation(pb.GetOperationRequest(operation_id=ro.operation_id), timeout=5)
        self.assertEqual(o.status, pb.OPERATION_STATUS_CANCELLED)
        self.assertFalse(os.path.exists(r.path))

    # ---- hostile data-plane clients ------------------------------------------------------------

    def data_port(self, side):
        host, port = side.info().data_endpoints[0].rsplit(":", 1)
        return host, int(port)

    def expect_closed(self, sock):
        sock.settimeout(10 * SLOW)
        got = b""
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    return got
                got += chunk
        except ConnectionResetError:
            return got

    def test_garbage_and_forged_frames_on_data_port(self):
        a, b = self.pair()
        host, port = self.data_port(a)
        r, data, ro = self.readable(a, 4096)

        def hello(key_id, client_id="mallory"):
            body = struct.pack("<I", 0x504d5352) + os.urandom(16)
            for s in (client_id, key_id):
                body += struct.pack("<H", len(s)) + s.encode()
            return struct.pack("<BBHI", 1, 1, 0, len(body)) + body

        attacks = {
            "random bytes": os.urandom(4096),
            "bad version": struct.pack("<BBHI", 9, 1, 0, 4) + b"abcd",
            "huge body": struct.pack("<BBHI", 1, 1, 0, 0x7fffffff),
            "unknown type": struct.pack("<BBHI", 1, 200, 0, 0),
            "read before hello": struct.pack("<BBHI", 1, 7, 0, 44) + os.urandom(44),
            "unknown key id": hello("evil"),
        }
        for what, payload in attacks.items():
            with self.subTest(what=what):
                with socket.create_connection((host, port), timeout=5) as s:
                    s.sendall(payload)
                    self.expect_closed(s)
        # a hello with a valid key id but a forged proof
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(hello("k1"))
            hdr = s.recv(8)
            self.assertEqual(len(hdr), 8)
            ver, typ, _, ln = struct.unpack("<BBHI", hdr)
            self.assertEqual(typ, 2, "expected HELLO_ACK")
            s.recv(ln)
            s.sendall(struct.pack("<BBHI", 1, 3, 0, 32) + os.urandom(32))
            self.expect_closed(s)
        self.assertIn("mallory", a.read_log())
        # nothing was read or written, and the real metadata still works
        o = a.stub.GetOperation(pb.GetOperationRequest(operation_id=ro.operation_id), timeout=5)
        self.assertEqual(o.status, pb.OPERATION_STATUS_INITIALIZED)
        rb = b.create_region(4096)
        op = self.begin_read(b, ro.metadata, rb, 4096)
        self.assertEqual(b.wait(op.operation_id).status, pb.OPERATION_STATUS_COMPLETE)
        self.assertEqual(b.peek(rb, 0, 4096), data)

    def test_many_clients_and_transfers_in_parallel(self):
        a, b = self.pair()
        errors = []

        def worker(i):
            try:
                size = 4096 + i * 777
                r, data, ro = self.readable(a, size)
                rb = b.create_region(size)
                op = self.begin_read(b, ro.metadata, rb, size)
                w = b.wait(op.operation_id)
                if w.status != pb.OPERATION_STATUS_COMPLETE or b.peek(rb, 0, size) != data:
                    errors.append((i, w.status, w.error.message))
            except Exception as e:  # noqa: BLE001
                errors.append((i, repr(e)))
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(errors, [])


if __name__ == "__main__":
    main()
