# SPDX-License-Identifier: Apache-2.0
"""Limits from the system (issue 25): the sidecar raises its soft open-file limit to the hard one
at start, says so in the log with how many peer connections that leaves room for, and reports the
limit in GetInfo; a hard limit too low for a large cluster is a warning that says what to raise;
a peer refused for lack of descriptors is told so. The limits are set on the sidecar's process
alone, with prlimit(1) in front of it. --data-max-peers: at the cap the connection idle longest
is closed for a new peer (logged, counted), and only when every one is busy is a peer refused,
told to retry."""
import os
import shutil
import sys
import time

import urllib.request

from harness import SLOW, SidecarTest, free_port, main, wait_until
from peer_client import Peer, PeerError

if not shutil.which("prlimit"):
    print("SKIP: prlimit (util-linux) is not installed")
    sys.exit(77)


class LimitsTest(SidecarTest):
    def with_nofile(self, name, soft, hard, **kw):
        old = os.environ.get("SC_WRAPPER")
        os.environ["SC_WRAPPER"] = ("prlimit --nofile=%d:%d -- " % (soft, hard)) + (old or "")
        try:
            return self.sidecar(name, **kw)
        finally:
            if old is None:
                del os.environ["SC_WRAPPER"]
            else:
                os.environ["SC_WRAPPER"] = old

    def test_soft_limit_raised_to_the_hard_one(self):
        s = self.with_nofile("raised", 512, 8192)
        self.assertEqual(s.info().open_files_limit, 8192)
        log = s.read_log()
        self.assertIn("open files: 8192, raised from 512 (room for about 7936 peer connections)", log)

    def test_a_low_hard_limit_is_a_warning_that_says_what_to_do(self):
        s = self.with_nofile("low", 600, 600)
        self.assertEqual(s.info().open_files_limit, 600)
        log = s.read_log()
        self.assertIn("WARN  [engine] open files: 600; that leaves room for about 344 peer connections: "
                      "raise the hard limit (ulimit -Hn, LimitNOFILE=) for a large cluster", log)

    def test_a_peer_refused_for_lack_of_fds_is_told_why(self):
        key = os.urandom(32)
        limit = 96
        s = self.with_nofile("fds", limit, limit, key_file=self.key_file(keys=[("k1", key)]),
                             extra=["--data-max-unauth", "200", "--data-max-unauth-per-ip", "200"])
        host, port = s.info().data_endpoints[0].rsplit(":", 1)
        fds = lambda: len(os.listdir("/proc/%d/fd" % s.proc.pid))  # noqa: E731
        held = []
        self.addCleanup(lambda: [h.sock.close() for h in held])
        refused = None
        for i in range(limit + 10):  # authenticated peers (no hello timeout) until one is refused
            try:
                held.append(Peer(host, int(port), "k1", key, client_id="p%d" % i))
            except PeerError as e:
                refused = e
                break
        self.assertIsNotNone(refused, "%d peers admitted under an open-file limit of %d" % (len(held), limit))
        cm = type("cm", (), {"exception": refused})
        self.assertEqual(cm.exception.code, 8)  # RESOURCE_EXHAUSTED
        self.assertIn("sidecar fds is out of file descriptors (this process's limit; open-file limit %d)" % limit,
                      cm.exception.text)
        wait_until(lambda: "WARN  [peer] refused connection from 127.0.0.1:" in s.read_log() and
                   "is out of file descriptors" in s.read_log(), 10 * SLOW, "the refusal in the log")
        for h in held:
            h.sock.close()
        held.clear()
        # Once descriptors are free again, peers are served again.
        wait_until(lambda: fds() < limit - 8, 30 * SLOW, "the idle connections to close")
        time.sleep(0.2)
        Peer(host, int(port), "k1", key, client_id="after").sock.close()

    def test_idle_peers_make_room_busy_ones_do_not(self):
        key = os.urandom(32)
        port = free_port()
        s = self.sidecar("cap", key_file=self.key_file(keys=[("k1", key)]),
                         extra=["--data-max-peers", "4", "--metrics-listen", "127.0.0.1:%d" % port])
        host, dport = s.info().data_endpoints[0].rsplit(":", 1)
        metrics = lambda: urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port,  # noqa: E731
                                                 timeout=10).read().decode()
        peers = []
        self.addCleanup(lambda: [p.sock.close() for p in peers])
        for i in range(4):  # each served once, in order: p0 is the least recently used
            peers.append(Peer(host, int(dport), "k1", key, client_id="p%d" % i))
            peers[-1].ping()
        # The PONG leaves before the sidecar parks the connection: wait until all four are.
        wait_until(lambda: 'rdma_sidecar_peer_connections{state="idle"} 4' in metrics(), 10 * SLOW,
                   "the four connections to be parked")
        peers.append(Peer(host, int(dport), "k1", key, client_id="p4"))  # admitted: p0 was idle longest
        with self.assertRaises(ConnectionError):
            peers[0].sock.settimeout(10 * SLOW)
            peers[0].recv_frame()
        wait_until(lambda: 'closed the one idle longest, peer sidecar "p0"' in s.read_log(), 10 * SLOW,
                   "the eviction in the log")
        self.assertIn("rdma_sidecar_peer_connections_evicted_total 1", metrics())
        # Every connection busy (a request in hand on each: a frame begun, its rest not sent): the
        # next peer is refused, told why. A transfer OPENed without its DONE does not make a
        # connection busy (issue 32: test_peer_slots.py).
        for p in peers[1:]:
            p.sock.sendall(b"\x01\x0b")  # the first two bytes of a PING's header
        wait_until(lambda: 'rdma_sidecar_peer_connections{state="busy"} 4' in metrics(), 10 * SLOW,
                   "the four connections to be busy")
        late = Peer(host, int(dport), "k1", key, client_id="late")  # the refusal follows the hello
        late.sock.settimeout(10 * SLOW)
        with self.assertRaises(PeerError) as cm:
            Peer.check(*late.recv_frame(), 0)
        late.sock.close()
        self.assertEqual(cm.exception.code, 8)  # RESOURCE_EXHAUSTED
        self.assertIn("sidecar cap is serving 4 peer connections (--data-max-peers), all of them busy: retry in a few "
                      "seconds", cm.exception.text)


if __name__ == "__main__":
    main()
