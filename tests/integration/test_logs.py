# SPDX-License-Identifier: Apache-2.0
"""Logs an operator can query (docs/operations/logs.md): structured keys beside the prose, and one
W3C trace id for a transfer on both sidecars.

Two sidecars log JSON (--log-json) and move random bytes at odd offsets: every line of both logs
parses as JSON; the transfer's lines on both sides carry the trace id of the traceparent the
worker sent (gRPC metadata, or the request's traceparent field), and filtering by the `op` key
finds an operation's lines. A third sidecar logs text: the same keys follow the message as
key=value. Refused BeginReads are logged at INFO with their reason, code and key id, rate-limited,
whether the engine refused them or the service did before they reached it (a malformed traceparent
field, a bad descriptor set, requirement or backend). Metadata refused on NATS receipt (a tampered
copy in the JetStream stream) is logged with the key id it claims.
"""
import base64
import json
import os
import re
import socket
import subprocess
import time

import grpc
from harness import BINARY, SLOW, SidecarTest, desc, main, pb, wait_until

CTL = os.path.join(os.path.dirname(os.path.abspath(BINARY)), "client", "rdma-sidecar-ctl")

HEX32 = re.compile(r"^[0-9a-f]{32}$")


def traceparent():
    """A fresh W3C traceparent and its trace id (uppercase hex in the header, to check that the
    sidecar lowercases it as W3C writes trace ids)."""
    tid = os.urandom(16).hex()
    return "00-%s-%s-01" % (tid.upper(), os.urandom(8).hex()), tid


def json_lines(sidecar):
    """Every line of the sidecar's log, parsed (fails on a line that is not JSON)."""
    out = []
    for n, line in enumerate(sidecar.read_log().splitlines()):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError as e:
            raise AssertionError("%s log line %d is not JSON (%s): %r" % (sidecar.name, n + 1, e, line))
    return out


class LogsTest(SidecarTest):
    def setUp(self):
        super().setUp()
        keys = self.key_file()
        self.a = self.sidecar("a", key_file=keys, extra=["--log-json"])
        self.b = self.sidecar("b", key_file=keys, extra=["--log-json"])

    def transfer(self, create_md=(), begin_md=(), create_tp="", begin_tp=""):
        """a: CreateReadable over random bytes at an odd offset; b: BeginRead into an odd offset.
        Returns (passive op at its end, active op at its end)."""
        a, b = self.a, self.b
        n = 70001 + int.from_bytes(os.urandom(2), "little")
        ra, rb = a.create_region(n + 9000), b.create_region(n + 9000)
        data = os.urandom(n)
        a.fill(ra, 4099, data)
        p = a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(ra, 4099, n)], timeout_ms=30000,
                                                          traceparent=create_tp),
                                  metadata=list(create_md), timeout=10)
        op = b.stub.BeginRead(pb.BeginTransferRequest(metadata=p.metadata, descriptors=[desc(rb, 333, n)],
                                                      timeout_ms=30000, traceparent=begin_tp),
                              metadata=list(begin_md), timeout=10)
        done = b.wait(op.operation_id)
        self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
        self.assertEqual(b.peek(rb, 333, n), data)
        pdone = a.wait(p.operation_id)
        self.assertEqual(pdone.status, pb.OPERATION_STATUS_COMPLETE, pdone.error.message)
        return pdone, done

    def lines_of(self, sidecar, key, value):
        return [x for x in json_lines(sidecar) if x.get(key) == value]

    def test_one_trace_across_both_sidecars(self):
        tp, tid = traceparent()
        md = [("traceparent", tp)]
        passive, active = self.transfer(create_md=md, begin_md=md)
        self.assertEqual(active.trace_id, tid)
        self.assertEqual(passive.trace_id, tid)
        # Both logs parse as JSON through and through; the transfer's lines on each side carry
        # the trace id, beside the prose they always had.
        on_a = self.lines_of(self.a, "trace_id", tid)
        on_b = self.lines_of(self.b, "trace_id", tid)
        msgs_a = [x["msg"] for x in on_a]
        msgs_b = [x["msg"] for x in on_b]
        self.assertTrue(any(m.startswith(passive.operation_id + " READABLE:") for m in msgs_a), msgs_a)
        self.assertTrue(any("of peer b opened" in m for m in msgs_a), msgs_a)
        self.assertTrue(any(m.startswith(passive.operation_id + " READABLE COMPLETE") for m in msgs_a), msgs_a)
        self.assertTrue(any(m.startswith(active.operation_id + " READ from a:") for m in msgs_b), msgs_b)
        self.assertTrue(any(m.startswith(active.operation_id + " READ COMPLETE") for m in msgs_b), msgs_b)
        for x in on_a + on_b:
            self.assertEqual(set(x) & {"ts", "level", "area", "msg"}, {"ts", "level", "area", "msg"}, x)
        # Filtering by operation id: every line about b's operation, with its keys.
        by_op = self.lines_of(self.b, "op", active.operation_id)
        self.assertGreaterEqual(len(by_op), 2, by_op)
        for x in by_op:  # the operation's own lines, and what its transfer's threads logged
            self.assertEqual(x["trace_id"], tid, x)
            self.assertEqual(x["peer"], "a", x)
            self.assertEqual(x["backend"], "tcp", x)
        for x in by_op:
            if x["msg"].startswith(active.operation_id):
                self.assertEqual(x["bytes"], active.bytes_total, x)  # a JSON number
        begin = [x for x in by_op if " READ from a:" in x["msg"]]
        self.assertEqual(begin[0]["level"], "INFO")
        self.assertEqual(begin[0]["key_id"], "k1")
        end = [x for x in by_op if "COMPLETE" in x["msg"]]
        self.assertEqual(end[0]["code"], "OK")
        # ... and on a: its passive operation, signed with k1
        by_op_a = self.lines_of(self.a, "op", passive.operation_id)
        created = [x for x in by_op_a if x["msg"].startswith(passive.operation_id + " READABLE:")]
        self.assertEqual(created[0]["key_id"], "k1", created)
        self.assertNotIn("peer", created[0])  # only keys that are set: nobody used it yet
        # GetOperation and ListOperations report it too.
        got = self.a.stub.GetOperation(pb.GetOperationRequest(operation_id=passive.operation_id), timeout=5)
        self.assertEqual(got.trace_id, tid)
        # rdma-sidecar-ctl watch shows it on both sides, text and JSON.
        for side, op_id in ((self.a, passive.operation_id), (self.b, active.operation_id)):
            r = subprocess.run([CTL, "--sidecar", "unix:" + side.sock, "--timeout", str(10 * SLOW), "watch", op_id],
                               capture_output=True, text=True, timeout=30 * SLOW)
            self.assertEqual(r.returncode, 0, r.stderr)
            states = [ln for ln in r.stdout.splitlines() if ln.startswith(op_id + " ")]
            self.assertRegex(states[-1], r"^%s  \w+  complete  .*  trace %s$" % (op_id, tid))
            r = subprocess.run([CTL, "--sidecar", "unix:" + side.sock, "--json", "watch", op_id],
                               capture_output=True, text=True, timeout=30 * SLOW)
            self.assertEqual(json.loads(r.stdout.splitlines()[-1])["trace_id"], tid, r.stdout)

    def test_reader_trace_without_creator_trace(self):
        # The creator sent no traceparent; the reader passes one in the request field (a client
        # that cannot set metadata). The passive operation takes the reader's trace.
        tp, tid = traceparent()
        passive, active = self.transfer(begin_tp=tp)
        self.assertEqual(active.trace_id, tid)
        self.assertEqual(passive.trace_id, tid)
        done_a = [x for x in self.lines_of(self.a, "op", passive.operation_id) if "COMPLETE" in x["msg"]]
        self.assertEqual(done_a[0]["trace_id"], tid, done_a)

    def test_new_trace_when_none_sent(self):
        passive, active = self.transfer()
        self.assertRegex(active.trace_id, HEX32)
        self.assertNotEqual(active.trace_id, "0" * 32)
        self.assertEqual(passive.trace_id, active.trace_id)  # it travelled to a
        self.assertTrue(self.lines_of(self.a, "trace_id", active.trace_id))
        # A malformed header is ignored (W3C: start a new trace) ...
        passive2, active2 = self.transfer(begin_md=[("traceparent", "00-zz-yy-01")])
        self.assertRegex(active2.trace_id, HEX32)
        self.assertNotEqual(active2.trace_id, active.trace_id)
        # ... a malformed request field is the caller's mistake, said so.
        r = self.b.create_region(4096)
        err = self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, self.b.stub.BeginRead,
                                  pb.BeginTransferRequest(metadata="rsm1.x", descriptors=[desc(r, 0, 16)],
                                                          traceparent="00-" + "0" * 32 + "-" + "1" * 16 + "-01"),
                                  timeout=5)
        self.assertIn("traceparent is not a W3C traceparent", err.details())

    def test_refused_begin_read_logged_at_info_rate_limited(self):
        r = self.b.create_region(4096)
        # Metadata signed with a key b does not hold: UNAUTHENTICATED, and the line names the key.
        other = self.sidecar("c", key_file=self.key_file("other", [("k-other", os.urandom(32))]))
        rc = other.create_region(4096)
        foreign = other.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(rc, 0, 16)]), timeout=5)
        tries = 25
        for i in range(tries):
            self.assertRpcError(grpc.StatusCode.UNAUTHENTICATED, self.b.stub.BeginRead,
                                pb.BeginTransferRequest(metadata=foreign.metadata, descriptors=[desc(r, 0, 16)]),
                                timeout=5)
        time.sleep(1.1)  # past the limiter's second, so the next line tells what it held back
        self.assertRpcError(grpc.StatusCode.UNAUTHENTICATED, self.b.stub.BeginRead,
                            pb.BeginTransferRequest(metadata=foreign.metadata, descriptors=[desc(r, 0, 16)]),
                            timeout=5)

        def held_back(lines):
            found = (re.search(r"\((\d+) similar suppressed\)", x["msg"]) for x in lines)
            return sum(int(m.group(1)) for m in found if m)

        def refused():  # every refusal accounted for: a line, or counted in a later line
            got = [x for x in json_lines(self.b) if x["msg"].startswith("BeginRead refused")]
            return got if len(got) + held_back(got) == tries + 1 else None
        lines = wait_until(refused, 5, "the refusal lines")
        for x in lines:
            self.assertEqual(x["level"], "INFO", x)
            self.assertEqual(x["code"], "UNAUTHENTICATED", x)
            self.assertEqual(x["key_id"], "k-other", x)
            self.assertIn("k-other", x["msg"])  # the reason, as the caller got it
        # Rate-limited (one line a second): fewer lines than refusals; the lines and what they say
        # was held back account for every refusal.
        self.assertLess(len(lines), tries + 1, [x["msg"] for x in lines])
        self.assertGreater(held_back(lines), 0)
        # BeginWrite's refusals have their own limit: not held back behind BeginRead's.
        tp, tid = traceparent()
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, self.b.stub.BeginWrite,
                            pb.BeginTransferRequest(metadata="rsm1.!!", descriptors=[desc(r, 0, 16)]),
                            metadata=[("traceparent", tp)], timeout=5)
        w = wait_until(lambda: [x for x in json_lines(self.b) if x["msg"].startswith("BeginWrite refused")], 5,
                       "the BeginWrite refusal line")
        self.assertEqual((w[0]["level"], w[0]["code"], w[0]["trace_id"]), ("INFO", "INVALID_ARGUMENT", tid), w)
        self.assertIn("base64url", w[0]["msg"])

    def test_refused_before_the_engine_logged(self):
        a, b = self.a, self.b
        r, ra = b.create_region(4096), a.create_region(4096)
        ro = a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(ra, 0, 16)], timeout_ms=30000), timeout=5)
        tp, tid = traceparent()

        def refusal(what, n=1):
            return wait_until(lambda: (lambda got: got if len(got) >= n else None)(
                [x for x in json_lines(b) if x["msg"].startswith(what + " refused")]), 5, what + " refused")

        # A malformed traceparent field: no trace id is known, the metadata's key id is.
        e = self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, b.stub.BeginRead,
                                pb.BeginTransferRequest(metadata=ro.metadata, descriptors=[desc(r, 0, 16)],
                                                        traceparent="00-zz"), timeout=5)
        x = refusal("BeginRead")[0]
        self.assertEqual((x["level"], x["code"], x["key_id"]), ("INFO", "INVALID_ARGUMENT", "k1"), x)
        self.assertNotIn("trace_id", x)
        self.assertIn(e.details(), x["msg"])
        # A bad descriptor set, with the caller's trace id (gRPC metadata).
        e = self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, b.stub.BeginWrite,
                                pb.BeginTransferRequest(metadata=ro.metadata, descriptor_sets=[pb.DescriptorSet(
                                    strided_run=pb.StridedRun(region_id=r.region_id, offset=0, stride=0, count=3, length=8))]),
                                metadata=[("traceparent", tp)], timeout=5)
        self.assertIn("strided_run.stride is 0", e.details())
        x = refusal("BeginWrite")[0]
        self.assertEqual((x["level"], x["code"], x["key_id"], x["trace_id"]), ("INFO", "INVALID_ARGUMENT", "k1", tid), x)
        self.assertIn(e.details(), x["msg"])
        # An unknown backend and a bad requirement (past the limiter's second for each direction).
        time.sleep(1.1)
        e = self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, b.stub.BeginRead,
                                pb.BeginTransferRequest(metadata=ro.metadata, descriptors=[desc(r, 0, 16)], backend=97),
                                metadata=[("traceparent", tp)], timeout=5)
        self.assertIn("unknown backend value 97", e.details())
        e2 = self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, b.stub.BeginWrite,
                                 pb.BeginTransferRequest(metadata=ro.metadata, descriptors=[desc(r, 0, 16)],
                                                         requirement=pb.TransferRequirement(iteration=1)), timeout=5)
        x = refusal("BeginRead", 2)[1]
        self.assertEqual((x["code"], x["trace_id"]), ("INVALID_ARGUMENT", tid), x)
        self.assertIn("unknown backend value 97", x["msg"])
        x = refusal("BeginWrite", 2)[1]
        self.assertEqual((x["code"], x["key_id"]), ("INVALID_ARGUMENT", "k1"), x)
        self.assertIn(e2.details(), x["msg"])
        self.assertIn("requirement.request_id", x["msg"])
        # The readable was never touched: still usable.
        self.assertEqual(a.stub.GetOperation(pb.GetOperationRequest(operation_id=ro.operation_id), timeout=5).uses_left, 1)

    def test_metadata_refused_on_nats_receipt_logged_with_key_id(self):
        nats = self.nats()
        n = self.sidecar("n", key_file=self.key_file("nk", [("k-nats", os.urandom(32))]), nats_url=nats.url,
                         extra=["--log-json"])
        rn = n.create_region(4096)
        op = n.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(rn, 0, 64)], timeout_ms=30000), timeout=5)
        n.stub.PublishMetadata(pb.PublishMetadataRequest(subject="logs.ok", operation_id=op.operation_id),
                               timeout=10 * SLOW)  # the stream exists from here on
        # A tampered copy (one bit of its MAC) put straight into the stream by another NATS client.
        sm = pb.SignedMetadata.FromString(base64.urlsafe_b64decode(op.metadata[5:] + "=" * (-len(op.metadata[5:]) % 4)))
        sm.mac = bytes([sm.mac[0] ^ 1]) + sm.mac[1:]
        bad = ("rsm1." + base64.urlsafe_b64encode(sm.SerializeToString()).decode().rstrip("=")).encode()
        host, port = nats.url[len("nats://"):].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            f = sock.makefile("rb")
            f.readline()  # INFO
            sock.sendall(b'CONNECT {"verbose":false}\r\nPUB RDMA_SIDECAR_METADATA.logs.bad %d\r\n%s\r\nPING\r\n'
                         % (len(bad), bad))
            while True:
                line = f.readline()
                self.assertTrue(line and not line.startswith(b"-ERR"), line)
                if line.startswith(b"PONG"):
                    break
        e = self.assertRpcError(grpc.StatusCode.UNAUTHENTICATED, n.stub.WaitMetadata,
                                pb.WaitMetadataRequest(subject="logs.bad", timeout_ms=700), timeout=10 * SLOW)
        self.assertIn("WaitMetadata on logs.bad", e.details())
        lines = wait_until(lambda: [x for x in json_lines(n) if x["msg"].startswith("dropped metadata on logs.bad: ")],
                           5, "the refusal line")
        x = lines[0]
        self.assertEqual((x["level"], x["area"], x["code"], x["key_id"]), ("WARN", "bus", "UNAUTHENTICATED", "k-nats"), x)
        self.assertIn("signature", x["msg"])

    def test_text_format_keeps_keys_as_key_value(self):
        t = self.sidecar("t", key_file=self.key_file("tk"))
        tp, tid = traceparent()
        src, dst = t.create_region(8192), t.create_region(8192)
        data = os.urandom(5003)
        t.fill(src, 7, data)
        p = t.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(src, 7, 5003)]),
                                  metadata=[("traceparent", tp)], timeout=5)
        op = t.stub.BeginRead(pb.BeginTransferRequest(metadata=p.metadata, descriptors=[desc(dst, 11, 5003)]),
                              metadata=[("traceparent", tp)], timeout=5)
        self.assertEqual(t.wait(op.operation_id).status, pb.OPERATION_STATUS_COMPLETE)
        self.assertEqual(t.peek(dst, 11, 5003), data)
        lines = [ln for ln in t.read_log().splitlines() if ("op=%s " % op.operation_id) in ln]
        self.assertTrue(lines, t.read_log()[-3000:])
        for ln in lines:
            # prose first, then the keys: "... COMPLETE: 5003 bytes via local peer t op=op-.. peer=t
            # backend=local bytes=5003 code=OK trace_id=<tid>"
            self.assertRegex(ln, r"^\S+Z (INFO|DEBUG) +\[op\] %s .* op=%s peer=t backend=local bytes=5003( code=\w+)?"
                             r"( key_id=\S+)? trace_id=%s$" % (op.operation_id, op.operation_id, tid))


if __name__ == "__main__":
    main()
