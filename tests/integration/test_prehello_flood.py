# SPDX-License-Identifier: Apache-2.0
"""Issue 32 item 8: the data port before the hello, under floods of silent connections.

Sixty-four connections that never send a byte, from a few loopback addresses and reopened as soon
as the sidecar closes them, used to keep every new peer out: at --data-max-unauth the newcomer was
the one closed, so two fresh sidecars' READs failed after 14 attempts. Now a full room closes the
oldest silent connection of the narrowest full scope (its address, its /24 or /64, the room) and
admits the newcomer; addresses whose hello succeeded lately keep a room of their own; a connection
silent for --data-first-byte-timeout is closed. Every wait here is for something the sidecar does
to connections that never speak, so no outcome depends on the machine's speed."""
import os
import re
import select
import socket
import threading
import time

from harness import SLOW, SidecarTest, desc, main, pb, wait_until
from peer_client import Peer

LONG = ["--data-first-byte-timeout", "60s"]  # nothing closes for silence during a test


def silent(host, port, source):
    """A connection from `source` (any 127.x.y.z works on Linux loopback) that never sends."""
    s = socket.socket()
    s.settimeout(10 * SLOW)
    s.bind((source, 0))
    s.connect((host, port))
    return s


def closed(s, wait=0.0):
    """Has the sidecar closed it (FIN or reset)?"""
    ready, _, _ = select.select([s], [], [], wait)
    if not ready:
        return False
    try:
        return s.recv(1) == b""
    except OSError:
        return True


class Flood(threading.Thread):
    """`per_source` silent connections from each source, each reopened as soon as the sidecar
    closes it (after a 1 ms pause, so the churn stays bounded), until stop() or `limit_s`."""

    def __init__(self, host, port, sources, per_source, limit_s):
        super().__init__(daemon=True)
        self.host, self.port = host, port
        self.socks = {}  # socket -> source
        for src in sources:
            for _ in range(per_source):
                self.socks[silent(host, port, src)] = src
        self.reopened = 0
        self.done = threading.Event()
        self.end = time.monotonic() + limit_s

    def run(self):
        try:
            while not self.done.is_set() and time.monotonic() < self.end:
                ready, _, _ = select.select(list(self.socks), [], [], 0.05)
                for s in ready:
                    if not closed(s):
                        continue
                    src = self.socks.pop(s)
                    s.close()
                    time.sleep(0.001)
                    try:
                        self.socks[silent(self.host, self.port, src)] = src
                        self.reopened += 1
                    except OSError:
                        self.socks[socket.socket()] = src  # never readable: that slot is lost
        finally:
            for s in self.socks:
                s.close()

    def stop(self):
        self.done.set()
        self.join()


class PrehelloFloodTest(SidecarTest):
    def wait_log(self, s, pattern):
        """The sidecar writes a drop's line just after the close the test sees."""
        wait_until(lambda: re.search(pattern, s.read_log()), 10, "a log line like %s" % pattern)

    def endpoint(self, s):
        host, port = s.info().data_endpoints[0].rsplit(":", 1)
        return host, int(port)

    def test_honest_reads_while_a_reopening_flood_fills_the_room(self):
        keys = self.key_file()
        a = self.sidecar("a", key_file=keys)  # the defaults: --data-max-unauth 64, per address 16
        b = self.sidecar("b", key_file=keys)
        c = self.sidecar("c", key_file=keys)
        size = 4096
        ra = a.create_region(size)
        payload = os.urandom(size)
        a.fill(ra, 0, payload)
        host, port = self.endpoint(a)
        # 64 silent connections: two addresses in the honest peers' own 127.0.0.0/24, two more
        # /24s; 16 each (the per-address limit). Before, they filled --data-max-unauth exactly.
        t0 = time.monotonic()
        flood = Flood(host, port, ["127.0.0.2", "127.0.0.3", "127.0.1.2", "127.0.2.2"], 16,
                      limit_s=60 * SLOW)
        flood.start()
        try:
            ops = []
            for s in (b, c):
                ro = a.stub.CreateReadable(pb.CreatePassiveRequest(
                    descriptors=[desc(ra, 0, size)], timeout_ms=60000), timeout=10)
                rb = s.create_region(size)
                s.fill(rb, 0, os.urandom(size))
                op = s.stub.BeginRead(pb.BeginTransferRequest(
                    metadata=ro.metadata, descriptors=[desc(rb, 0, size)], timeout_ms=30000),
                    timeout=10)
                ops.append((s, rb, ro, op))
            for s, rb, ro, op in ops:
                done = s.wait(op.operation_id, 40000)
                self.assertEqual(done.status, pb.OPERATION_STATUS_COMPLETE, done.error.message)
                self.assertEqual(s.peek(rb, 0, size), payload, "bytes differ after the READ")
                self.assertEqual(a.wait(ro.operation_id, 10000).status,
                                 pb.OPERATION_STATUS_COMPLETE)
            # Let the flood churn on for a while: the log below must stay bounded.
            time.sleep(max(0.0, t0 + 3 - time.monotonic()))
        finally:
            flood.stop()
        elapsed = time.monotonic() - t0
        self.assertGreater(flood.reopened, 0, "the sidecar never closed a flood connection")
        for s in (b, c):
            log = s.read_log()
            # admitted at the first attempt: no retry storm
            self.assertNotIn("retrying in", log)
            self.assertNotRegex(log, r"connected to peer sidecar \"a\" at \S+ after \d+ attempts")
        log = a.read_log()
        dropped = [ln for ln in log.splitlines() if "dropped connection from" in ln]
        refused = [ln for ln in log.splitlines() if "refused connection from" in ln]
        self.assertEqual(refused, [])
        # one line per kind (address, /24, room) per second at most, the rest counted
        self.assertGreaterEqual(len(dropped), 1)
        self.assertLessEqual(len(dropped), 3 * (int(elapsed) + 2), "\n".join(dropped))
        suppressed = sum(int(m.group(1)) for m in
                         (re.search(r"\((\d+) similar suppressed\)", ln) for ln in dropped) if m)
        self.assertGreater(suppressed, 0, "\n".join(dropped))
        self.assertIn("127.0.0.0/24", "\n".join(dropped))

    def test_the_oldest_silent_connection_is_dropped_at_the_cap(self):
        # 8 before the hello, 2 of them kept for recent peers: 6 for newcomers
        a = self.sidecar("a", key_file=self.key_file(),
                         extra=LONG + ["--data-max-unauth", "8", "--data-max-unauth-per-ip", "8"])
        host, port = self.endpoint(a)
        socks = []
        self.addCleanup(lambda: [s.close() for s in socks])
        for i in range(6):  # six /24s: only the room is full
            socks.append(silent(host, port, "127.0.%d.1" % (10 + i)))
        for i in range(2):
            socks.append(silent(host, port, "127.0.%d.1" % (20 + i)))
            wait_until(lambda: closed(socks[i], 0.05), 10, "connection %d to be dropped" % i)
            self.assertEqual([j for j in range(i + 1, len(socks)) if closed(socks[j])], [],
                             "a newer connection was closed")
        self.wait_log(a, r"dropped connection from 127\.0\.10\.1:\d+ \(silent for \d+ ms\) "
                         r"to admit 127\.0\.20\.1:\d+: 6 connections are waiting for their "
                         r"hello \(--data-max-unauth 8, 2 of it kept for addresses that "
                         r"authenticated recently\)")
        self.assertNotIn("refused connection from", a.read_log())

    def test_a_prefix_holds_its_share_and_an_address_its_limit(self):
        # 16 before the hello, 4 kept for recent peers; a /24 holds a quarter of the other 12
        a = self.sidecar("a", key_file=self.key_file(),
                         extra=LONG + ["--data-max-unauth", "16", "--data-max-unauth-per-ip", "2"])
        host, port = self.endpoint(a)
        socks = []
        self.addCleanup(lambda: [s.close() for s in socks])
        for src in ("127.0.1.1", "127.0.1.1", "127.0.1.2", "127.0.2.1", "127.0.3.1"):
            socks.append(silent(host, port, src))
        socks.append(silent(host, port, "127.0.1.2"))  # the 4th of 127.0.1.0/24
        wait_until(lambda: closed(socks[0], 0.05), 10, "the oldest of 127.0.1.0/24 to be dropped")
        socks.append(silent(host, port, "127.0.2.1"))
        socks.append(silent(host, port, "127.0.2.1"))  # the 3rd of 127.0.2.1
        wait_until(lambda: closed(socks[3], 0.05), 10, "the oldest of 127.0.2.1 to be dropped")
        self.assertEqual([j for j in range(len(socks)) if j not in (0, 3) and closed(socks[j])], [])
        # (the line follows the close)
        self.wait_log(a, r"dropped connection from 127\.0\.1\.1:\d+ \(silent for \d+ ms\) to "
                         r"admit 127\.0\.1\.2:\d+: 3 connections from 127\.0\.1\.0/24 are "
                         r"waiting for their hello \(a share of 3 per /24 or /64")
        self.wait_log(a, r"dropped connection from 127\.0\.2\.1:\d+ \(silent for \d+ ms\) to "
                         r"admit 127\.0\.2\.1:\d+: 2 connections from its address are waiting "
                         r"for their hello \(--data-max-unauth-per-ip 2\)")

    def test_an_address_that_authenticated_lately_keeps_its_room(self):
        key = os.urandom(32)
        a = self.sidecar("a", key_file=self.key_file(keys=[("k1", key)]),
                         extra=LONG + ["--data-max-unauth", "8", "--data-max-unauth-per-ip", "8"])
        host, port = self.endpoint(a)
        p = Peer(host, port, "k1", key, client_id="honest")  # from 127.0.0.1
        p.ping()
        p.sock.close()
        socks = []
        self.addCleanup(lambda: [s.close() for s in socks])
        kept = [silent(host, port, "127.0.0.1") for _ in range(2)]  # the kept room: 2
        socks += kept
        first = [silent(host, port, "127.0.%d.1" % (20 + i)) for i in range(6)]  # the rest: 6
        socks += first
        second = [silent(host, port, "127.0.%d.1" % (30 + i)) for i in range(6)]
        socks += second
        wait_until(lambda: all(closed(s, 0.01) for s in first), 10,
                   "the older flood connections to be dropped")
        self.assertEqual([i for i, s in enumerate(kept + second) if closed(s)], [],
                         "a connection of the kept room, or a newer one, was closed")
        # the kept room full, one more from the recent address takes the general room
        socks.append(silent(host, port, "127.0.0.1"))
        wait_until(lambda: closed(second[0], 0.05), 10, "the oldest general one to be dropped")
        self.assertEqual([i for i, s in enumerate(kept + second[1:] + socks[-1:]) if closed(s)], [])

    def test_a_dual_stack_listener_counts_ipv4_peers_by_their_24(self):
        # on [::] IPv4 peers arrive as ::ffff:a.b.c.d: still counted per /24 (IPv6 per /64)
        try:
            with socket.socket(socket.AF_INET6) as probe:
                probe.bind(("::1", 0))
        except OSError as e:
            self.skipTest("no IPv6 loopback here: %s" % e)
        a = self.sidecar("a", key_file=self.key_file(), data_listen="[::]:0",
                         extra=LONG + ["--data-max-unauth", "16", "--data-max-unauth-per-ip", "2",
                                       "--advertise", "127.0.0.1"])
        _, port = self.endpoint(a)
        socks = []
        self.addCleanup(lambda: [s.close() for s in socks])
        for src in ("127.0.1.1", "127.0.1.2", "127.0.1.3", "127.0.1.4"):
            socks.append(silent("127.0.0.1", port, src))
        wait_until(lambda: closed(socks[0], 0.05), 10, "the oldest of 127.0.1.0/24 to be dropped")
        self.wait_log(a, r"dropped connection from \[::ffff:127\.0\.1\.1\]:\d+ .* 3 connections "
                         r"from 127\.0\.1\.0/24 are waiting")
        v6 = [socket.create_connection(("::1", port), timeout=10 * SLOW) for _ in range(3)]
        socks += v6
        wait_until(lambda: closed(v6[0], 0.05), 10, "the oldest from ::1 to be dropped")
        self.assertEqual([i for i, s in enumerate(socks) if s is not socks[0] and s is not v6[0]
                          and closed(s)], [])

    def test_a_silent_connection_is_closed_after_the_first_byte_timeout(self):
        a = self.sidecar("a", key_file=self.key_file(),
                         extra=["--data-first-byte-timeout", "200ms"])
        host, port = self.endpoint(a)
        s = silent(host, port, "127.0.0.1")
        self.addCleanup(s.close)
        wait_until(lambda: closed(s, 0.05), 10, "the silent connection to be closed")
        wait_until(lambda: "no first byte within 200 ms (--data-first-byte-timeout)" in a.read_log(),
                   10, "the reason in the debug log")


if __name__ == "__main__":
    main()
