# SPDX-License-Identifier: Apache-2.0
"""Anyone who may publish on a subject a sidecar subscribes to can send it garbage (issue 32, item
4): every such message is dropped (nothing reaches the subscriber) and the warnings it causes are
rate-limited (sidecar/base/log.h, one line per second per kind, the next line saying how many were
suppressed), so a flood cannot fill the log. A real nats-server; the flood is published with the
NATS text protocol on a plain socket, as any client could."""
import os
import re
import socket
import threading
import time

from harness import SLOW, SidecarTest, desc, main, pb, wait_until


def publish_raw(port, subject, payloads):
    """Publish each payload on subject with the NATS text protocol, then PING/PONG (all processed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        f = s.makefile("rb")
        assert f.readline().startswith(b"INFO ")
        out = [b'CONNECT {"verbose":false,"pedantic":false}\r\n']
        for p in payloads:
            out.append(b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(p), p))
        out.append(b"PING\r\n")
        s.sendall(b"".join(out))
        while True:
            line = f.readline()
            if not line or line.startswith(b"PONG"):
                return
            assert not line.startswith(b"-ERR"), line


class BusFloodTest(SidecarTest):
    def test_garbage_on_a_subject_is_dropped_and_its_warnings_are_rate_limited(self):
        n = self.nats()
        keys = self.key_file()
        # Core NATS: the flood goes to the subject itself (with the JetStream hand-off it would go
        # to the stream's subject, RDMA_SIDECAR_METADATA.flood.x; the same check drops it).
        s = self.sidecar("sub", key_file=keys, nats_url=n.url, extra=["--nats-handoff", "core"])
        stream = s.stub.SubscribeMetadata(pb.SubscribeMetadataRequest(subject="flood.x"), timeout=60 * SLOW)
        got = []
        reader = threading.Thread(target=lambda: [got.append(e) for e in stream], daemon=True)
        reader.start()
        self.addCleanup(stream.cancel)
        # The subscription is in place once a real publish arrives.
        r = s.create_region(64)
        op = s.stub.CreateReadable(pb.CreatePassiveRequest(descriptors=[desc(r, 0, 64)], timeout_ms=60000), timeout=10)

        def arrived():
            publish_raw(n.port, "flood.x", [op.metadata.encode()])
            return len(got) > 0
        wait_until(arrived, 20, "the subscriber's first verified event")
        bad, big = 1500, 40  # forged "rsm1." text; messages larger than any metadata (256 KiB)
        publish_raw(n.port, "flood.x", [b"rsm1.%s" % os.urandom(30).hex().encode() for _ in range(bad)] +
                    [b"x" * (300 << 10) for _ in range(big)])
        time.sleep(1.2)  # the limiter's window (SC_LOG_LIMIT_MS) passes: the next line reports the rest
        publish_raw(n.port, "flood.x", [b"rsm1.again", b"y" * (300 << 10)])
        flood = bad + big + 2
        pat = re.compile(r"dropped (metadata on flood\.x|a \d+-byte message on flood\.x)")

        def settled():
            lines = [ln for ln in s.read_log().splitlines() if pat.search(ln)]
            suppressed = sum(int(m.group(1)) for ln in lines
                             for m in [re.search(r"\((\d+) similar suppressed\)", ln)] if m)
            return (lines, suppressed) if len(lines) + suppressed >= flood else None
        lines, suppressed = wait_until(settled, 20, "every dropped message to be logged or counted")
        print("%d messages dropped: %d lines, %d suppressed" % (flood, len(lines), suppressed))
        self.assertLessEqual(len(lines), 8, "\n".join(lines[:20]))
        self.assertEqual([e.metadata for e in got if e.metadata != op.metadata], [], "garbage reached the subscriber")
        self.assertIsNone(s.proc.poll())
        self.assertEqual(s.info().sidecar_id, "sub")


if __name__ == "__main__":
    main()
