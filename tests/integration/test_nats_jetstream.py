# SPDX-License-Identifier: Apache-2.0
"""The metadata hand-off kept by JetStream (--nats-handoff jetstream, the default), against real
nats-servers started with -js.

Checked, with two sidecars sharing one server (one test, many subjects, to keep the wall time small):
both sidecars up before the stream exists (the first call is a wait: it creates the stream, the
publish that follows is delivered); publisher first (WaitMetadata and a late SubscribeMetadata get the
stored copy; the transfer's bytes are compared); the stored copy is removed when its operation
completes and when it expires (read back through the JetStream API); a tampered stored message is
refused (UNAUTHENTICATED, named); a stream deleted by an operator is created again on the next
publish; --nats-subject-prefix confines the wait; an account denied $JS.API.> gets the documented
refusal; a queue group gets stored copies, each message once, and keeps them while it has no
member; WaitMetadata timeouts while nats-server is stopped hold no deadline. A server without JetStream:
the documented FAILED_PRECONDITION, and --nats-handoff core still works there. A three-node cluster:
the stream is created with R3, a node is SIGKILLed between publish and wait, and the metadata is
delivered and used. The two-worker example of docs/howto/python.md runs in both orders (the order is
made by construction: the stored copy is seen before the reader starts; the reader's consumer is seen
on the stream before the writer starts).
"""
import base64
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
from harness import NATS_SERVER, SLOW, SidecarTest, desc, free_port, main, pb, wait_until

STREAM = "RDMA_SIDECAR_METADATA"
SRC = os.environ.get("SC_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
STUBS = os.path.abspath(os.environ.get("SC_PYTHON_STUBS", os.path.join(SRC, "build", "python")))


class RawNats:
    """A minimal NATS client (protocol over a socket) for the test's own look at the stream."""

    def __init__(self, url):
        host, port = url[len("nats://"):].rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.buf = b""
        self._line()  # INFO
        self.sock.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true}'
                          b"\r\nPING\r\n")
        self._until_pong()
        self.sid = 0

    def close(self):
        self.sock.close()

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise AssertionError("nats-server closed the test's connection")
        self.buf += chunk

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line.decode()

    def _bytes(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def _until_pong(self):
        while True:
            line = self._line()
            if line == "PONG":
                return
            if line == "PING":
                self.sock.sendall(b"PONG\r\n")
            elif line.startswith("-ERR"):
                raise AssertionError("nats-server: %s" % line)

    def publish(self, subject, payload):
        self.sock.sendall(b"PUB %s %d\r\n%s\r\nPING\r\n" % (subject.encode(), len(payload), payload))
        self._until_pong()

    def request(self, subject, payload=b""):
        self.sid += 1
        inbox = "_INBOX.t%d%d" % (random.getrandbits(40), self.sid)
        self.sock.sendall(b"SUB %s %d\r\nPUB %s %s %d\r\n%s\r\n" % (
            inbox.encode(), self.sid, subject.encode(), inbox.encode(), len(payload), payload))
        while True:
            line = self._line()
            if line == "PING":
                self.sock.sendall(b"PONG\r\n")
                continue
            if line.startswith("-ERR"):
                raise AssertionError("nats-server: %s" % line)
            parts = line.split()
            if parts and parts[0] == "MSG":
                data = self._bytes(int(parts[-1]))
            elif parts and parts[0] == "HMSG":
                raw = self._bytes(int(parts[-1]))
                data = raw[int(parts[-2]):]
            else:
                continue
            self.sock.sendall(b"UNSUB %d\r\n" % self.sid)
            return json.loads(data) if data else {}

    def stored(self, subject, stream=STREAM):
        """The stored message of subject (bytes), or None."""
        r = self.request("$JS.API.STREAM.MSG.GET." + stream,
                         json.dumps({"last_by_subj": stream + "." + subject}).encode())
        if "error" in r:
            return None
        return base64.b64decode(r["message"]["data"])

    def stream_info(self, stream=STREAM):
        return self.request("$JS.API.STREAM.INFO." + stream)


def read_bytes_back(t, a, b, ev_metadata, data, region_b):
    op = b.stub.BeginRead(pb.BeginTransferRequest(metadata=ev_metadata, descriptors=[desc(region_b, 0, len(data))],
                                                  timeout_ms=20000), timeout=10)
    done = b.wait(op.operation_id)
    t.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
    t.assertEqual(b.peek(region_b, 0, len(data)), data)


class JetStreamHandoff(SidecarTest):

    def pair(self, nats, **kw):
        keys = self.key_file()
        a = self.sidecar("js-a", key_file=keys, nats_url=nats.url, **kw)
        b = self.sidecar("js-b", key_file=keys, nats_url=nats.url, **kw)
        return a, b

    def readable(self, a, size, timeout_ms=30000, uses=0):
        data = os.urandom(size)
        region = a.create_region(size + 4096)
        off = random.randrange(1, 4096)
        a.fill(region, off, data)
        op = a.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(region, off, size)],
                                                            timeout_ms=timeout_ms, max_uses=uses), timeout=10)
        return op, data

    def wait_md(self, side, subject, timeout_ms):
        return side.stub.WaitMetadata(pb.WaitMetadataRequest(subject=subject, timeout_ms=timeout_ms),
                                      timeout=timeout_ms / 1000.0 + 10)

    def test_wait_timeouts_in_an_outage_hold_no_deadline(self):
        """Ten WaitMetadata calls time out while nats-server is SIGSTOPped (so removing each one's
        JetStream consumer waits out the store's 2 s timeout): every call still gets its
        DEADLINE_EXCEEDED on time, and an operation whose deadline falls among them still expires
        on time, since those removals run on the store's own thread, not on the engine's timer
        thread (ten removals there would have held every deadline about 20 s). After SIGCONT the
        sidecar stops cleanly."""
        nats = self.nats()
        a = self.sidecar("js-o", key_file=self.key_file(), nats_url=nats.url)
        raw = RawNats(nats.url)
        self.addCleanup(raw.close)
        info = raw.stream_info()  # no stream yet: the first wait creates it
        before = 0 if "error" in info else info.get("state", {}).get("consumer_count", 0)
        n, wait_ms = 10, 1500
        results = [None] * n

        def one(i):
            t0 = time.monotonic()
            try:
                self.wait_md(a, "outage.%d" % i, wait_ms)
                results[i] = ("answered", time.monotonic() - t0)
            except grpc.RpcError as e:
                results[i] = (e.code(), time.monotonic() - t0)
        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()

        def consumers():
            info = raw.stream_info()
            return info.get("state", {}).get("consumer_count", 0) if "error" not in info else 0
        wait_until(lambda: consumers() >= before + n, 20 * SLOW, "the waits' consumers on the stream")
        raw.close()
        nats.proc.send_signal(signal.SIGSTOP)
        try:
            op, _ = self.readable(a, 4096, timeout_ms=2500)
            t0 = time.monotonic()
            for t in threads:
                t.join(30 * SLOW)
            ended = None
            while time.monotonic() - t0 < 40:
                o = a.stub.GetOperation(pb.GetOperationRequest(operation_id=op.operation_id), timeout=10)
                if o.status in (pb.OPERATION_STATUS_ERRORED, pb.OPERATION_STATUS_CANCELLED,
                                pb.OPERATION_STATUS_COMPLETE):
                    ended = time.monotonic() - t0
                    break
                time.sleep(0.05)
        finally:
            nats.proc.send_signal(signal.SIGCONT)
        print("figure: %d WaitMetadata timeouts during a NATS outage: answered after %s s; an operation "
              "with a 2.5 s deadline ended after %s s" % (n, sorted(round(r[1], 1) for r in results if r),
                                                          ended and round(ended, 1)))
        for r in results:
            self.assertIsNotNone(r, "a WaitMetadata call never returned")
            self.assertEqual(r[0], grpc.StatusCode.DEADLINE_EXCEEDED, r)
            self.assertLess(r[1], wait_ms / 1000.0 + 5, results)
        self.assertIsNotNone(ended, "the operation never ended")
        self.assertEqual(o.status, pb.OPERATION_STATUS_ERRORED, o.error.message)
        self.assertLess(ended, 2.5 + 5, "the operation's deadline was held up")
        self.assertEqual(a.stop(), 0)

    def test_queue_group_gets_stored_copies(self):
        """A queue group (SubscribeMetadata with queue_group) on the stream: metadata published
        before any member subscribed reaches the group, each message exactly one member, spread
        over members on two sidecars; then new messages the same way; a member that leaves takes
        nothing with it; with every member gone what is published waits for the next one (the
        group's consumer outlives its members). One message's transfer is used, bytes compared."""
        nats = self.nats()
        keys = self.key_file("qkeys")
        a = self.sidecar("q-a", key_file=keys, nats_url=nats.url)
        b = self.sidecar("q-b", key_file=keys, nats_url=nats.url)
        c = self.sidecar("q-c", key_file=keys, nats_url=nats.url)
        ops = {}

        def publish(name):
            op, data = self.readable(a, 1000 + len(ops))
            a.stub.PublishMetadata(pb.PublishMetadataRequest(subject="qg." + name, operation_id=op.operation_id),
                                   timeout=10)
            ops["qg." + name] = (op, data)

        class Member:
            def __init__(self, side):
                self.events = []
                self.stream = side.stub.SubscribeMetadata(pb.SubscribeMetadataRequest(
                    subject="qg.*", queue_group="decoders"), timeout=300 * SLOW)
                self.thread = threading.Thread(target=self.run, daemon=True)
                self.thread.start()

            def run(self):
                try:
                    for ev in self.stream:
                        self.events.append(ev)
                except grpc.RpcError:
                    pass

            def close(self):
                self.stream.cancel()
                self.thread.join(10)

        def delivered(members):
            return sorted(ev.subject for m in members for ev in m.events)

        def settle(members, want, what):
            wait_until(lambda: len(delivered(members)) >= len(want), 30 * SLOW, what)
            time.sleep(1.0)  # nothing more (no second copy) arrives
            self.assertEqual(delivered(members), sorted(want), what)

        for i in range(6):  # before any member: stored
            publish("early%d" % i)
        m1, m2 = Member(b), Member(c)
        self.addCleanup(m1.close)
        self.addCleanup(m2.close)
        settle([m1, m2], ["qg.early%d" % i for i in range(6)], "the six stored copies, once each")
        for i in range(6):
            publish("live%d" % i)
        settle([m1, m2], ["qg.early%d" % i for i in range(6)] + ["qg.live%d" % i for i in range(6)],
               "six more published while both are members, once each")
        print("figure: queue group over two sidecars: member b got %d, member c got %d of 12"
              % (len(m1.events), len(m2.events)))
        m1.close()
        m2.close()
        for i in range(3):  # nobody in the group now
            publish("late%d" % i)
        m3 = Member(b)
        self.addCleanup(m3.close)
        settle([m3], ["qg.late%d" % i for i in range(3)], "what was published while the group was empty")
        # one of them used: the bytes arrive
        ev = m3.events[0]
        op, data = ops[ev.subject]
        rb = b.create_region(len(data))
        read_bytes_back(self, a, b, ev.metadata, data, rb)

    def test_handoff_in_any_order(self):
        nats = self.nats()
        a, b = self.pair(nats)
        raw = RawNats(nats.url)
        self.addCleanup(raw.close)
        self.assertIn("error", raw.stream_info(), "the stream must not exist before the first call")

        # 1. Both sidecars up, no stream yet; the reader waits first (its call creates the stream).
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("ev", self.wait_md(b, "order.sub-first", 20000)))
        t.start()
        wait_until(lambda: raw.stream_info().get("state", {}).get("consumer_count", 0) >= 1, 10 * SLOW,
                   "the waiting reader's consumer on the stream")
        size = 300001
        op, data = self.readable(a, size)
        a.stub.PublishMetadata(pb.PublishMetadataRequest(subject="order.sub-first", operation_id=op.operation_id),
                               timeout=10)
        t.join(30)
        self.assertEqual(got["ev"].metadata, op.metadata)
        self.assertEqual(got["ev"].issuer, "js-a")
        self.assertEqual(list(got["ev"].descriptor_lengths), [size])
        info = raw.stream_info()
        self.assertEqual(info["config"]["subjects"], [STREAM + ".>"])
        self.assertEqual(info["config"]["max_msgs_per_subject"], 1)
        self.assertEqual(info["config"]["num_replicas"], 1)
        self.assertGreater(info["config"]["max_age"], 0)
        read_bytes_back(self, a, b, got["ev"].metadata, data, b.create_region(size))
        # Its operation completed (one use): the stored copy is removed.
        wait_until(lambda: raw.stored("order.sub-first") is None, 10 * SLOW, "the used copy to be removed")

        # 2. Publisher first: the wait (and a late subscription) find the stored copy.
        op2, data2 = self.readable(a, 65537, uses=2)
        a.stub.PublishMetadata(pb.PublishMetadataRequest(subject="order.pub-first", operation_id=op2.operation_id),
                               timeout=10)
        self.assertEqual(raw.stored("order.pub-first").decode(), op2.metadata)
        ev = self.wait_md(b, "order.pub-first", 5000)
        self.assertEqual(ev.metadata, op2.metadata)
        stream = b.stub.SubscribeMetadata(pb.SubscribeMetadataRequest(subject="order.>"), timeout=20)
        first = next(iter(stream))
        stream.cancel()
        self.assertEqual((first.subject, first.metadata), ("order.pub-first", op2.metadata))
        read_bytes_back(self, a, b, ev.metadata, data2, b.create_region(65537))

        # 3. Expiry removes the stored copy; a wait then says nothing is stored.
        op3, _ = self.readable(a, 4096, timeout_ms=1500)
        a.stub.PublishMetadata(pb.PublishMetadataRequest(subject="expiry.x", operation_id=op3.operation_id),
                               timeout=10)
        # The same metadata published as text by the other sidecar: kept until it expires.
        b.stub.PublishMetadata(pb.PublishMetadataRequest(subject="expiry.text", metadata=op3.metadata), timeout=10)
        self.assertIsNotNone(raw.stored("expiry.x"))
        self.assertEqual(raw.stored("expiry.text").decode(), op3.metadata)
        end = a.wait(op3.operation_id, 10000)
        self.assertEqual(end.status, pb.OPERATION_STATUS_ERRORED)
        wait_until(lambda: raw.stored("expiry.x") is None, 10 * SLOW, "the expired copy to be removed")
        wait_until(lambda: raw.stored("expiry.text") is None, 10 * SLOW, "the expired text copy to be removed")
        e = self.assertRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, self.wait_md, b, "expiry.x", 300)
        self.assertIn("WaitMetadata on expiry.x", e.details())
        self.assertIn("nothing is stored under this subject in JetStream stream " + STREAM, e.details())

        # 4. A tampered stored message is refused, and the wait says so.
        op4, _ = self.readable(a, 4096)
        text = op4.metadata
        raw_sm = base64.urlsafe_b64decode(text[5:] + "=" * (-len(text[5:]) % 4))
        sm = pb.SignedMetadata.FromString(raw_sm)
        sm.mac = bytes([sm.mac[0] ^ 1]) + sm.mac[1:]
        bad = "rsm1." + base64.urlsafe_b64encode(sm.SerializeToString()).decode().rstrip("=")
        raw.publish(STREAM + ".tamper.x", bad.encode())
        e = self.assertRpcError(grpc.StatusCode.UNAUTHENTICATED, self.wait_md, b, "tamper.x", 700)
        self.assertIn("WaitMetadata on tamper.x: metadata stored or published on this subject was refused", e.details())
        self.assertIn("signature", e.details())

        # 5. Publishing text as is: kept until the metadata expires.
        e = self.assertRpcError(grpc.StatusCode.UNAUTHENTICATED, a.stub.PublishMetadata,
                                pb.PublishMetadataRequest(subject="text.bad", metadata=bad), timeout=10)
        self.assertIsNone(raw.stored("text.bad"))

        # 6. A wait the client cancels: its consumer goes at once (the sidecar unsubscribed).
        def consumers():
            return raw.stream_info().get("state", {}).get("consumer_count", 0)
        wait_until(lambda: consumers() == 0, 10 * SLOW, "no consumers left")
        fut = b.stub.WaitMetadata.future(pb.WaitMetadataRequest(subject="cancel.x", timeout_ms=60000), timeout=70)
        wait_until(lambda: consumers() == 1, 10 * SLOW, "the wait's consumer")
        fut.cancel()
        wait_until(lambda: consumers() == 0, 10 * SLOW, "the cancelled wait's consumer to go")
        # The client's own deadline, shorter than timeout_ms, bounds the wait too.
        t0 = time.monotonic()
        with self.assertRaises(grpc.RpcError) as cm:
            b.stub.WaitMetadata(pb.WaitMetadataRequest(subject="cancel.y", timeout_ms=60000), timeout=1)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertLess(time.monotonic() - t0, 10 * SLOW)
        wait_until(lambda: consumers() == 0, 10 * SLOW, "the timed-out wait's consumer to go")

        # 7. An operator deletes the stream: the next publish creates it again, the wait finds it.
        self.assertTrue(raw.request("$JS.API.STREAM.DELETE." + STREAM).get("success"))
        a.stub.PublishMetadata(pb.PublishMetadataRequest(subject="again.x", operation_id=op4.operation_id),
                               timeout=20)
        self.assertEqual(raw.stored("again.x").decode(), op4.metadata)
        self.assertEqual(self.wait_md(b, "again.x", 5000).metadata, op4.metadata)

    def test_prefix_confinement(self):
        nats = self.nats()
        keys = self.key_file()
        a = self.sidecar("js-pa", key_file=keys, nats_url=nats.url, extra=["--nats-subject-prefix", "team-a."])
        e = self.assertRpcError(grpc.StatusCode.PERMISSION_DENIED, self.wait_md, a, "team-b.x", 1000)
        self.assertIn('subject "team-b.x" is outside --nats-subject-prefix "team-a."', e.details())
        e = self.assertRpcError(grpc.StatusCode.PERMISSION_DENIED, self.wait_md, a, ">", 1000)
        op, _ = self.readable(a, 4096)
        e = self.assertRpcError(grpc.StatusCode.PERMISSION_DENIED, a.stub.PublishMetadata,
                                pb.PublishMetadataRequest(subject="team-b.x", operation_id=op.operation_id),
                                timeout=10)
        a.stub.PublishMetadata(pb.PublishMetadataRequest(subject="team-a.x", operation_id=op.operation_id),
                               timeout=10)
        self.assertEqual(self.wait_md(a, "team-a.x", 5000).metadata, op.metadata)

    def test_server_without_jetstream(self):
        nats = self.nats(jetstream=False)
        keys = self.key_file()
        a = self.sidecar("js-no", key_file=keys, nats_url=nats.url)
        op, _ = self.readable(a, 4096)
        e = self.assertRpcError(grpc.StatusCode.FAILED_PRECONDITION, a.stub.PublishMetadata,
                                pb.PublishMetadataRequest(subject="nojs.x", operation_id=op.operation_id),
                                timeout=15)
        for part in ("publish to nojs.x: nothing was stored", "no JetStream", "nats-server with -js",
                     "--nats-handoff core"):
            self.assertIn(part, e.details())
        e = self.assertRpcError(grpc.StatusCode.FAILED_PRECONDITION, self.wait_md, a, "nojs.x", 1000)
        self.assertIn("wait on nojs.x: nothing can be received", e.details())
        self.assertIn("no JetStream", e.details())
        # Core NATS stays available behind the flag (and keeps nothing).
        c = self.sidecar("js-core", key_file=keys, nats_url=nats.url, extra=["--nats-handoff", "core"])
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("ev", self.wait_md(c, "core.x", 15000)))
        t.start()
        # No way to see a core subscription from outside but to publish until it arrives.
        op_c, _ = self.readable(c, 4096, uses=0)
        deadline = time.monotonic() + 10 * SLOW
        while t.is_alive() and time.monotonic() < deadline:
            c.stub.PublishMetadata(pb.PublishMetadataRequest(subject="core.x", operation_id=op_c.operation_id),
                                   timeout=10)
            t.join(0.2)
        t.join(20)
        self.assertEqual(got["ev"].metadata, op_c.metadata)
        e = self.assertRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, self.wait_md, c, "core.y", 200)
        self.assertIn("--nats-handoff core keeps nothing", e.details())

    def test_account_without_jetstream_permission(self):
        from test_nats_security import nkey_user
        seed, pub = nkey_user(self.workdir, "worker")
        conf = os.path.join(self.workdir, "nats-perm.conf")
        with open(conf, "w") as f:
            f.write('authorization { users = [ { nkey: %s, permissions: { publish: { deny: ["$JS.API.>"] } } } ] }\n'
                    % pub)
        nats = self.nats(extra=["-c", conf])
        a = self.sidecar("js-perm", key_file=self.key_file(), nats_url=nats.url, extra=["--nats-nkey-seed", seed])
        wait_until(lambda: a.info().nats_state == "connected", 15 * SLOW, "the sidecar to connect")
        op, _ = self.readable(a, 4096)
        e = self.assertRpcError(grpc.StatusCode.FAILED_PRECONDITION, a.stub.PublishMetadata,
                                pb.PublishMetadataRequest(subject="perm.x", operation_id=op.operation_id),
                                timeout=30)
        for part in ("publish to perm.x: nothing was stored", "may not use the JetStream API",
                     "publish to $JS.API.>", "--nats-handoff core"):
            self.assertIn(part, e.details())

    def test_cluster_r3_survives_a_node(self):
        n = 3
        ports = [free_port() for _ in range(n)]
        routes = [free_port() for _ in range(n)]
        procs = []
        for i in range(n):
            log = open(os.path.join(self.workdir, "js-node%d.log" % i), "wb")
            args = [NATS_SERVER, "-a", "127.0.0.1", "-p", str(ports[i]), "-n", "node%d" % i, "-js",
                    "-sd", os.path.join(self.workdir, "js-node%d" % i), "--cluster_name", "sc-js",
                    "--cluster", "nats://127.0.0.1:%d" % routes[i],
                    "--routes", ",".join("nats://127.0.0.1:%d" % p for j, p in enumerate(routes) if j != i)]
            procs.append((subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT), log))

        def stop_all():
            for p, log in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                log.close()
        self.addCleanup(stop_all)
        urls = ["nats://127.0.0.1:%d" % p for p in ports]

        def js_ready():
            try:
                r = RawNats(urls[0])
                try:
                    return "error" not in r.request("$JS.API.INFO")
                finally:
                    r.close()
            except (OSError, AssertionError, ValueError):
                return False
        wait_until(js_ready, 30 * SLOW, "the JetStream cluster's meta leader")
        keys = self.key_file()
        a = self.sidecar("js-ca", key_file=keys, nats_url=",".join(urls))
        b = self.sidecar("js-cb", key_file=keys, nats_url=",".join([urls[1], urls[2], urls[0]]))
        size = 200003
        op, data = self.readable(a, size, timeout_ms=60000)
        a.stub.PublishMetadata(pb.PublishMetadataRequest(subject="cluster.x", operation_id=op.operation_id),
                               timeout=15)
        raw = RawNats(urls[1])
        info = raw.stream_info()
        raw.close()
        self.assertEqual(info["config"]["num_replicas"], 3)
        # Kill the stream's leader (the node that would be the one to lose), then the reader waits.
        leader = info.get("cluster", {}).get("leader", "node0")
        victim = int(leader[-1]) if leader.startswith("node") else 0
        procs[victim][0].kill()
        procs[victim][0].wait()
        t0 = time.monotonic()
        ev = self.wait_md(b, "cluster.x", int(20000 * SLOW))
        print("figure: WaitMetadata after the stream leader (%s) was killed answered in %.2f s"
              % (leader, time.monotonic() - t0))
        self.assertEqual(ev.metadata, op.metadata)
        read_bytes_back(self, a, b, ev.metadata, data, b.create_region(size))


def two_worker_blocks():
    """The two-worker example of docs/howto/python.md: (writer code, reader code)."""
    with open(os.path.join(SRC, "docs", "howto", "python.md")) as f:
        text = f.read()
    blocks = {}
    for role in ("writer", "reader"):
        m = re.search(r"<!-- two-worker: %s -->\s*\n```python\n(.*?)\n```" % role, text, re.S)
        if not m:
            raise AssertionError("docs/howto/python.md lacks its <!-- two-worker: %s --> block" % role)
        blocks[role] = m.group(1) + "\n"
    return blocks["writer"], blocks["reader"]


class DocsTwoWorkers(SidecarTest):
    """The page's two workers as two processes, each beside its own sidecar, in both orders."""

    def test_both_orders(self):
        writer, reader = two_worker_blocks()
        subject = re.search(r'publish\("([^"]+)"', writer).group(1)
        nats = self.nats()
        keys = self.key_file()
        a = self.sidecar("stage-a", key_file=keys, nats_url=nats.url)
        b = self.sidecar("stage-b", key_file=keys, nats_url=nats.url)
        raw = RawNats(nats.url)
        self.addCleanup(raw.close)
        paths = {}
        for role, code in (("writer", writer), ("reader", reader)):
            paths[role] = os.path.join(self.workdir, "%s.py" % role)
            with open(paths[role], "w") as f:
                f.write(code)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(SRC, "clients", "python"), STUBS]))

        def start(role, side):
            return subprocess.Popen(["/usr/bin/python3", paths[role]], cwd=self.workdir,
                                    env=dict(env, RDMA_SIDECAR_ADDR="unix:" + side.sock),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def finish(p, role):
            out, err = p.communicate(timeout=90 * SLOW)
            self.assertEqual(p.returncode, 0, "%s failed:\n%s\n%s" % (role, out, err))
            return out

        for order in ("writer first", "reader first"):
            if order == "writer first":
                w = start("writer", a)
                wait_until(lambda: raw.stored(subject) is not None, 30 * SLOW, "the writer's stored metadata")
                r = start("reader", b)
            else:
                consumers = raw.stream_info().get("state", {}).get("consumer_count", 0)
                r = start("reader", b)
                wait_until(lambda: raw.stream_info().get("state", {}).get("consumer_count", 0) > consumers,
                           30 * SLOW, "the reader's wait on the stream")
                w = start("writer", a)
            out_w, out_r = finish(w, "writer"), finish(r, "reader")
            print("%s: writer %r, reader %r" % (order, out_w, out_r))
            self.assertEqual(out_w.strip(), "COMPLETE", order)
            self.assertEqual(out_r.strip(), "COMPLETE True", order)
            # The operation ended: the stored copy goes, and so does the reader's consumer (so the
            # next order starts clean).
            wait_until(lambda: raw.stored(subject) is None, 10 * SLOW, "the used copy to be removed")
            wait_until(lambda: raw.stream_info().get("state", {}).get("consumer_count", 0) == 0, 10 * SLOW,
                       "the reader's consumer to go")


if __name__ == "__main__":
    main()
