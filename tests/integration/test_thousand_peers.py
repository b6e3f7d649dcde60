# SPDX-License-Identifier: Apache-2.0
"""A thousand peers (issue 25): one sidecar with default flags holds 1,024 authenticated peer
connections (the default --data-max-peers) without a thread per connection: its thread count stays
where it was, and each idle connection costs it under 16 KiB of memory (VmRSS growth over the 1,024,
measured, printed). Every connection is served while the others stay open (a PING on each, twice,
in order and then in reverse), nothing is evicted while there is room, and then a real sidecar
reads random bytes from it: the connection used longest ago makes room, the bytes compare, and the
eviction is counted; 300 more light peers after that are each admitted at once, an idle one closed
for each. Idle connections expire on both ends by their timers (shortened for the test with
SC_TEST_PEER_IDLE_MS), with no socket left behind in CLOSE-WAIT. The peers are hand-written protocol clients (peer_client.py), one Python
process holding all 1,024 sockets; the reader is a real sidecar."""
import os
import random
import resource
import sys
import urllib.request

from harness import SLOW, SidecarTest, free_port, main, pb, wait_until
from peer_client import Peer
import test_transfers

# A read of random bytes over several descriptors, every byte of the destination compared
# (test_transfers' helper, as valgrind_subset.py uses it).
move = test_transfers.TransferTest.__dict__["move"]

PEERS = 1024  # --data-max-peers' default
# Memory a parked connection may cost the sidecar: its struct conn is about 1 KB; kernel socket
# buffers are not in VmRSS. A thread per connection cost ~125 KB (stack pages touched, frame
# buffer).
PER_CONN_LIMIT = 16 * 1024

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
need = PEERS + 256
if hard != resource.RLIM_INFINITY and hard < need:
    print("SKIP: this test holds %d sockets; the open-file hard limit is %d" % (PEERS, hard))
    sys.exit(77)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))


def status_field(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError("no %s in /proc/%d/status" % (field, pid))


def tcp_states(port):
    """The states (hex, /proc/net/tcp) of the TCP sockets from or to `port` on this host, but
    TIME-WAIT (06), which belongs to no process."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                ports = {int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)}
                if port in ports and fields[3] not in ("06", "0A"):  # TIME-WAIT, the listener
                    out.append(fields[3])
    return out


class ThousandPeersTest(SidecarTest):
    def setUp(self):
        super().setUp()
        self.rnd = random.Random(int.from_bytes(os.urandom(8), "little"))  # for move()
    def test_1024_peers_hold_no_thread_each(self):
        key = os.urandom(32)
        keys = self.key_file(keys=[("k1", key)])
        mport = free_port()
        hub = self.sidecar("hub", key_file=keys, extra=["--metrics-listen", "127.0.0.1:%d" % mport])
        host, dport = hub.info().data_endpoints[0].rsplit(":", 1)
        # One peer served first: the pool and the allocator are warm before the baseline.
        warm = Peer(host, int(dport), "k1", key, client_id="warm")
        warm.ping()
        warm.sock.close()
        pid = hub.proc.pid
        threads0, rss0 = status_field(pid, "Threads"), status_field(pid, "VmRSS")

        peers = []
        self.addCleanup(lambda: [p.sock.close() for p in peers])
        for i in range(PEERS):
            peers.append(Peer(host, int(dport), "k1", key, client_id="p%04d" % i, timeout=30 * SLOW))
            peers[-1].ping()
        for p in reversed(peers):  # all still open and served
            p.ping()
        threads1, rss1 = status_field(pid, "Threads"), status_field(pid, "VmRSS")
        per_conn = (rss1 - rss0) * 1024 / PEERS
        print("\n%d peer connections: threads %d -> %d, VmRSS %d -> %d KiB (%.0f bytes each)"
              % (PEERS, threads0, threads1, rss0, rss1, per_conn))
        # Sequential requests keep at most one pool thread busy: no more threads than before,
        # but for one started while that one served (the pool keeps one waiting).
        self.assertLessEqual(threads1, threads0 + 1)
        if SLOW == 1:  # sanitizers and valgrind count their own shadow memory
            self.assertLess(per_conn, PER_CONN_LIMIT)
        metrics = lambda: urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport,  # noqa: E731
                                                 timeout=10).read().decode()
        self.assertIn("rdma_sidecar_peer_connections_evicted_total 0", metrics())
        wait_until(lambda: 'rdma_sidecar_peer_connections{state="idle"} %d' % PEERS in metrics(), 10 * SLOW,
                   "every connection to be parked")

        # A real sidecar reads while all 1,024 are open: p0000, used longest ago, makes room (a
        # PING on a connection with nothing open is no use: the second round, in reverse, changed
        # nothing; issue 32).
        reader = self.sidecar("reader", key_file=keys)
        move(self, hub, reader, (1 << 20) + 13, 3, "read", pb.BACKEND_TCP)
        self.assertIn('closed the one idle longest, peer sidecar "p0000"', hub.read_log())
        evicted = [line for line in metrics().splitlines()
                   if line.startswith("rdma_sidecar_peer_connections_evicted_total ")]
        self.assertEqual(len(evicted), 1)
        self.assertGreaterEqual(int(evicted[0].split()[1]), 1)
        with self.assertRaises(ConnectionError):  # the evicted one was told by a close
            peers[0].sock.settimeout(10 * SLOW)
            peers[0].ping()
        peers[-1].ping()  # the most recent ones are still served

        # 300 more peers after the first 1,024 went idle: each is admitted at once, an idle one
        # closed for it; the newest are served.
        before = int(evicted[0].split()[1])
        more = []
        self.addCleanup(lambda: [p.sock.close() for p in more])
        for i in range(300):
            more.append(Peer(host, int(dport), "k1", key, client_id="q%03d" % i, timeout=30 * SLOW))
            more[-1].ping()
        for p in more:
            p.ping()
        count = lambda: int([line for line in metrics().splitlines()  # noqa: E731
                             if line.startswith("rdma_sidecar_peer_connections_evicted_total ")][0].split()[1])
        self.assertEqual(count(), before + 300)
        self.assertLessEqual(status_field(pid, "Threads"), threads0 + 1)

    def expiry_pair(self, a_idle_ms, b_idle_ms):
        """a reads 100 KiB from b; SC_TEST_PEER_IDLE_MS sets each side's idle time (None: the
        default, minutes). Returns (a, b, b's data port)."""
        keys = self.key_file()
        env = lambda ms: {"SC_TEST_PEER_IDLE_MS": str(ms)} if ms else {}  # noqa: E731
        a = self.sidecar("a", key_file=keys, env=env(a_idle_ms))
        b = self.sidecar("b", key_file=keys, env=env(b_idle_ms))
        move(self, b, a, 100 * 1024 + 3, 2, "read", pb.BACKEND_TCP)
        port = int(b.info().data_endpoints[0].rsplit(":", 1)[1])
        self.assertGreater(len(tcp_states(port)), 0)  # the pool keeps its connections
        return a, b, port

    def test_the_server_closes_idle_connections_by_its_timer(self):
        a, b, port = self.expiry_pair(None, 1500)
        wait_until(lambda: "ended: idle for 1500 ms" in b.read_log(), 10 * SLOW, "b to close the idle connections")
        # a's pool notices by its own timer: nothing left, not even in CLOSE-WAIT.
        wait_until(lambda: not tcp_states(port), 10 * SLOW, "a's pooled connections to b to close")

    def test_the_pool_closes_idle_connections_by_its_timer(self):
        a, b, port = self.expiry_pair(1500, None)
        wait_until(lambda: not tcp_states(port), 10 * SLOW, "a's pool to close its idle connections to b")
        self.assertIn("closed the connection", b.read_log())
        self.assertNotIn("ended: idle for", b.read_log())


if __name__ == "__main__":
    main()
