# SPDX-License-Identifier: Apache-2.0
"""/metrics after real transfers, checked by Prometheus' own `promtool check metrics` (Debian
package prometheus), and the numbers behind it:
- the transfer histograms (rdma_sidecar_transfer_duration_seconds, _size_bytes) count each
  completed READ and WRITE once, by direction and backend (TCP between two sidecars, LOCAL inside
  one), with the exact byte sums and the right buckets;
- rdma_sidecar_metadata_rejected_total counts refused metadata by reason (malformed, unsupported
  version, wrong kind, wrong audience, bad signature, unknown key), each refusal answered
  with its gRPC status and message and nothing written to the target region; a refused
  PublishMetadata counts under source="bus" and publishes nothing.
Skipped (with the reason) when promtool is not installed."""
import os
import re
import shutil
import subprocess
import urllib.request

from harness import SLOW, SidecarTest, desc, free_port, grpc, main, pb, wait_until, write_key_file

PROMTOOL = shutil.which("promtool")
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')
MiB = 1 << 20


def fetch(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10 * SLOW) as r:
        return r.read().decode()


def parse(text):
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, labels, value = SAMPLE.match(line).groups()
        out[(name, tuple(sorted(LABEL.findall(labels or ""))))] = float(value)
    return out


def k(name, **labels):
    return (name, tuple(sorted(labels.items())))


class PromtoolTest(SidecarTest):
    def setUp(self):
        super().setUp()
        if not PROMTOOL:
            self.skipTest("promtool not installed (Debian package prometheus; scripts/install-deps.sh)")

    def promtool(self, text):
        p = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True,
                           timeout=60)
        self.assertEqual((p.returncode, p.stdout + p.stderr), (0, ""), "promtool check metrics:\n" + text)

    def metrics_sidecar(self, name, **kw):
        port = free_port()
        s = self.sidecar(name, extra=["--metrics-listen", "127.0.0.1:%d" % port] + list(kw.pop("extra", [])),
                         **kw)
        return s, port

    def transfer(self, passive, active, direction, size, backend):
        src = passive.create_region(size)
        dst = active.create_region(size)
        data = os.urandom(size)
        (passive if direction == "read" else active).fill(src if direction == "read" else dst, 0, data)
        create = passive.stub.CreateReadable if direction == "read" else passive.stub.CreateWritable
        po = create(pb.CreatePassiveRequest(descriptors=[desc(src, 0, size)]), timeout=10 * SLOW)
        begin = active.stub.BeginRead if direction == "read" else active.stub.BeginWrite
        op = begin(pb.BeginTransferRequest(metadata=po.metadata, descriptors=[desc(dst, 0, size)]),
                   timeout=10 * SLOW)
        done = active.wait(op.operation_id)
        self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
        self.assertEqual(done.backend, backend, done.backend_reason)
        receiver, region = (active, dst) if direction == "read" else (passive, src)
        self.assertEqual(receiver.peek(region, 0, size), data)
        return po

    def refused(self, s, begin, metadata, code, contains):
        """Begin with bad metadata: refused with code/message, and the target region untouched."""
        dst = s.create_region(4096)
        before = os.urandom(4096)
        s.fill(dst, 0, before)
        with self.assertRaises(grpc.RpcError) as cm:
            begin(pb.BeginTransferRequest(metadata=metadata, descriptors=[desc(dst, 0, 4096)]), timeout=10 * SLOW)
        self.assertEqual(cm.exception.code(), code, cm.exception.details())
        self.assertIn(contains, cm.exception.details())
        self.assertEqual(s.peek(dst, 0, 4096), before)

    def test_promtool_histograms_and_rejections(self):
        keys = self.key_file()
        a, port_a = self.metrics_sidecar("a", key_file=keys)
        b, port_b = self.metrics_sidecar("b", key_file=keys)
        self.promtool(fetch(port_b))  # before any traffic, too

        self.transfer(a, b, "read", 3 * MiB, pb.BACKEND_TCP)
        self.transfer(a, b, "write", 100000, pb.BACKEND_TCP)
        self.transfer(b, b, "read", 5000, pb.BACKEND_LOCAL)

        # Refused metadata, one per reason, all at b.
        good = a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(a.create_region(4096), 0, 4096)]),
                                     timeout=10 * SLOW).metadata
        self.refused(b, b.stub.BeginRead, "rsm1.!!not-base64", grpc.StatusCode.INVALID_ARGUMENT,
                     "not valid base64url")
        self.refused(b, b.stub.BeginRead, "rsm2." + good[5:], grpc.StatusCode.INVALID_ARGUMENT,
                     "metadata format 'rsm2' is not supported")
        self.refused(b, b.stub.BeginWrite, good, grpc.StatusCode.INVALID_ARGUMENT,
                     "BeginWrite needs metadata from")
        other = a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(a.create_region(4096), 0, 4096)],
                                                              audience="someone-else"), timeout=10 * SLOW).metadata
        self.refused(b, b.stub.BeginRead, other, grpc.StatusCode.PERMISSION_DENIED,
                     "metadata is for sidecar 'someone-else' but this is 'b'")
        c = self.sidecar("c", key_file=write_key_file(os.path.join(self.workdir, "ckeys"),
                                                      [("k1", os.urandom(32))]))
        forged = c.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(c.create_region(4096), 0, 4096)]),
                                       timeout=10 * SLOW).metadata
        self.refused(b, b.stub.BeginRead, forged, grpc.StatusCode.UNAUTHENTICATED,
                     "metadata signature does not verify with key 'k1'")
        d = self.sidecar("d", key_file=write_key_file(os.path.join(self.workdir, "dkeys"),
                                                      [("k9", os.urandom(32))]))
        stranger = d.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(d.create_region(4096), 0, 4096)]),
                                         timeout=10 * SLOW).metadata
        self.refused(b, b.stub.BeginRead, stranger, grpc.StatusCode.UNAUTHENTICATED,
                     "metadata signed with unknown key id 'k9'")
        e, port_e = self.metrics_sidecar("e")
        # Without --key-file a sidecar signs with a key of its own: k1 is unknown to it.
        self.refused(e, e.stub.BeginRead, good, grpc.StatusCode.UNAUTHENTICATED,
                     "metadata signed with unknown key id 'k1'")

        text = fetch(port_b)
        self.promtool(text)
        self.promtool(fetch(port_a))
        m = parse(text)
        dur, size = "rdma_sidecar_transfer_duration_seconds", "rdma_sidecar_transfer_size_bytes"
        for direction, backend, nbytes in (("read", "tcp", 3 * MiB), ("write", "tcp", 100000),
                                           ("read", "local", 5000)):
            lb = dict(direction=direction, backend=backend)
            self.assertEqual(m[k(dur + "_count", **lb)], 1, lb)
            self.assertEqual(m[k(dur + "_bucket", le="+Inf", **lb)], 1, lb)
            self.assertGreater(m[k(dur + "_sum", **lb)], 0, lb)
            self.assertLess(m[k(dur + "_sum", **lb)], 60 * SLOW, lb)
            self.assertEqual(m[k(size + "_count", **lb)], 1, lb)
            self.assertEqual(m[k(size + "_sum", **lb)], nbytes, lb)
            # The smallest bucket that holds it counts it; the one below does not.
            bounds = [1 << (10 + 2 * i) for i in range(13)]
            first = next(x for x in bounds if nbytes <= x)
            self.assertEqual(m[k(size + "_bucket", le=str(first), **lb)], 1, lb)
            if first > bounds[0]:
                self.assertEqual(m[k(size + "_bucket", le=str(first // 4), **lb)], 0, lb)
        self.assertEqual(m[k(dur + "_count", direction="write", backend="local")], 0)
        self.assertEqual(m[k("rdma_sidecar_bytes_total", direction="read", backend="tcp")], 3 * MiB)

        rej = "rdma_sidecar_metadata_rejected_total"
        want = {"malformed": 1, "unsupported_version": 1, "wrong_kind": 1, "wrong_audience": 1,
                "bad_signature": 1, "unknown_key": 1, "no_keys": 0, "expired": 0}
        for reason, n in want.items():
            self.assertEqual(m[k(rej, source="begin", reason=reason)], n, reason)
            self.assertEqual(m[k(rej, source="bus", reason=reason)], 0, reason)
        self.assertEqual(parse(fetch(port_e))[k(rej, source="begin", reason="unknown_key")], 1)
        # Only the sidecar that refused counts: a verified nothing bad.
        self.assertEqual(sum(v for (n, _), v in parse(fetch(port_a)).items() if n == rej), 0)

    def test_bus_rejections_counted(self):
        # PublishMetadata verifies the text it is given before it goes on NATS: refused ones count
        # under source="bus", and nothing is published (a subscriber on the subject gets nothing).
        n = self.nats()
        keys = self.key_file()
        s, port = self.metrics_sidecar("pub", key_file=keys, nats_url=n.url)
        wait_until(lambda: "connected" in s.info().nats_state.lower(), 10 * SLOW, "NATS connection")
        sub = s.stub.SubscribeMetadata(pb.SubscribeMetadataRequest(subject="ops.kv"), timeout=3 * SLOW)
        with self.assertRaises(grpc.RpcError) as cm:
            s.stub.PublishMetadata(pb.PublishMetadataRequest(subject="ops.kv", metadata="rsm1.!!"),
                                   timeout=10 * SLOW)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, cm.exception.details())
        self.assertIn("not valid base64url", cm.exception.details())
        with self.assertRaises(grpc.RpcError) as cm:
            next(sub)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        text = fetch(port)
        self.promtool(text)
        m = parse(text)
        self.assertEqual(m[k("rdma_sidecar_metadata_rejected_total", source="bus", reason="malformed")], 1)
        self.assertEqual(m[k("rdma_sidecar_metadata_rejected_total", source="begin", reason="malformed")], 0)


if __name__ == "__main__":
    main()
